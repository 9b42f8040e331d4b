"""The chat app as a person runs it, in tmux (issue: the Textual chat).

1. Time from starting `localllm` to a drawn input box, and to a loaded model.
2. Decode tokens/s of answers streamed into the app (read from the app's own
   stored statistics) vs the same request through `engine.single.stream()` in this
   process, rounds interleaved (which of the two runs first alternates); each round
   uses a new prompt in a new chat.
3. Resident memory of the app process minus the model file size, after answering.
4. Screen updates while an answer decodes: every write of the app to its terminal is
   timestamped (tmux's pipe-pane into this script's `--stamp` reader); writes less than
   5 ms apart are one update, and updates under 100 bytes (the prompt box's blinking
   cursor, a status figure) are not counted. Over the decode of each answer (from the
   first token to the last, placed with the app's own first-token time and decode speed)
   it reports updates per second and the longest gap between two updates (or between
   the decode's start or end and the nearest update).

    python -m benchmarks.bench_tui [--rounds 5] [--tokens 128] [--speculate off]

The chat's conversations speculate as the app's default (`auto`) unless --speculate says
otherwise; how many app answers drafted is printed with the results.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import free_port, machine
from localllm.backends.base import GenerationStats, LoadOptions, Message, SamplingParams
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.engine import single
from localllm.history import ConversationSettings, History
from localllm.models.store import ModelStore
from localllm.units import format_bytes

SESSION = "localllm-bench"
DB = Path()  # the app's history database, set by main
THREADS = 2


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=True, capture_output=True, text=True).stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait(cond, what: str, limit_s: float = 120.0, step: float = 0.01) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        if cond():
            return time.perf_counter()
        time.sleep(step)
    raise RuntimeError(f"gave up waiting for {what}:\n{screen()}")


def prompt(k: int) -> str:
    return f"Session {k}: write a long story about a lighthouse keeper."


def answers(db: Path) -> list[tuple[str, str | None]]:
    with sqlite3.connect(db) as con:
        return con.execute(
            "SELECT content, stats FROM messages WHERE role='assistant' ORDER BY id"
        ).fetchall()


def finished(before: int) -> bool:
    """Whether a new answer is stored complete (while it streams it is stored marked
    interrupted)."""
    rows = answers(DB)
    return len(rows) > before and "interrupted" not in json.loads(rows[-1][1] or "{}")


def bootstrap_interval(values: list[float], draws: int = 4000) -> tuple[float, float]:
    """A 95% interval for the median of `values`: the rounds resampled with replacement
    (seeded, so a rerun on the same numbers prints the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


MERGE_S = 0.005  # writes closer than this are one screen update
MIN_BYTES = 100  # smaller updates are a cursor blink or a status figure, not the answer


def stamp(path: str) -> None:
    """Read the app's terminal output on stdin; write one line per read: time, bytes."""
    with open(path, "w", buffering=1) as out:
        while True:
            data = os.read(0, 1 << 16)
            if not data:
                return
            out.write(f"{time.monotonic():.6f} {len(data)}\n")


def screen_updates(path: Path) -> list[tuple[float, int]]:
    """The timestamped writes merged into updates: (start time, bytes)."""
    updates: list[tuple[float, int]] = []
    last = float("-inf")
    for line in path.read_text().splitlines():
        t, n = line.split()
        when, size = float(t), int(n)
        if updates and when - last < MERGE_S:
            updates[-1] = (updates[-1][0], updates[-1][1] + size)
        else:
            updates.append((when, size))
        last = when
    return [u for u in updates if u[1] >= MIN_BYTES]


def smoothness(updates: list[tuple[float, int]], start: float, end: float) -> tuple[float, float]:
    """Updates per second within [start, end], and the longest gap (seconds) between
    consecutive updates there, the window's edges counted as updates."""
    inside = [t for t, _ in updates if start <= t <= end]
    times = [start, *inside, end]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return len(inside) / (end - start), max(gaps)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--stamp":
        stamp(sys.argv[2])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--speculate", choices=["off", "lookup", "auto"], default=None)
    args = ap.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("this benchmark drives the app in tmux: install tmux first")
    tmp = Path(tempfile.mkdtemp(prefix="localllm-bench-"))
    global DB
    db = DB = tmp / "data" / "history.sqlite3"
    history = History(db)
    history.create(
        "bench",
        ConversationSettings(temperature=0.0, max_tokens=args.tokens, speculate=args.speculate),
    )
    history.close()
    env = {
        **os.environ,
        "LOCALLLM_CONFIG": os.devnull,
        "LOCALLLM_DATA_DIR": str(tmp / "data"),
        "LOCALLLM_N_THREADS": str(THREADS),
        "LOCALLLM_PORT": str(free_port()),
    }
    exe = Path(sys.executable).with_name("localllm")
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    t0 = time.perf_counter()
    subprocess.run(
        # the settings go on the command line: a tmux server that is already running
        # starts new sessions with its own environment, not this process's
        [
            "tmux", "new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40",
            "exec env " + " ".join(
                shlex.quote(f"{k}={v}") for k, v in env.items() if k.startswith("LOCALLLM_")
            ) + f" {shlex.quote(str(exe))}",
        ],
        check=True,
        env=env,
    )
    stamps = tmp / "stamps.txt"
    repo = Path(__file__).resolve().parent.parent
    tmux(
        "pipe-pane", "-O", "-t", SESSION,
        f"cd {repo} && exec {sys.executable} -m benchmarks.bench_tui --stamp {stamps}",
    )
    try:
        t_input = wait(lambda: "╭" in screen() and "╰" in screen(), "the input box")
        t_model = wait(lambda: "llamacpp" in screen(), "the model", step=0.02)
        pid = int(tmux("display", "-p", "-t", SESSION, "#{pane_pid}").strip())
        ref = ModelStore(tmp / "none").resolve("starter")
        model = LlamaCppBackend().load(ref, LoadOptions(n_threads=THREADS))
        app_tps: list[float] = []
        drafted: list[tuple[int, int]] = []  # (proposed, accepted) of app answers that drafted
        base_tps: list[float] = []
        ui_cpu: list[float] = []  # the app's UI thread, seconds per answer
        tmux_cpu: list[float] = []  # the terminal (tmux server), seconds per answer
        update_rates: list[float] = []  # screen updates per second during each decode
        longest_gaps: list[float] = []  # the longest gap between updates, per decode
        app_proc = psutil.Process(pid)
        term_proc = psutil.Process(int(tmux("display", "-p", "#{pid}").strip()))

        def ui_thread_cpu() -> float:
            main = next(t for t in app_proc.threads() if t.id == pid)
            return float(main.user_time + main.system_time)

        def term_cpu() -> float:
            t = term_proc.cpu_times()
            return float(t.user + t.system)

        def through_app(k: int) -> dict[str, Any]:
            before = len(answers(db))
            tmux("send-keys", "-t", SESSION, "C-n")
            time.sleep(0.3)
            tmux("send-keys", "-t", SESSION, "-l", prompt(k))
            # Enter once the whole prompt is in the box, as a person would press it
            wait(lambda: prompt(k) in screen(), "the typed prompt", limit_s=10, step=0.05)
            c_ui, c_term = ui_thread_cpu(), term_cpu()
            entered = time.monotonic()
            tmux("send-keys", "-t", SESSION, "Enter")
            # polled slowly: the speed is the app's own figure, and a busy poll here would
            # take CPU from the app's decode that the peer below does not lose
            wait(lambda before=before: finished(before), "the answer", step=0.5)
            ui_cpu.append(ui_thread_cpu() - c_ui)
            tmux_cpu.append(term_cpu() - c_term)
            stats = dict(json.loads(answers(db)[-1][1] or "{}"))
            # the decode, placed with the app's own figures (it starts a little later than
            # this: the app mounts the answer before it submits the request)
            start = entered + stats["ttft_s"]
            end = start + stats["generated_tokens"] / stats["decode_tps"]
            time.sleep(0.2)  # the last writes reach the stamp file
            rate, gap = smoothness(screen_updates(stamps), start, end)
            update_rates.append(rate)
            longest_gaps.append(gap)
            return stats

        def through_stream(k: int) -> GenerationStats:
            tokens = model.render_chat([Message("user", prompt(k))])
            final = list(
                single.stream(model, tokens,
                    SamplingParams(temperature=0.0, max_tokens=args.tokens),
                    should_stop=lambda: False,
                )
            )[-1]
            assert final.stats is not None
            return final.stats

        for k in range(1, args.rounds + 1):
            # the order alternates, so a machine that speeds up or slows down during a
            # round does not favour whichever of the two runs first
            if k % 2:
                stats, base = through_app(k), through_stream(k)
            else:
                base = through_stream(k)
                stats = through_app(k)
            app_tps.append(stats["decode_tps"])
            if stats.get("draft_proposed"):
                drafted.append((stats["draft_proposed"], stats.get("draft_accepted", 0)))
            base_tps.append(base.decode_tps)
            if stats["generated_tokens"] != base.generated_tokens:
                print(
                    f"round {k}: token counts differ ({stats['generated_tokens']} vs "
                    f"{base.generated_tokens})"
                )
        rss = psutil.Process(pid).memory_info().rss
        model_size = ref.size_bytes
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)

    app_m, base_m = statistics.median(app_tps), statistics.median(base_tps)
    print(f"Machine: {machine()}")
    print(
        f"{args.rounds} rounds, {args.tokens} new tokens, greedy, {THREADS} threads, "
        "in tmux 120x40\n"
    )
    print("| measure | value |")
    print("|---|---:|")
    print(f"| `localllm` to a drawn input box | {(t_input - t0) * 1000:.0f} ms |")
    print(f"| `localllm` to the model loaded | {(t_model - t0) * 1000:.0f} ms |")
    print(f"| decode tokens/s streamed into the app (median) | {app_m:.1f} |")
    print(f"| decode tokens/s through `engine.single.stream()` (median) | {base_m:.1f} |")
    print(f"| app / stream | {app_m / base_m:.3f} |")
    ratios = [a / b for a, b in zip(app_tps, base_tps, strict=True)]
    low, high = bootstrap_interval(ratios)
    print(
        f"| app / stream, median of the per-round ratios | {statistics.median(ratios):.3f} "
        f"(95% bootstrap interval {low:.3f}-{high:.3f}) |"
    )
    print(f"| app process memory (RSS) | {format_bytes(rss)} |")
    print(
        f"| ... minus the model file ({format_bytes(model_size)}) | "
        f"{format_bytes(rss - model_size)} |"
    )
    print(
        f"| CPU per answer: app UI thread / tmux (median) | {statistics.median(ui_cpu):.3f} s /"
        f" {statistics.median(tmux_cpu):.3f} s |"
    )
    print(
        f"| screen updates per second while decoding (median; lowest) | "
        f"{statistics.median(update_rates):.1f}; {min(update_rates):.1f} |"
    )
    print(
        f"| longest gap between screen updates (median of answers; worst) | "
        f"{statistics.median(longest_gaps) * 1000:.0f} ms; {max(longest_gaps) * 1000:.0f} ms |"
    )
    proposed, accepted = sum(p for p, _ in drafted), sum(a for _, a in drafted)
    print(
        f"\napp answers that drafted (speculate {args.speculate or 'as the app default'}): "
        f"{len(drafted)} of {args.rounds}, {accepted}/{proposed} drafts accepted"
    )
    print(f"per round, app: {[round(x, 1) for x in app_tps]}")
    print(f"per round, stream: {[round(x, 1) for x in base_tps]}")


if __name__ == "__main__":
    main()
