"""A file fetched over HTTP for the hub code (models/hub.py): streamed into its file as
it comes off the socket, hashed on a thread of its own, resumed from the bytes written
when the connection drops, and patient with a server that says it is busy."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

log = logging.getLogger(__name__)


class HashingFile:
    """Writes go to the file, and to a hasher on its own thread (hashlib releases the GIL
    for large updates), handed over in batches of a few MiB, so checking costs the
    download little time of its own."""

    _RESET = b""
    _BATCH = 4 * 1024 * 1024

    def __init__(self, fh: BinaryIO, new_digest: Callable[[], Any], digest: Any) -> None:
        self._fh = fh
        self._queue: queue.Queue[list[bytes] | bytes | None] = queue.Queue(maxsize=16)
        self._new_digest = new_digest
        self._digest = digest
        self._batch: list[bytes] = []
        self._batched = 0
        self._thread = threading.Thread(target=self._hash, daemon=True)
        self._thread.start()

    def _hash(self) -> None:
        while (item := self._queue.get()) is not None:
            if item is self._RESET:
                self._digest = self._new_digest()
            else:
                for block in item:
                    self._digest.update(block)

    def write(self, data: bytes) -> int:
        n = self._fh.write(data)
        if data:
            self._batch.append(data)
            self._batched += len(data)
            if self._batched >= self._BATCH:
                self._queue.put(self._batch)
                self._batch, self._batched = [], 0
        return n

    def restart(self) -> None:
        """The server ignored the Range request and sends the file from its start."""
        self._fh.seek(0)
        self._fh.truncate(0)
        self._batch, self._batched = [], 0
        self._queue.put(self._RESET)

    def finish(self) -> str:
        self._queue.put(self._batch)
        self._queue.put(None)
        self._thread.join()
        return str(self._digest.hexdigest())


_ATTEMPTS = 5  # tries without a new byte before a dropped connection is final


def _transient_errors() -> tuple[type[BaseException], ...]:
    """The errors after which huggingface_hub's own download resumes (its HTTP client is
    httpx2 from huggingface_hub 2 on, httpx before)."""
    import importlib

    try:
        http = importlib.import_module("httpx2")
    except ImportError:
        http = importlib.import_module("httpx")
    return (http.ConnectError, http.TimeoutException, http.RemoteProtocolError)


def _retry_after(response: Any, tries: int) -> float:
    """Seconds to wait before asking again: the server's Retry-After (in seconds), else
    1, 2, 4, ... s; never more than a minute."""
    try:
        wait = float(response.headers.get("Retry-After", ""))
    except ValueError:
        wait = float(2 ** (tries - 1))
    return min(max(wait, 0.0), 60.0)


Progress = Callable[[str, int, "int | None"], None]  # (file, bytes so far, its size)


def stream(
    url: str,
    sink: HashingFile,
    *,
    token: str | None,
    have: int,
    size: int | None,
    name: str,
    progress: Progress | None = None,
) -> None:
    """GET url into sink from byte `have` on. Each piece is written as it comes off the
    socket (huggingface_hub's http_get gathers 10 MB pieces first: one more copy of every
    byte); a dropped connection resumes from the bytes written, as http_get does."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status, tqdm

    attempts = _ATTEMPTS
    bar = tqdm(
        total=size,
        initial=have,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=name if len(name) <= 40 else f"(…){name[-40:]}",
        name="huggingface_hub.http_get",
    )
    with bar:
        while True:
            headers = build_hf_headers(token=token)
            if have:
                headers["Range"] = f"bytes={have}-"
            try:
                with get_session().stream(
                    "GET",
                    url,
                    headers=headers,
                    follow_redirects=True,
                    timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
                ) as response:
                    if response.status_code in (408, 429) and attempts > 1:
                        attempts -= 1  # busy or rate-limited: wait as asked, then again
                        wait = _retry_after(response, _ATTEMPTS - attempts)
                        log.warning(
                            "%s: HTTP %d; trying again in %.0f s", name, response.status_code, wait
                        )
                        time.sleep(wait)
                        continue
                    if response.status_code >= 400:
                        response.read()  # the error's body says why (gated, missing...)
                    hf_raise_for_status(response)
                    if have and response.status_code == 200:
                        sink.restart()
                        bar.update(-have)
                        have = 0
                    for piece in response.iter_bytes():
                        sink.write(piece)
                        have += len(piece)
                        bar.update(len(piece))
                        if progress is not None:
                            progress(name, have, size)
                        attempts = _ATTEMPTS
                return
            except _transient_errors() as exc:
                attempts -= 1
                if attempts <= 0:
                    raise
                log.warning("%s: %s; resuming from byte %d", name, exc, have)
                time.sleep(1)
