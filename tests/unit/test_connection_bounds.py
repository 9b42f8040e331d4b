"""The connection bounds of server/connections.py as control flow, for addresses a test
cannot connect from (another machine's): one address is capped; loopback is bounded by
the server's total, the connection idle longest making room."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from localllm.config import Settings
from localllm.server.connections import guarded_protocol


class Transport:
    def __init__(self, host: str, port: int) -> None:
        self.peer = (host, port)
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str) -> Any:
        return self.peer if name == "peername" else None

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class Base(asyncio.Protocol):
    """What the guard needs of uvicorn's protocol: a transport and a cycle."""

    def __init__(self) -> None:
        self.cycle: Any = None
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        self.cycle = object()  # a request's head arrived: a cycle begins


def test_one_address_is_capped_and_loopback_makes_room(settings: Settings):
    chosen = dataclasses.replace(settings, max_connections_per_client=3, header_timeout_s=60)
    guarded = guarded_protocol(Base, chosen)

    async def scenario() -> None:
        def connect(host: str, port: int) -> tuple[Any, Transport]:
            protocol, transport = guarded(), Transport(host, port)
            protocol.connection_made(transport)  # type: ignore[arg-type]
            return protocol, transport

        remote = [connect("203.0.113.9", p) for p in range(4)]
        assert [t.closed for _, t in remote] == [False, False, False, True]
        assert b"max_connections_per_client = 3" in remote[3][1].written
        for protocol, _ in remote[:3]:
            protocol.connection_lost(None)

        local = [connect("127.0.0.1", 1000 + p) for p in range(12)]  # the total: 4 x 3
        local[0][0].data_received(b"GET / HTTP/1.1\\r\\n\\r\\n")  # busy: never closed
        more = [connect("127.0.0.1", 2000 + p) for p in range(3)]
        assert not any(t.closed for _, t in more)  # each got in...
        assert local[0][1].closed is False  # ...not by closing the busy one
        assert [t.closed for _, t in local[1:4]] == [True, True, True]  # the idlest went
        for protocol, transport in local + more:
            if not transport.closed:
                protocol.data_received(b"GET / HTTP/1.1\\r\\n\\r\\n")  # all busy now
        late = connect("::1", 3000)
        assert late[1].closed and b"none idle" in late[1].written

    asyncio.run(scenario())
