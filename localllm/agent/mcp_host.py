"""MCP servers for the chat, through the official `mcp` SDK: each server declared in
config.toml ([[mcp_servers]]) is started (stdio) or reached (streamable HTTP) on a thread
of its own with its own event loop, so a slow or broken server never holds the chat. Its
tools are offered to the model as SERVER__TOOL, with the approval every tool call gets.

A server that fails to start, or stops later, is a line of state (`states()`), shown in
the chat's status bar; its tools go away and the chat goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TextIO

from localllm.agent.tool import Tool, bounded
from localllm.agent.workspace import ToolRefused
from localllm.config import McpServer

log = logging.getLogger(__name__)

START_TIMEOUT_S = 30.0  # a server that has not answered `initialize` by then failed
CALL_TIMEOUT_S = 120.0
PING_EVERY_S = 15.0  # a quiet server is pinged this often: one that has died is noticed
PING_TIMEOUT_S = 10.0


class _Stopped(Exception):
    """A connected server stopped answering (the reason is the message)."""


class McpTool(Tool):
    """One tool of a connected server."""

    def __init__(
        self, host: McpHost, server: str, tool: str, description: str, schema: dict[str, Any]
    ) -> None:
        self.host, self.server, self.tool = host, server, tool
        self.source = server
        self.name = offered_name(server, tool)
        self.description = description or f"{tool} (from the MCP server {server})"
        self.parameters = schema if schema.get("type") == "object" else {"type": "object"}

    async def call(self, args: dict[str, Any]) -> str:
        future = self.host.submit(self.host._call(self.server, self.tool, args))
        return await asyncio.wrap_future(future)


def offered_name(server: str, tool: str) -> str:
    """SERVER__TOOL in the characters function names may hold (at most 64)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")[:64]


