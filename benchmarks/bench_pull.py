"""Pull throughput: `localllm pull`'s download path vs a plain huggingface_hub download.

One hub stand-in (tests/hubserver.py, the hub's URL layout) runs in its own process
on loopback and serves a 512 MiB GGUF (the starter model padded with zeros). Each
round downloads the file twice into fresh folders, in alternating order:
- localllm: `hub.plan_pull` (the repository listing with hashes) + `hub.pull`
  (download to a .part file, SHA-256 checked while it streams, renamed into the store);
- huggingface_hub: `hf_hub_download(repo, file, local_dir=...)` (HEAD + download).
Progress bars are off for both. Files go to /dev/shm where it exists (the disk's
writeback varied by seconds between runs on the test VM); between downloads the
written file is deleted and the disk synced. The figure is the ratio of throughputs
(plain time / localllm time) per round; the goal is >= 0.95.

    python -m benchmarks.bench_pull
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

from benchmarks.common import machine
from localllm.models import hub
from localllm.models.starter import starter_path

SIZE = 512 * 1024 * 1024
ROUNDS = 9
REPO, FILE = "bench/big-GGUF", "big-Q4_1.gguf"


def main() -> None:
    # downloads land in RAM (/dev/shm where there is one): the disk's writeback, which
    # varies by seconds between runs here, would otherwise be most of what is measured
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="bench-pull-", dir=shm if shm.is_dir() else None))
    source = root / FILE
    starter = starter_path()
    assert starter is not None
    with source.open("wb") as fh:
        fh.write(starter.read_bytes())
        fh.truncate(SIZE)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.hubserver", f"{REPO}/{FILE}={source}"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        os.environ["HF_ENDPOINT"] = url
        from huggingface_hub import hf_hub_download

        def ours(dest: Path) -> None:
            plan = hub.plan_pull(f"{REPO}:Q4_1")
            hub.pull(plan, dest)

        def plain(dest: Path) -> None:
            hf_hub_download(REPO, FILE, local_dir=dest, endpoint=url)

        ours(root / "warm-ours")  # both paths warm: imports, the server's page cache
        plain(root / "warm-plain")
        times: dict[str, list[float]] = {"localllm": [], "huggingface_hub": []}
        ratios = []
        for i in range(ROUNDS):
            order = [("localllm", ours), ("huggingface_hub", plain)]
            if i % 2:
                order.reverse()
            got = {}
            for name, fn in order:
                dest = root / f"{name}-{i}"
                t0 = time.perf_counter()
                fn(dest)
                got[name] = time.perf_counter() - t0
                times[name].append(got[name])
                shutil.rmtree(dest)
                os.sync()  # the next download must not compete with this one's writeback
                time.sleep(1.0)
            ratios.append(got["huggingface_hub"] / got["localllm"])
            print(
                f"round {i + 1}: localllm {got['localllm']:.3f} s, huggingface_hub "
                f"{got['huggingface_hub']:.3f} s, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(root, ignore_errors=True)
    mib = SIZE / 2**20
    print(f"\nmachine: {machine()}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name}: median {med:.3f} s = {mib / med:.0f} MiB/s")
    print(
        f"throughput ratio localllm / huggingface_hub: median {statistics.median(ratios):.3f} "
        f"(rounds {min(ratios):.3f}-{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
