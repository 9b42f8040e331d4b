"""A remote engine: any server of the OpenAI-compatible API (vLLM, SGLang, TGI,
llama-server, lmdeploy) that localllm fronts instead of running the model itself.

This module is the wire and the failure handling: timeouts, retries with backoff on
429/503 (Retry-After honoured), and a circuit breaker that marks an engine down after
repeated failures so that requests fail in milliseconds instead of waiting on it. What
a request becomes on the wire, and how the engine routes to a remote, is in
engine/remote_route.py.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from localllm import jsontext
from localllm.config import Remote
from localllm.errors import RemoteRejected, RemoteUnavailable

log = logging.getLogger(__name__)

RETRY_AFTER_MAX_S = 30.0  # a Retry-After longer than this is not waited for: 503 at once
BACKOFF_BASE_S = 0.5  # without Retry-After: 0.5 s, 1 s, 2 s, ...
MODELS_TTL_S = 60.0  # how long an engine's model list is kept before asking again
MAX_SMALL_BYTES = 4 * 1024 * 1024  # a token count's answer (its tokens listed) at most
PROBE_TIMEOUT_S = 3.0  # listing models for `list`, /v1/models and the chat's picker


@dataclass(frozen=True, slots=True)
class RemoteModel:
    """A model a remote engine serves, as localllm names it (REMOTE/ID)."""

    remote: str
    id: str
    n_ctx: int | None = None  # the engine's max_model_len where it reports one

    @property
    def name(self) -> str:
        return f"{self.remote}/{self.id}"


class Breaker:
    """Counts consecutive failures; after `trip` of them the engine is down for
    `down_for` seconds, then one request may try it again (half open)."""

    def __init__(self, trip: int, down_for: float) -> None:
        self.trip = trip
        self.down_for = down_for
        self.failures = 0
        self.down_until = 0.0
        self.last_error: str | None = None
        self._lock = threading.Lock()

    def down_for_s(self, now: float | None = None) -> float:
        """Seconds the engine stays marked down (0: it may be tried)."""
        now = time.monotonic() if now is None else now
        return max(0.0, self.down_until - now)

    def failed(self, reason: str) -> None:
        with self._lock:
            self.failures += 1
            self.last_error = reason
            if self.failures >= self.trip:
                self.down_until = time.monotonic() + self.down_for
                log.warning("remote marked down for %.0f s: %s", self.down_for, reason)

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0
            self.down_until = 0.0


def shown_url(url: str) -> str:
    """A remote's URL as /health, /api/ps and logs show it: without the user and password
    a URL may carry (`http://user:secret@host/v1` is `http://host/v1`)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit(parts._replace(netloc=netloc))


