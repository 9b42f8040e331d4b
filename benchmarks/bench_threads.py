"""Where a server's CPU goes while it streams: CPU time per token, by thread.

On a two-core machine whose two cores both decode, every microsecond another thread
spends is taken from the model. This reads each server's threads from /proc (user +
system time) around one stream (three 200-token greedy answers) and around four
concurrent 128-token streams, and prints per generated token:

- the whole process's CPU;
- for localllm, the event loop's thread alone (`serve` runs it on the main thread): the
  HTTP protocol, framing and the hand-off from the engine.

Servers, kept up side by side and taking turns as in bench_pair:

- `localllm`: the HTTP stack uvicorn picks in this environment (httptools and uvloop,
  which localllm depends on, where they install);
- `localllm-plain`: the same with httptools and uvloop hidden from it (a directory of two
  modules that refuse to import, first on PYTHONPATH), so uvicorn runs h11 and asyncio's
  own loop; run only when either is installed;
- `llama-server` when LLAMA_SERVER names it.

The stack each server really ran is read from its memory map. Linux only.
Run: python -m benchmarks.bench_threads [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.bench_concurrency import (
    TOPICS,
    LlamaServer,
    Result,
    chat,
    localllm_flags,
    setup,
    story,
)
from benchmarks.bench_pair import one_stream
from benchmarks.common import Server

TICK = os.sysconf("SC_CLK_TCK")
Times = dict[int, tuple[float, float]]


def thread_cpu(pid: int) -> Times:
    """CPU seconds (user, system) of each live thread of `pid`, by thread id."""
    out: Times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # it ended between the listing and the read
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(tid)] = (int(fields[11]) / TICK, int(fields[12]) / TICK)
    return out


def stack(pid: int) -> str:
    maps = Path(f"/proc/{pid}/maps").read_text()
    if "llama-server" in maps:
        return "cpp-httplib"
    http = "httptools" if "httptools" in maps else "h11"
    loop = "uvloop" if "uvloop" in maps else "asyncio"
    return f"{http} + {loop}"


def four_streams(base: str) -> int:
    results: list[Result] = []
    salt = uuid.uuid4().hex[:8]
    threads = [
        threading.Thread(target=lambda t=t: results.append(chat(base, story(t, salt), 128)))
        for t in TOPICS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(r.tokens for r in results)


class Tally:
    """Per-token CPU of one server over the rounds, for one kind of load."""

    def __init__(self) -> None:
        self.process: list[float] = []  # CPU µs per token, one per turn
        self.loop_user: list[float] = []
        self.loop_system: list[float] = []

    def add(self, pid: int, before: Times, after: Times, n: int) -> None:
        per = 1e6 / max(n, 1)
        user = {t: u - before.get(t, (0.0, 0.0))[0] for t, (u, _) in after.items()}
        system = {t: s - before.get(t, (0.0, 0.0))[1] for t, (_, s) in after.items()}
        self.process.append(per * (sum(user.values()) + sum(system.values())))
        self.loop_user.append(per * user.get(pid, 0.0))
        self.loop_system.append(per * system.get(pid, 0.0))


def shadow_dir() -> str:
    """A directory whose `uvloop` and `httptools` refuse to import."""
    root = tempfile.mkdtemp(prefix="bench-threads-")
    for name in ("uvloop", "httptools"):
        Path(root, name).mkdir()
        Path(root, name, "__init__.py").write_text(
            f"raise ImportError('{name} hidden by benchmarks/bench_threads')\n"
        )
    return root


def main() -> None:
    args = setup(argparse.ArgumentParser(), rounds=3)
    flags = localllm_flags()
    servers: dict[str, Any] = {}
    hidden = shadow_dir()
    try:
        servers["localllm"] = Server(*flags)
        if any(importlib.util.find_spec(m) for m in ("uvloop", "httptools")):
            path = os.pathsep.join(p for p in (hidden, os.environ.get("PYTHONPATH")) if p)
            servers["localllm-plain"] = Server(*flags, env={"PYTHONPATH": path})
        if os.environ.get("LLAMA_SERVER"):
            servers["llama-server"] = LlamaServer(os.environ["LLAMA_SERVER"])
        names = list(servers)
        stacks = {n: stack(s.proc.pid) for n, s in servers.items()}
        for s in servers.values():  # the first request's one-off costs, outside the count
            chat(s.base, story("warm", "up"), 8)
        one = {n: Tally() for n in names}
        four = {n: Tally() for n in names}
        rates: dict[str, list[float]] = {n: [] for n in names}
        aggregate: dict[str, list[float]] = {n: [] for n in names}
        for rnd in range(args.rounds):
            for name in names if rnd % 2 == 0 else names[::-1]:
                pid = servers[name].proc.pid
                before = thread_cpu(pid)
                n, r = one_stream(servers[name].base)
                middle = thread_cpu(pid)
                rates[name] += r
                one[name].add(pid, before, middle, n)
                t0 = time.perf_counter()
                n = four_streams(servers[name].base)
                aggregate[name].append(n / (time.perf_counter() - t0))
                four[name].add(pid, middle, thread_cpu(pid), n)
            print(rnd, {n: round(one[n].process[-1]) for n in names}, flush=True)
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(hidden)

    med = statistics.median
    print(
        f"\nmedians over {args.rounds} turns; CPU in µs per generated token; the loop's "
        "user / system time"
    )
    print(
        f"{'server':15} {'stack':18} {'one: tok/s':>10} {'CPU':>6} {'loop':>9}"
        f" {'four: tok/s':>11} {'CPU':>6} {'loop':>9}"
    )
    for n in names:
        loops = ["        -"] * 2
        if n != "llama-server":
            loops = [
                f"{med(t.loop_user):4.0f}/{med(t.loop_system):<4.0f}" for t in (one[n], four[n])
            ]
        print(
            f"{n:15} {stacks[n]:18} {med(rates[n]):10.1f} {med(one[n].process):6.0f} {loops[0]}"
            f" {med(aggregate[n]):11.1f} {med(four[n].process):6.0f} {loops[1]}"
        )


if __name__ == "__main__":
    main()
