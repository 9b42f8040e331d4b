"""Bounds on the connections themselves, below HTTP's routes: how long a request's head may
take to arrive, how many connections one address may hold open, and how much of a
response the kernel may hold for a client that does not read.

uvicorn has none of the first two: a client that trickles its request line and headers
a byte at a time is held open for as long as it likes, and 200 of them held 200 file
descriptors for a minute. `guarded_protocol` wraps the HTTP protocol uvicorn would pick:

- a connection's request head (and each later one on a kept-alive connection) must be
  complete within `header_timeout_s`, or it is answered 408 and closed;
- one address may hold `max_connections_per_client` connections; the next is answered
  503 and closed at once. Every client on this machine shares 127.0.0.1, so for loopback
  the bound is the server's total instead (TOTAL_PER_CLIENT times that setting): when
  it is reached, the connection idle longest (waiting for a request's head) is closed
  to make room, and only when none is idle is the new one answered 503;
- what a client that does not read can leave unread on the server's side is bounded:
  the kernel's send buffer is fixed at SEND_BUFFER_BYTES (Linux doubles it, and left to
  itself grows it up to 4 MiB per connection, so a streaming client that never read took
  a whole answer without the server noticing) and asyncio's write buffer at
  WRITE_BUFFER_BYTES; past them the stream's chunks wait, and after BEHIND_CHUNKS the
  engine pauses it (engine/stream.py, engine/sequence.py). The client's own receive
  buffer comes on top (about 128 KiB on Linux for a socket that is never read).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import socket
import time
from collections import Counter
from typing import Any

from localllm.config import Settings

log = logging.getLogger(__name__)

TOTAL_PER_CLIENT = 4  # the server's connections: this many times the per-client bound
SEND_BUFFER_BYTES = 16 * 1024  # 32 KiB once Linux doubles it
WRITE_BUFFER_BYTES = 16 * 1024  # asyncio's high-water mark (64 KiB by default)


def _raw_response(status: str, code: str, message: str, retry_after: int | None = None) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error", "code": code}})
    head = [
        f"HTTP/1.1 {status}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    if retry_after is not None:
        head.append(f"Retry-After: {retry_after}")
    return ("\r\n".join(head) + "\r\n\r\n" + body).encode()


def guarded_protocol(base: type[asyncio.Protocol], settings: Settings) -> type[asyncio.Protocol]:
    """`base` (uvicorn's h11 or httptools protocol) with the bounds above."""
    open_from: Counter[str] = Counter()  # open connections by client address
    head_s = settings.header_timeout_s
    cap = settings.max_connections_per_client
    total = TOTAL_PER_CLIENT * cap
    everyone: set[Any] = set()  # every open connection (the loopback bound is on these)

    class Guarded(base):  # type: ignore[valid-type,misc]
        _address: str | None = None
        _head_timer: asyncio.TimerHandle | None = None
        _head_cycle: Any = None
        _partial = False  # some of the awaited head has arrived
        idle_since: float | None = None  # waiting for a request's head since (monotonic)

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            sock = transport.get_extra_info("socket")
            if sock is not None:  # one that does not take it keeps the kernel's own bound
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            with contextlib.suppress(AttributeError, NotImplementedError):
                transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)  # type: ignore[attr-defined]
            peer = transport.get_extra_info("peername")
            address = str(peer[0]) if isinstance(peer, tuple) and peer else "unknown"
            local = _loopback(address)
            if local and len(everyone) >= total:
                _close_idlest(everyone)
            crowded = len(everyone) >= total if local else open_from[address] >= cap
            if crowded:
                log.warning(
                    "refused a connection from %s: %d open (limit %d)",
                    address,
                    len(everyone) if local else open_from[address],
                    total if local else cap,
                )
                self.transport.write(_crowded(address, open_from[address], cap, local, total))
                self.transport.close()
                return
            self._address = address
            open_from[address] += 1
            everyone.add(self)
            self._await_head()

        def connection_lost(self, exc: Exception | None) -> None:
            everyone.discard(self)
            self._stop_head_timer()
            if self._address is not None:
                open_from[self._address] -= 1
                if open_from[self._address] <= 0:
                    del open_from[self._address]
                self._address = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self._head_timer is not None:
                self._partial = True
                if self.cycle is not self._head_cycle:
                    self._stop_head_timer()  # a request's head has arrived
                    self.idle_since = None

        def on_response_complete(self) -> None:
            done = self.cycle
            super().on_response_complete()
            if not self.transport.is_closing() and self.cycle is done:
                self._await_head()  # kept alive: the next request's head is bounded too

        def _await_head(self) -> None:
            self.idle_since = time.monotonic()
            self._stop_head_timer()
            self._head_cycle, self._partial = self.cycle, False
            self._head_timer = asyncio.get_running_loop().call_later(head_s, self._head_late)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self.cycle is not self._head_cycle or self.transport.is_closing():
                return
            if self._partial:  # a connection that sent nothing is closed without a word
                log.warning(
                    "closed a connection from %s: its request head took over %g s",
                    self._address,
                    head_s,
                )
                self.transport.write(
                    _raw_response(
                        "408 Request Timeout",
                        "header_timeout",
                        f"The request's line and headers did not arrive within {head_s:g} s "
                        "(header_timeout_s).",
                    )
                )
            self.transport.close()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _close_idlest(connections: set[Any]) -> None:
    """Close the connection that has waited longest for a request (one that has sent
    nothing yet, or is kept alive between requests); none when every one is busy."""
    idle = [c for c in connections if c.idle_since is not None and not c._partial]
    if idle:
        victim = min(idle, key=lambda c: c.idle_since)
        log.info("closed a connection from %s idle for the longest to make room", victim._address)
        connections.discard(victim)
        victim.transport.close()


def _crowded(address: str, held: int, cap: int, local: bool, total: int) -> bytes:
    if local:
        message = (
            f"the server has {total} connections open, none idle (max_connections_per_client "
            f"= {cap}; the server holds {TOTAL_PER_CLIENT} times that); retry shortly."
        )
    else:
        message = (
            f"{address} has {held} connections open to this server "
            f"(max_connections_per_client = {cap}); close some and retry."
        )
    return _raw_response("503 Service Unavailable", "too_many_connections", message, 1)


def uvicorn_protocol(settings: Settings) -> type[asyncio.Protocol]:
    """The protocol uvicorn's "auto" picks (httptools when installed, else h11), guarded."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return guarded_protocol(AutoHTTPProtocol, settings)