class Upstream:
    """One registered engine: its HTTP client, its breaker and its model list."""

    def __init__(self, remote: Remote, env: Mapping[str, str] | None = None) -> None:
        self.remote = remote
        self.name = remote.name
        self.base = remote.url.rstrip("/")
        self._env = os.environ if env is None else env
        self.breaker = Breaker(remote.failures_to_trip, remote.down_for_s)
        self._models: tuple[float, list[RemoteModel]] | None = None
        # one client per event loop (the server has one): its connections are kept open
        # between requests, so a request costs no new connection or TLS context
        self._client: tuple[asyncio.AbstractEventLoop, httpx.AsyncClient] | None = None
        # which route counts a prompt's tokens (None: not known yet; "": none does)
        self.count_route: str | None = None

    # -- plumbing ---------------------------------------------------------------------
    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.remote.api_key_env:
            key = self._env.get(self.remote.api_key_env)
            if key:
                headers["Authorization"] = f"Bearer {key}"
        return headers

    def client(self) -> httpx.AsyncClient:
        """The client for the running event loop."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client[0] is not loop:
            limits = httpx.Limits(max_keepalive_connections=16, keepalive_expiry=30)
            self._client = (loop, httpx.AsyncClient(timeout=self._timeout(), limits=limits))
        return self._client[1]

    def _timeout(self, read: float | None = None) -> httpx.Timeout:
        r = self.remote
        return httpx.Timeout(read or r.read_timeout_s, connect=r.connect_timeout_s)

    def status(self) -> dict[str, Any]:
        """For /health and `localllm ps`: up or down, and why."""
        down = self.breaker.down_for_s()
        return {
            "name": self.name,
            "url": shown_url(self.remote.url),
            "state": "down" if down > 0 else "up",
            "down_for_s": round(down, 1),
            "failures": self.breaker.failures,
            "last_error": self.breaker.last_error,
            "fallback": self.remote.fallback,
        }

    def check_up(self) -> None:
        """RemoteUnavailable at once while the breaker holds the engine down."""
        down = self.breaker.down_for_s()
        if down > 0:
            raise RemoteUnavailable(
                self.name,
                f"marked down after {self.breaker.failures} failures "
                f"(last: {self.breaker.last_error})",
                retry_after_s=down,
            )

    # -- the model list --------------------------------------------------------------
    def configured(self) -> list[RemoteModel]:
        return [RemoteModel(self.name, m) for m in self.remote.models]

    async def models(self, *, fresh: bool = False) -> list[RemoteModel]:
        """The models to expose: the engine's list (with context lengths), kept for a
        minute, narrowed to the configured ones when there are any; the configured
        ones alone while the engine cannot be asked."""
        now = time.monotonic()
        if not fresh and self._models is not None and now - self._models[0] < MODELS_TTL_S:
            return self._models[1]
        if self.breaker.down_for_s() > 0:
            return self.configured()
        try:
            async with httpx.AsyncClient(timeout=self._timeout(PROBE_TIMEOUT_S)) as client:
                reply = await client.get(self.base + "/models", headers=self.headers())
            reply.raise_for_status()
            listed = [_model_of(self.name, row) for row in reply.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.info("listing the models of remote %s failed: %s", self.name, exc)
            return self.configured()
        wanted = set(self.remote.models)
        if wanted:
            known = {m.id: m for m in listed}
            listed = [known.get(m, RemoteModel(self.name, m)) for m in self.remote.models]
        self._models = (now, listed)
        return listed

    def models_sync(self) -> list[RemoteModel]:
        """models() for code that has no event loop (the CLI)."""
        return asyncio.run(self.models())

    # -- a request ---------------------------------------------------------------------
    async def stream(self, path: str, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """POST a streamed request and yield each server-sent event's JSON as it arrives.

        429 and 503 are retried (`retries` times, after Retry-After or a doubling
        backoff); a refused connection, a timeout or a 5xx after the retries counts
        against the breaker and raises RemoteUnavailable; another 4xx is the client's
        and raises RemoteRejected with the engine's message. Closing the iterator
        (a client that left) closes the upstream connection.
        """
        self.check_up()
        client = self.client()
        for attempt in range(self.remote.retries + 1):
            try:
                request = client.build_request(
                    "POST", self.base + path, json=body, headers=self.headers()
                )
                reply = await client.send(request, stream=True)
            except httpx.TimeoutException:
                raise self._failed("no answer within the connect/read timeout") from None
            except httpx.HTTPError as exc:
                raise self._failed(
                    f"cannot connect to {shown_url(self.remote.url)}: {exc}"
                ) from None
            try:
                if reply.status_code in (429, 503):
                    wait = _retry_after(reply.headers.get("retry-after"), attempt)
                    if attempt < self.remote.retries and wait <= RETRY_AFTER_MAX_S:
                        log.info(
                            "remote %s said %d; retrying in %.1f s",
                            self.name,
                            reply.status_code,
                            wait,
                        )
                        await asyncio.sleep(wait)
                        continue
                    raise self._failed(
                        f"it answered {reply.status_code} after {attempt + 1} tries",
                        retry_after=wait,
                    )
                if reply.status_code >= 500:
                    text = (await reply.aread()).decode("utf-8", "replace")
                    raise self._failed(f"it answered {reply.status_code}: {_message(text)}")
                if reply.status_code >= 400:
                    text = (await reply.aread()).decode("utf-8", "replace")
                    raise RemoteRejected(self.name, reply.status_code, _message(text))
                async for event in _events(reply, self.name):
                    if event.get("error"):  # an error reported inside the stream
                        raise RemoteRejected(self.name, 502, _message(json.dumps(event)))
                    yield event
                self.breaker.succeeded()
                return
            except httpx.TimeoutException:
                raise self._failed("it stopped sending within the read timeout") from None
            except httpx.HTTPError as exc:
                raise self._failed(f"the connection broke: {exc}") from None
            finally:
                await reply.aclose()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """A small JSON request (counting tokens); None when the engine has no such route
        or cannot answer it. Never counts against the breaker."""
        try:
            data = await asyncio.wait_for(self._small_json(path, body), PROBE_TIMEOUT_S * 4)
        except (httpx.HTTPError, ValueError, asyncio.TimeoutError):
            return None
        return data if isinstance(data, dict) else None

    async def _small_json(self, path: str, body: dict[str, Any]) -> Any:
        """The JSON of a small answer; None for another status or one over MAX_SMALL_BYTES
        (an engine that answers without end is not read to its end)."""
        url, timeout = self.root() + path, self._timeout(PROBE_TIMEOUT_S)
        async with self.client().stream(
            "POST", url, json=body, headers=self.headers(), timeout=timeout
        ) as reply:
            if reply.status_code != 200:
                return None
            raw = bytearray()
            async for piece in reply.aiter_bytes():
                raw += piece
                if len(raw) > MAX_SMALL_BYTES:
                    return None
        return jsontext.loads(raw)

    def root(self) -> str:
        """The server's root: the base URL without its /v1 (where /tokenize lives)."""
        return self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base

    def _failed(self, reason: str, retry_after: float | None = None) -> RemoteUnavailable:
        self.breaker.failed(reason)
        return RemoteUnavailable(self.name, reason, retry_after_s=retry_after)


