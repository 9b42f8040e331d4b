"""What every request passes before a route sees it, and what is said after it.

In order: a request id; the Host allowlist (DNS rebinding); the Origin policy (a
browser's cross-site request, answered preflights for allowed origins); the API key
and its quotas; a JSON content type for POSTs. Refusals use the API's error shape.
When the response ends, one JSON line goes to the access log and the request is
counted in the metrics.

Why each check:
- A DNS-rebinding page makes the browser send `Host: attacker.example` to 127.0.0.1.
  Rebinding needs a name, so IP literals pass, and so do loopback names, this
  machine's name, the bound address and the names in `allowed_hosts`. The header is
  parsed as a URL authority: userinfo, stray text after `]` or a bad port is a 403.
- A browser sends `Origin` on every cross-site request; other clients send none. An
  origin is allowed when it is loopback, an IDE webview (`vscode-webview://`,
  `vscode-file://`), or listed in `allowed_origins`, scheme and host compared without
  regard to case. CORS headers and preflights are Starlette's CORSMiddleware, given
  the same policy; an allowed origin's Private Network Access preflight (a public page
  asking to reach this loopback server) is answered yes.
- A form or `text/plain` POST is a "simple" request a page can send without a
  preflight: POSTs must say `application/json`, so none of those starts a generation.
  A POST with no Content-Type at all is taken as JSON when it bears no browser's signs
  (no Origin, no Sec-Fetch-Site): litellm's Ollama provider, and so aider, sends those.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from localllm.config import Settings
from localllm.engine.accounting import Accounting, Key
from localllm.server.wire import error_for

access_log = logging.getLogger("localllm.access")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = ("/health",)  # served without a key
# what changes the server for every client: an admin key's, once keys exist (a client
# key gets 403 admin_required); Ollama's load and unload through keep_alive are checked
# in their route (ollama/routes.py), as they share /api/generate and /api/chat
ADMIN_ROUTES = frozenset(
    {
        ("POST", "/admin/load"),
        ("POST", "/admin/unload"),
        ("POST", "/api/pull"),
        ("DELETE", "/api/delete"),
        ("POST", "/lora-adapters"),
    }
)
_LOOPBACK_NAMES = ("localhost",)
# Only `.localhost` names are loopback by definition (browsers resolve them so
# themselves). `.local` (mDNS) and `.internal` are not allowed by default: any machine
# on the LAN can answer an mDNS query, so a rebinding page could use such a name. This
# machine's own `NAME.local` is allowed; others go in `allowed_hosts`.
_LOOPBACK_SUFFIX = ".localhost"
_IDE_ORIGIN = r"(vscode-webview|vscode-file)://.*"
_LOOPBACK_ORIGIN = r"https?://(localhost|[a-z0-9.-]+\.localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?"


def origin_pattern(allowed: Iterable[str]) -> str:
    """One regular expression for every allowed Origin: loopback, IDE webviews, and the
    `allowed_origins` setting ("*" any origin, "scheme://*" any of that scheme, else an
    exact origin)."""
    parts = [_LOOPBACK_ORIGIN, _IDE_ORIGIN]
    for item in allowed:
        item = item.strip().rstrip("/")
        if item == "*":
            parts.append(".*")
        elif item.endswith("://*"):
            parts.append(re.escape(item[:-1]) + ".*")
        elif item:
            parts.append(re.escape(item))
    # an origin's scheme and host compare case-insensitively (CORSMiddleware too)
    return "(?i)(" + "|".join(parts) + ")"


# host [":" port] as a URL authority has it, without userinfo: a bracketed IPv6
# address, or a name / IPv4 address of letters, digits, '-', '_' and '.'
_AUTHORITY = re.compile(
    r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9._-]+))(?::(?P<port>\d{1,5}))?"
)


def host_name(header: str) -> str | None:
    """The name in a Host header, without the port or IPv6 brackets, lowercased; None
    when the header is not a well-formed authority (`localhost:80@evil.example`,
    `[::1]evil.example`, a port over 65535)."""
    found = _AUTHORITY.fullmatch(header.strip().lower())
    if found is None or (found["port"] is not None and not 0 < int(found["port"]) <= 65535):
        return None
    if found["v6"] is not None:
        return found["v6"] if _is_ip(found["v6"]) else None
    return found["name"]


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    def __init__(self, settings: Settings) -> None:
        machine = socket.gethostname().lower()
        own = {settings.host.lower(), machine, machine + ".local"}
        self.names = own | set(_LOOPBACK_NAMES) | {h.lower() for h in settings.allowed_hosts}
        self.any = "*" in settings.allowed_hosts

    def allows(self, header: str | None) -> bool:
        if header is None or self.any:
            return True  # HTTP/1.0 without Host: no browser sends that
        name = host_name(header)
        if name is None:
            return False
        name = name.rstrip(".")
        return name in self.names or _is_ip(name) or name.endswith(_LOOPBACK_SUFFIX)


class Guard:
    """Pure ASGI middleware (streamed responses pass through untouched)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: Settings,
        accounting: Accounting | None,
        on_done: Callable[[dict[str, Any]], None] | None = None,
        json_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.json_paths = frozenset(json_paths)  # routes that take a JSON body by POST
        self.hosts = HostPolicy(settings)
        self.origins = re.compile(origin_pattern(settings.allowed_origins))
        self.accounting = accounting
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        rid = headers.get("x-request-id", "")
        if not (0 < len(rid) <= 64 and rid.isascii() and rid.isprintable()):
            rid = uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        origin = headers.get("origin")
        allowed_origin = origin is not None and self.origins.fullmatch(origin) is not None
        record: dict[str, Any] = {"status": 0}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                extra = [(b"x-request-id", rid.encode())]
                if allowed_origin and origin is not None:
                    have = {k.lower() for k, _ in message.get("headers", [])}
                    if b"access-control-allow-origin" not in have:
                        extra.append((b"access-control-allow-origin", origin.encode()))
                        extra.append((b"vary", b"Origin"))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        try:
            refusal = self._check(scope, headers, origin, allowed_origin)
            if refusal is None:
                await self.app(scope, receive, send_with_headers)
            else:
                status, message, code, extra = refusal
                path = str(scope.get("path", ""))
                await _send_error(send_with_headers, status, message, code, extra, path)
        finally:
            self._done(scope, state, record, started)

    def _check(
        self, scope: Scope, headers: dict[str, str], origin: str | None, allowed_origin: bool
    ) -> tuple[int, str, str, dict[str, str]] | None:
        """(status, message, code, headers) when the request is refused; else None."""
        hosts = sum(1 for k, _ in scope["headers"] if k.lower() == b"host")
        if hosts > 1:  # which one a proxy or a check reads differs: RFC 9112 says 400
            return (
                400,
                f"The request has {hosts} Host headers; send one.",
                "duplicate_host_header",
                {},
            )
        if not self.hosts.allows(headers.get("host")):
            host = headers.get("host", "")[:100]
            return (
                403,
                f"The Host header '{host}' is not one this server answers to (DNS rebinding "
                "protection); add it to allowed_hosts in the server's config to allow it.",
                "host_not_allowed",
                {},
            )
        if origin is not None and not allowed_origin:
            return (
                403,
                f"Requests from the web origin '{origin[:100]}' are not allowed; add it to "
                "allowed_origins in the server's config to allow it.",
                "origin_not_allowed",
                {},
            )
        method, path = scope["method"], scope["path"]
        if method == "OPTIONS" and origin is not None:
            return None  # a preflight: CORSMiddleware answers it, no key needed
        state = scope["state"]
        state["client"] = "anonymous"
        state["admin"] = True  # without keys, whoever reaches the server (loopback) is
        if self.accounting is not None and path not in OPEN_PATHS:
            keys = self.accounting.list_keys()
            if keys:
                key = self._key(headers)
                if key is None:
                    said = bool(_presented(headers))
                    return (
                        401,
                        "The API key is not valid; check it, or make one with "
                        "`localllm keys add NAME`."
                        if said
                        else "This server needs an API key: send 'Authorization: Bearer "
                        "KEY' (make one with `localllm keys add NAME`).",
                        "invalid_api_key",
                        {"WWW-Authenticate": "Bearer"},
                    )
                state["client"], state["admin"] = key.name, key.admin
                if not key.admin and (method, path) in ADMIN_ROUTES:
                    return (
                        403,
                        f"{method} {path} changes the server for every client: it needs an "
                        f"admin key, and the key '{key.name}' is a client key (make an admin "
                        "key with `localllm keys add NAME --admin`).",
                        "admin_required",
                        {},
                    )
                over = self.accounting.over_quota(key)
                if over is not None:
                    why, wait = over
                    return (
                        429,
                        f"Rate limit: {why}; try again in {wait} s.",
                        "rate_limit_exceeded",
                        {"Retry-After": str(wait)},
                    )
        if method == "POST" and path in self.json_paths:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if not kind and not _from_browser(headers):
                # litellm's Ollama provider sends JSON with no type at all: read it as JSON
                scope["headers"] = [*scope["headers"], (b"content-type", b"application/json")]
                return None
            if kind != "application/json" and not kind.endswith("+json"):
                shown = kind or "none"
                return (
                    415,
                    f"The request's Content-Type is {shown}; send JSON with "
                    "'Content-Type: application/json'.",
                    "unsupported_media_type",
                    {},
                )
        return None

    def _key(self, headers: dict[str, str]) -> Key | None:
        assert self.accounting is not None
        presented = _presented(headers)
        return self.accounting.lookup(presented) if presented else None

    def _done(
        self, scope: Scope, state: dict[str, Any], record: dict[str, Any], started: float
    ) -> None:
        seconds = time.monotonic() - started
        line = {
            "request_id": state["request_id"],
            "client": state.get("client", "anonymous"),
            "method": scope["method"],
            "route": scope["path"],
            "status": record["status"],
            "model": state.get("model"),
            "duration_s": round(seconds, 4),
        }
        if self.on_done is not None:
            self.on_done(line)  # adds what the engine said of the request
        access_log.info("%s", json.dumps(line, separators=(",", ":")))


def write_access_log(stream: Any) -> None:
    """Send the access log's JSON lines, bare, to `stream` (for `localllm serve`)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False


def _from_browser(headers: dict[str, str]) -> bool:
    """Whether a request bears a browser's signs: every browser sends Origin on a POST
    from another site and Sec-Fetch-Site on every request; programs send neither."""
    return "origin" in headers or "sec-fetch-site" in headers


def _presented(headers: dict[str, str]) -> str:
    """The key a client sent: OpenAI's and Ollama's bearer token, or Anthropic's x-api-key."""
    auth = headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("x-api-key", "").strip()


async def _send_error(
    send: Send, status: int, message: str, code: str, headers: dict[str, str], path: str
) -> None:
    err_type = {401: "authentication_error", 429: "rate_limit_error"}.get(
        status, "permission_error" if code == "admin_required" else "invalid_request_error"
    )
    body = json.dumps(error_for(path, status, message, err_type, None, code)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
