"""Give back the pages of a freshly zeroed buffer, so they become resident only when used.

llama.cpp allocates the KV cache for the whole context up front and clears it, which
makes every page of it resident: 90 MiB for the starter model at 4,096 tokens, however
short the conversation. Zero pages of a private anonymous mapping can be handed back
with madvise(MADV_DONTNEED): the kernel maps a fresh zero page the next time one is
touched, so the buffer reads exactly as before and its memory grows with the context
actually used. Linux only; anywhere else (or when the buffer is not found) nothing
changes.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

MADV_DONTNEED = 4
_MAPS = "/proc/self/maps"
_MEM = "/proc/self/mem"
T = TypeVar("T")
_ONE_AT_A_TIME = threading.Lock()  # process-wide, like the address space it inspects


def supported() -> bool:
    return sys.platform.startswith("linux")


def mappings() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(every mapping, the private writable ones with no file behind them) as (start, end)."""
    every, anonymous = [], []
    with open(_MAPS, encoding="ascii", errors="replace") as fh:
        for line in fh:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            every.append((start, end))
            if fields[1] == "rw-p" and len(fields) == 5:  # a sixth field names a file, [heap]..
                anonymous.append((start, end))
    return every, anonymous


def new_ranges(
    before: list[tuple[int, int]], after: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """The parts of `after` that no mapping in `before` covered (a new mapping may have been
    merged with an old neighbour)."""
    out = []
    for start, end in after:
        pos = start
        for b_start, b_end in sorted(before):
            if b_end <= pos or b_start >= end:
                continue
            if b_start > pos:
                out.append((pos, b_start))
            pos = max(pos, b_end)
        if pos < end:
            out.append((pos, end))
    return out


def zero_runs(start: int, end: int, min_bytes: int) -> list[tuple[int, int]]:
    """(address, length) of each run of all-zero pages in [start, end) at least min_bytes long.

    The pages are read through /proc/self/mem, not in place: another thread may unmap
    part of the range meanwhile, which in place would be a segmentation fault (a test
    that allocates and frees beside a load found it) and here is an error for that part,
    which is then left alone. Reading a page that was never touched maps the shared zero
    page; it uses no memory."""
    import numpy as np

    page = mmap.PAGESIZE
    pages = (end - start) // page
    zero = np.zeros(pages, dtype=bool)
    chunk = 2048  # pages read at a time (8 MiB)
    buf = np.empty(chunk * page, dtype=np.uint8)
    with open(_MEM, "rb", buffering=0) as mem:
        for first in range(0, pages, chunk):
            n = min(chunk, pages - first)
            try:
                got = os.preadv(mem.fileno(), [buf.data[: n * page]], start + first * page)
            except OSError:
                continue  # unmapped meanwhile: not the buffer we look for
            if got == n * page:
                rows = buf[: n * page].view(np.uint64).reshape(n, page // 8)
                zero[first : first + n] = ~rows.any(axis=1)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], zero.view(np.int8), [0]))))
    runs = []
    for first, stop in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
        if (stop - first) * page >= min_bytes:
            runs.append((start + first * page, (stop - first) * page))
    return runs


def release(addr: int, length: int) -> bool:
    """madvise(MADV_DONTNEED): the pages are dropped and read as zeros when next touched."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(addr, length, MADV_DONTNEED) != 0:
        log.debug("madvise failed with errno %d", ctypes.get_errno())
        return False
    return True


def allocate_lazily(make: Callable[[], T], size: int) -> tuple[T, int]:
    """Run `make()`, which allocates and zeroes a buffer of `size` bytes, then give that
    buffer's pages back. Returns make()'s result and the bytes given back.

    The buffer is found as a run of zero pages of its size (give or take the page that
    may hold the allocator's header) in address space that was not mapped before
    `make()`; nothing else is touched. Zero pages read as zeros after they are dropped,
    so no contents change. Another thread could lose data only if it mapped a buffer of
    that exact size during `make()` and wrote to it between the scan and the madvise;
    calls here are serialised, so two model loads never race this way (a test loads a
    model while another thread allocates, writes and checks buffers of other sizes).
    """
    if not supported() or size <= 0:
        return make(), 0
    with _ONE_AT_A_TIME:
        before, _ = mappings()
        result = make()
        released = 0
        for start, end in new_ranges(before, mappings()[1]):
            for addr, length in zero_runs(start, end, size - mmap.PAGESIZE):
                if length <= size + mmap.PAGESIZE and release(addr, length):
                    released += length
    log.debug("gave back %d bytes of zero pages", released)
    return result, released
