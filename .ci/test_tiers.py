"""make test's runner: the whole suite as two pytest runs side by side.

MLX on a CPU keeps one core busy and leaves the other idle; everything else (llama.cpp on
two threads, servers, the chat) fits beside it. So the tests marked `mlx` run in one
pytest process and all the others in a second one, at the same time: every test runs,
in one of the two. Each run's output is printed whole when both have ended, and the exit
code is the worse of the two. Arguments go to both runs (`-k`, `-x`, `--durations`...).

    python .ci/test_tiers.py [pytest arguments]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

TIERS = (("mlx", "mlx"), ("the rest", "not mlx"))


def main(args: list[str]) -> int:
    began = time.monotonic()
    runs = []
    with tempfile.TemporaryDirectory(prefix="localllm-tests-") as tmp:
        for i, (label, marker) in enumerate(TIERS):
            log = Path(tmp) / f"{i}.log"
            base = Path(tmp) / f"basetemp-{i}"
            cmd = [sys.executable, "-m", "pytest", "-q", "-m", marker, f"--basetemp={base}"]
            if i:
                cmd += ["-p", "no:cacheprovider"]  # one run keeps pytest's cache
            out = log.open("w")
            runs.append((label, log, out, subprocess.Popen([*cmd, *args], stdout=out,
                                                           stderr=subprocess.STDOUT)))
        codes = []
        for label, log, out, proc in runs:
            code = proc.wait()
            out.close()
            codes.append(code)
            print(f"==== {label} (pytest -m {TIERS[len(codes) - 1][1]!r}): exit {code}")
            print(log.read_text(errors="replace"), flush=True)
    # exit code 5 is "no tests collected": a tier may be empty under -k
    worst = max((c for c in codes if c != 5), default=0)
    print(f"==== both tiers ended in {time.monotonic() - began:.0f} s; exit {worst}")
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