class McpHost:
    """The configured servers, connected on a thread of their own."""

    def __init__(
        self,
        servers: tuple[McpServer, ...],
        *,
        log_file: Path | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.servers = [s for s in servers if s.enabled]
        self._log_file = log_file
        self._on_change = on_change or (lambda: None)
        self._state: dict[str, str] = {s.name: "starting" for s in self.servers}
        self._tools: dict[str, list[McpTool]] = {}
        self._sessions: dict[str, Any] = {}
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._wake: dict[str, asyncio.Event] = {}  # a server's watcher looks again
        self._starting: dict[str, asyncio.Task[None]] = {}  # each server's task
        self._died: dict[str, str] = {}  # why a call found its server gone
        self._thread = threading.Thread(target=self._run, name="mcp", daemon=True)
        self._errlog: TextIO | None = None
        self._started = False

    # -- any thread ------------------------------------------------------------------
    def start(self) -> None:
        if self.servers and not self._started:
            self._started = True
            self._thread.start()

    def states(self) -> dict[str, str]:
        """Each server's state: starting, ready (N tools), failed: why, stopped: why."""
        return dict(self._state)

    def tools(self, servers: tuple[str, ...] | list[str] | None = None) -> list[Tool]:
        """The tools of the ready servers (of those named, when `servers` is given)."""
        return [
            t
            for name, ts in list(self._tools.items())
            if servers is None or name in servers
            for t in ts
        ]

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        """Until no server is starting (for `localllm mcp list` and tests)."""
        end = time.monotonic() + timeout
        while self._started and time.monotonic() < end:
            if not any(v == "starting" for v in self._state.values()):
                return
            time.sleep(0.02)

    def submit(self, coro: Any) -> Future[Any]:
        if not self._started:
            coro.close()
            raise ToolRefused("the MCP servers are not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self) -> None:
        if not self._started or not self._thread.is_alive():
            return

        def stop() -> None:
            if self._stop is not None:
                self._stop.set()
            for wake in self._wake.values():
                wake.set()
            for name, task in self._starting.items():  # one still starting is not waited for
                if self._state.get(name) == "starting":
                    task.cancel()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)

    # -- the servers' thread ---------------------------------------------------------
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        if self._log_file is not None:  # the servers' stderr (never over the chat's screen)
            self._log_file.parent.mkdir(parents=True, exist_ok=True)
            self._errlog = open(self._log_file, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._errlog = open(os.devnull, "w")  # noqa: SIM115
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()
            if self._errlog is not None:
                self._errlog.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        tasks = {s.name: asyncio.create_task(self._serve(s)) for s in self.servers}
        self._starting = tasks
        await asyncio.gather(*tasks.values(), return_exceptions=True)

    async def _serve(self, server: McpServer) -> None:
        name = server.name
        try:
            async with AsyncExitStack() as stack:
                session = await self._connect(server, stack)
                await asyncio.wait_for(session.initialize(), START_TIMEOUT_S)
                listed = await asyncio.wait_for(session.list_tools(), START_TIMEOUT_S)
                self._sessions[name] = session
                self._tools[name] = [
                    McpTool(self, name, t.name, t.description or "", dict(t.input_schema or {}))
                    for t in listed.tools
                ]
                self._set(name, f"ready ({len(self._tools[name])} tools)")
                await self._watch(name, session)
        except BaseException as exc:  # a server's failure stays its own
            if self._stop is not None and self._stop.is_set():
                self._set(name, "closed")  # the host closed while it started
                return
            why = _reason(exc)
            started = name in self._sessions
            self._set(name, f"{'stopped' if started else 'failed'}: {why}")
            log.warning("MCP server %s %s: %s", name, "stopped" if started else "failed", why)
        finally:
            self._sessions.pop(name, None)
            self._tools.pop(name, None)
            if self._state.get(name, "").startswith("ready"):
                self._set(name, "closed")

    async def _connect(self, server: McpServer, stack: AsyncExitStack) -> Any:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client

        if server.url is not None:
            streams = await stack.enter_async_context(streamable_http_client(server.url))
            read, write = streams[0], streams[1]
        else:
            assert server.command is not None
            params = StdioServerParameters(
                command=server.command,
                args=list(server.args),
                # the SDK passes on only a safe few of this process's variables (HOME,
                # PATH, ...) and adds these: an API key in this shell does not leak
                env=dict(server.env) or None,
            )
            assert self._errlog is not None
            read, write = await stack.enter_async_context(stdio_client(params, errlog=self._errlog))
        return await stack.enter_async_context(ClientSession(read, write))

    async def _watch(self, name: str, session: Any) -> None:
        """Until the host closes: a server a call found gone, or that does not answer a
        ping, has stopped (_Stopped)."""
        assert self._stop is not None
        wake = self._wake.setdefault(name, asyncio.Event())
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(wake.wait(), PING_EVERY_S)
            wake.clear()
            if self._stop.is_set():
                return
            if name in self._died:
                raise _Stopped(self._died.pop(name))
            try:
                await asyncio.wait_for(session.send_ping(), PING_TIMEOUT_S)
            except Exception as exc:
                raise _Stopped(f"no answer to a ping ({_reason(exc)})") from None

    async def _call(self, server: str, tool: str, args: dict[str, Any]) -> str:
        session = self._sessions.get(server)
        if session is None:
            raise ToolRefused(f"the MCP server {server} is not running ({self._state.get(server)})")
        try:
            result = await asyncio.wait_for(session.call_tool(tool, args), CALL_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError):
            raise ToolRefused(f"{server} did not answer within {CALL_TIMEOUT_S:g} s") from None
        except Exception as exc:  # the server's failure, told to the model
            why = _reason(exc)
            self._died[server] = why  # its watcher marks it stopped
            self._wake.setdefault(server, asyncio.Event()).set()
            raise ToolRefused(f"{server} failed: {why}") from None
        parts = []
        for block in result.content:
            text = getattr(block, "text", None)
            parts.append(text if text is not None else f"[{getattr(block, 'type', 'content')}]")
        text = "\n".join(parts)
        if result.is_error:
            raise ToolRefused(f"{tool} reported an error: {text}")
        return bounded(text)

    def _set(self, name: str, state: str) -> None:
        self._state[name] = state
        with contextlib.suppress(Exception):
            self._on_change()


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failure (anyio wraps them in exception groups)."""
    while getattr(exc, "exceptions", None):  # an exception group (3.10: the backport's)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
        return f"no answer within {START_TIMEOUT_S:g} s"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