def _model_of(remote: str, row: dict[str, Any]) -> RemoteModel:
    """A /v1/models row: vLLM says max_model_len, llama-server meta.n_ctx_train, others
    context_length or nothing."""
    n_ctx = row.get("max_model_len") or row.get("context_length") or row.get("context_window")
    meta = row.get("meta")
    if not n_ctx and isinstance(meta, dict):
        n_ctx = meta.get("n_ctx") or meta.get("n_ctx_train")
    return RemoteModel(remote, str(row["id"]), int(n_ctx) if n_ctx else None)


def _retry_after(value: str | None, attempt: int) -> float:
    """Seconds to wait before the next try: the Retry-After header (seconds or an HTTP
    date), else a doubling backoff."""
    if value:
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    return BACKOFF_BASE_S * (2**attempt)


def _message(text: str) -> str:
    """The error message in an engine's JSON error body (OpenAI's shape, or FastAPI's
    detail), else the body's start."""
    try:
        data = jsontext.loads(text)
    except ValueError:
        return text.strip()[:500] or "(no message)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
        if data.get("message"):
            return str(data["message"])
        if data.get("detail"):
            return str(data["detail"])[:500]
    return text.strip()[:500]


MAX_LINE_BYTES = 16 * 1024 * 1024  # one event line; an answer's text is cut at 8 MiB


async def _events(reply: httpx.Response, engine: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each `data:` line of a server-sent event stream, until [DONE]; a line
    longer than MAX_LINE_BYTES (an engine that never sends a newline) is a 502.

    Lines are split from the raw bytes here: httpx's text-line iterator decodes and
    re-splits every piece and cost about a third of the proxy's time per token."""
    pending = bytearray()
    async for piece in reply.aiter_bytes():
        searched = len(pending)
        pending += piece
        if pending.find(b"\n", searched) < 0:
            if len(pending) > MAX_LINE_BYTES:
                raise RemoteRejected(
                    engine,
                    502,
                    f"it sent {len(pending):,} bytes without a newline "
                    f"(an event line is at most {MAX_LINE_BYTES:,})",
                )
            continue
        *lines, rest = pending.split(b"\n")
        pending = bytearray(rest)
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return
            try:
                event = jsontext.loads(data)
            except ValueError:
                log.info("a remote event that is not JSON was skipped: %.200r", bytes(data))
                continue
            if isinstance(event, dict):
                yield event
