"""/infill as an editor calls it: 8 extra-context chunks, the first request and then the
next keystroke's request (the same chunks, a longer prefix), against llama-server on the
same staged model in the same run.

    LLAMA_SERVER=/path/to/llama-server python -m benchmarks.bench_infill [--rounds 5]

The starter has no FIM tokens; as in tests/server/test_infill.py, a copy names five of
its tokens as the FIM markers (the layout and the cache are measured, not the
completion's quality). Each round starts both servers fresh, so the first request reads
the whole prompt (localllm gets fresh data and cache folders: its prompt cache persists
across restarts); the repeat should read only what changed. Latency is the whole request
(client-side); n_predict is 16, greedy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import Server, machine, same_kernels
from localllm.models.starter import starter_path
from tests.gguf_fixtures import copy_with_metadata
from tests.server.test_infill import CHUNKS, FIM_KEYS

THREADS = 2
CTX = 4096


def body(prefix: str) -> dict[str, Any]:
    return {
        "input_prefix": prefix,
        "input_suffix": "\n\nprint(area(2))\n",
        "input_extra": CHUNKS,
        "prompt": "    return ",
        "n_predict": 16,
        "temperature": 0,
        "repeat_penalty": 1.0,
        "top_k": 1,
        "cache_prompt": True,
        "samplers": ["top_k"],
    }


class LlamaServer(Server):
    def __init__(self, binary: str, model: Path) -> None:
        self.binary, self.model = binary, model
        super().__init__()

    def command(self, *args: str) -> list[str]:
        return [
            self.binary,
            "-m",
            str(self.model),
            "--port",
            str(self.port),
            "-t",
            str(THREADS),
            "-tb",
            str(THREADS),
            "-c",
            str(CTX),
            "-np",
            "1",
            *same_kernels(),
            *args,
        ]


def timed(base: str, payload: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    t = time.perf_counter()
    r = httpx.post(base + "/infill", json=payload, timeout=300)
    r.raise_for_status()
    return time.perf_counter() - t, r.json()


def run(server: Server) -> dict[str, float]:
    try:
        prefix = "import math\n\ndef area(r):\n"
        first, a = timed(server.base, body(prefix))
        repeat, b = timed(server.base, body(prefix + "    # the area of a circle\n"))
        return {
            "first_ms": first * 1000,
            "repeat_ms": repeat * 1000,
            "first_prompt_n": a["timings"]["prompt_n"],
            "repeat_prompt_n": b["timings"]["prompt_n"],
            "repeat_cached": b.get("tokens_cached", 0),
        }
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    start = starter_path()
    assert start is not None
    model = copy_with_metadata(start, Path(tempfile.mkdtemp()) / "fim-starter.gguf", FIM_KEYS)
    binary = os.environ.get("LLAMA_SERVER")
    rows: dict[str, list[dict[str, float]]] = {"localllm": [], "llama-server": []}
    for rnd in range(args.rounds):
        order = ["localllm", "llama-server"] if rnd % 2 == 0 else ["llama-server", "localllm"]
        for name in order:
            if name == "llama-server" and not binary:
                continue
            fresh = Path(tempfile.mkdtemp())  # no prompt cache left by an earlier round
            env = {"LOCALLLM_DATA_DIR": str(fresh / "data"), "LOCALLLM_CACHE_DIR": str(fresh)}
            server: Server = (
                LlamaServer(str(binary), model)
                if name == "llama-server"
                else Server(
                    "--model", str(model), "--ctx", str(CTX), "--threads", str(THREADS), env=env
                )
            )
            rows[name].append(run(server))
            print(name, {k: round(v, 1) for k, v in rows[name][-1].items()}, flush=True)
    print(f"\n{machine()}\nmedians over {args.rounds} rounds")
    for name, runs in rows.items():
        if runs:
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(name, {k: round(v, 1) for k, v in med.items()})
    if rows["llama-server"]:

        def med(name: str, key: str) -> float:
            return statistics.median(r[key] for r in rows[name])

        first = med("localllm", "first_ms") / med("llama-server", "first_ms")
        repeat = med("localllm", "repeat_ms") / med("llama-server", "repeat_ms")
        print(f"localllm / llama-server: first request {first:.2f}, repeat {repeat:.2f}")


if __name__ == "__main__":
    main()
