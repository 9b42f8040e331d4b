"""The endpoint's server loop: quiet while idle, and stopped at once when asked."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.engine import Engine
from localllm.models.store import ModelStore
from localllm.server.runner import BackgroundEndpoint
from tests.conftest import free_port


def start(tmp_path: Path) -> tuple[BackgroundEndpoint, Engine]:
    settings = Settings(port=free_port(), data_dir=tmp_path / "data")
    engine = Engine(settings, ModelStore(tmp_path / "models"))
    endpoint = BackgroundEndpoint(settings, engine, Accounting.for_settings(settings))
    assert endpoint.error is None, endpoint.error
    for _ in range(200):
        try:
            httpx.get(endpoint.url.rsplit("/v1", 1)[0] + "/health", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    return endpoint, engine


def test_an_idle_endpoint_wakes_about_once_a_second(tmp_path: Path) -> None:
    endpoint, engine = start(tmp_path)
    server = endpoint._server
    assert server is not None
    ticks: list[float] = []
    real = server.on_tick

    async def counted(counter: int) -> bool:
        ticks.append(time.monotonic())
        return await real(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    begun = time.monotonic()
    time.sleep(2.5)
    waited = time.monotonic() - begun
    try:
        # uvicorn's own loop looks ten times a second (about 25 times here)
        assert 1 <= len(ticks) <= waited + 1, (len(ticks), waited)
        reply = httpx.get(endpoint.url + "/models", timeout=5)
        assert reply.status_code == 200
        assert "date" in reply.headers  # refreshed on each look, as uvicorn does
    finally:
        endpoint.stop()
        engine.close()
    assert not endpoint.running


def test_stop_wakes_the_loop_instead_of_waiting_for_its_next_look(tmp_path: Path) -> None:
    endpoint, engine = start(tmp_path)
    server = endpoint._server
    assert server is not None
    server.idle_wake_s = 3600.0  # the next look would be an hour away
    time.sleep(1.2)  # let the loop begin a wait with the new period
    endpoint.stop()  # joins the thread for up to 10 s
    engine.close()
    assert not endpoint.running


async def test_accepted_connections_have_nagle_off() -> None:
    """The listening socket says it is TCP, so asyncio sets TCP_NODELAY on every connection
    (without it a kept-alive client waited for a delayed ACK on each response)."""
    import asyncio
    import socket

    from localllm.server.runner import bind

    sock = bind("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = writer.get_extra_info("socket")
        seen.append(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    port = sock.getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert seen and seen[0] != 0
