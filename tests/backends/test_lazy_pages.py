"""The KV cache's pages become resident as the context fills, not when the model loads."""

from __future__ import annotations

import ctypes
import json
import mmap
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.backends import lazy_pages
from localllm.backends.base import LoadOptions, Message, ModelRef, SamplingParams
from localllm.backends.llamacpp import LlamaCppBackend
from localllm.engine import single
from tests.conftest import THREADS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
MiB = 1 << 20
PAGE = mmap.PAGESIZE


def rss_anon() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


def zeroed_buffer(size: int, marks: list[int]) -> tuple[mmap.mmap, int]:
    """A private anonymous mapping, every page written (resident), with a byte set at each
    offset in `marks`."""
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.write(bytes(size))
    for at in marks:
        buf[at] = 7
    return buf, ctypes.addressof(ctypes.c_char.from_buffer(buf))


def test_zero_pages_are_given_back_and_contents_kept():
    size = 32 * MiB
    marks = [10, 16 * MiB + 5, size - 1]
    held: list[tuple[mmap.mmap, int]] = []
    resident: list[int] = []

    def make() -> None:
        held.append(zeroed_buffer(size, marks))
        resident.append(rss_anon())

    _, released = lazy_pages.allocate_lazily(make, 16 * MiB - PAGE)
    buf, _ = held[0]
    # the two zero runs between the marks go (16 MiB less one and two pages: the size
    # asked for, give or take a page); the marked pages stay
    assert released == size - 3 * PAGE
    assert rss_anon() < resident[0] - size + 8 * MiB  # numpy, imported on first use
    assert [i for i in marks if buf[i] == 7] == marks
    assert buf[:].count(0) == size - len(marks)  # every other byte still reads 0
    ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(buf)) + 4 * MiB, 1, MiB)
    assert buf[4 * MiB : 5 * MiB] == b"\x01" * MiB  # and takes writes as before
    del buf
    held.clear()


def test_a_shorter_zero_run_is_left_alone():
    held: list[tuple[mmap.mmap, int]] = []
    _, released = lazy_pages.allocate_lazily(
        lambda: held.append(zeroed_buffer(8 * MiB, [4 * MiB])), 6 * MiB
    )
    assert released == 0
    held.clear()


def test_a_longer_zero_run_is_another_buffer_and_left_alone():
    held: list[tuple[mmap.mmap, int]] = []
    _, released = lazy_pages.allocate_lazily(
        lambda: held.append(zeroed_buffer(16 * MiB, [])), 8 * MiB
    )
    assert released == 0
    held.clear()


def test_memory_mapped_before_the_call_is_never_touched():
    old, _ = zeroed_buffer(16 * MiB, [])
    _, released = lazy_pages.allocate_lazily(lambda: None, 4 * MiB)
    assert released == 0
    old.close()


def test_new_ranges_subtracts_what_was_mapped_before():
    before = [(100, 200), (300, 400)]
    assert lazy_pages.new_ranges(before, [(0, 500)]) == [(0, 100), (200, 300), (400, 500)]
    assert lazy_pages.new_ranges(before, [(100, 200)]) == []
    assert lazy_pages.new_ranges(before, [(150, 350)]) == [(200, 300)]


def _lazy_and_eager(path: str) -> dict[str, object]:
    """The starter at 4,096 tokens loaded with its KV pages given back, then without: the
    bytes given back, what each load added to the resident set, and each one's greedy
    answer (run in a fresh interpreter: see the test)."""
    ref = ModelRef("starter", Path(path), "gguf", "starter")
    out: dict[str, object] = {}
    prompt: list[int] = []
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    for name in ("lazy", "eager"):
        if name == "eager":
            lazy_pages.supported = lambda: False
        before = rss_anon()
        model = LlamaCppBackend().load(ref, LoadOptions(n_threads=THREADS, n_ctx=4096))
        try:
            out[f"{name}_released"] = model.kv_released
            out[f"{name}_added"] = rss_anon() - before
            prompt = prompt or model.render_chat([Message("user", "Name three rivers in Europe.")])
            chunks = single.stream(model, prompt, greedy, should_stop=lambda: False)
            out[f"{name}_tokens"] = [t for c in chunks for t in c.tokens]
        finally:
            model.close()
    return out


def test_starter_kv_cache_is_resident_only_as_used(starter_ref: ModelRef):
    """At 4,096 tokens the starter's KV cache is 90 MiB; loading it adds far less, and the
    answers are the same as on a context whose cache was never given back. Measured in a
    fresh interpreter, as a server loads its model: in a process that has run other tests
    the allocator may place the cache in memory mapped before the load, which is never
    given back (lazy_pages touches only what the load mapped)."""
    kv = 4096 * 30 * 2 * 3 * 64 * 2
    code = ("import json, sys; from tests.backends.test_lazy_pages import _lazy_and_eager; "
            "print(json.dumps(_lazy_and_eager(sys.argv[1])))")
    run = subprocess.run([sys.executable, "-c", code, str(starter_ref.path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["lazy_released"] >= kv
    assert got["lazy_added"] < kv // 2
    assert got["eager_released"] == 0 and got["eager_added"] > kv
    assert got["lazy_tokens"] == got["eager_tokens"] and len(got["lazy_tokens"]) == 24


def test_a_load_beside_a_thread_that_allocates_and_writes_loses_none_of_its_data(
    starter_ref: ModelRef,
):
    """While models load (and give their KV pages back), another thread maps buffers of
    many sizes, writes them and reads them back: every byte it wrote is still there."""
    import threading

    import numpy as np

    stop = threading.Event()
    problems: list[str] = []
    checked = [0]

    def churn() -> None:
        rng = np.random.default_rng(0)
        while not stop.is_set():
            n = int(rng.integers(1, 48)) * MiB + int(rng.integers(0, 4096))
            buf = np.zeros(n, dtype=np.uint8)  # fresh zero pages, as the KV buffer is
            buf[::PAGE] = 0  # touched, then written a little later
            value = int(rng.integers(1, 255))
            buf[::997] = value
            if not (buf[::997] == value).all():
                problems.append(f"a {n}-byte buffer lost what was written to it")
            checked[0] += 1
            del buf

    worker = threading.Thread(target=churn)
    worker.start()
    released = []
    try:
        for _ in range(3):
            model = LlamaCppBackend().load(starter_ref, LoadOptions(n_threads=1, n_ctx=4096))
            released.append(model.kv_released)
            model.close()
    finally:
        stop.set()
        worker.join()
    assert not problems, problems
    assert checked[0] > 3  # the other thread did run beside the loads
    # each load gave back its KV buffer's pages, or (when a zero buffer of the other
    # thread's lay beside it at that moment, making the zero run longer) none: never
    # other bytes (that a lone load gives them back: the test above)
    kv = 4096 * 30 * 2 * 3 * 64 * 2
    assert all(r in (0, kv) for r in released), released
