"""A Hugging Face hub stand-in on loopback: the hub's URL layout, served from local files.

Serves `GET /api/models/{repo}[/revision/{rev}]` (the listing huggingface_hub's
`model_info(files_metadata=True)` reads: commit, siblings with size, blob id and LFS
SHA-256) and `HEAD`/`GET /{repo}/resolve/{rev}/{path}` with the hub's headers
(X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size) and byte ranges. Faults on demand:
cut a transfer after N bytes once, stall after N bytes, serve altered bytes, demand a
token. Used by the tests and by benchmarks/bench_pull.py; point HF_ENDPOINT at `url`.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_LFS_MIN = 1024 * 1024  # files this large, or weights, are LFS files on the hub
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")


@dataclass
class Repo:
    files: dict[str, Path]
    commit: str = ""
    token: str | None = None  # gated: requests need "Authorization: Bearer <token>"

    def __post_init__(self) -> None:
        if not self.commit:
            names = ",".join(sorted(self.files)).encode()
            self.commit = hashlib.sha1(names, usedforsecurity=False).hexdigest()


@dataclass
class HubServer:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_after: dict[str, int] = field(default_factory=dict)  # path -> bytes, once, whole GETs
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes, then hang
    altered: set[str] = field(default_factory=set)  # paths served with one byte changed
    ignore_range: set[str] = field(default_factory=set)  # paths always sent whole (200)
    throttle: dict[str, int] = field(default_factory=dict)  # path -> 429s to whole GETs
    log: list[tuple[str, str, str]] = field(default_factory=list)  # method, path, Range
    _meta: dict[tuple[str, str], dict] = field(default_factory=dict)
    stop_stalling: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, body=True)

            def do_HEAD(self) -> None:
                hub._handle(self, body=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- life -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop_stalling.set()
        self._server.shutdown()
        self._server.server_close()

    def add(self, repo: str, files: dict[str, Path], *, token: str | None = None) -> Repo:
        self.repos[repo] = Repo(dict(files), token=token)
        return self.repos[repo]

    # -- metadata ---------------------------------------------------------------------
    def sibling(self, repo: str, path: str) -> dict:
        key = (repo, path)
        if key not in self._meta:
            data = self.repos[repo].files[path].read_bytes()
            lfs = len(data) >= _LFS_MIN or path.endswith((".gguf", ".safetensors"))
            blob = hashlib.sha1(
                f"blob {len(data)}\0".encode() + data, usedforsecurity=False
            ).hexdigest()
            entry: dict = {"rfilename": path, "size": len(data), "blobId": blob}
            if lfs:
                sha = hashlib.sha256(data).hexdigest()
                entry["lfs"] = {"sha256": sha, "size": len(data), "pointerSize": 134}
            self._meta[key] = entry
        return self._meta[key]

    def tags(self, repo: str) -> list[str]:
        names = set(self.repos[repo].files)
        tags = ["gguf"] if any(n.endswith(".gguf") for n in names) else []
        if "config.json" in names and any(n.endswith(".safetensors") for n in names):
            tags.append("mlx")
        return tags

    def _search(self, h: BaseHTTPRequestHandler, query: dict[str, list[str]], body: bool) -> None:
        words = (query.get("search") or [""])[0].lower()
        wanted = set(query.get("filter") or [])
        limit = int((query.get("limit") or ["1000"])[0])
        found = [
            {"id": name, "modelId": name, "downloads": len(name), "likes": 0,
             "tags": self.tags(name)}
            for name in sorted(self.repos)
            if words in name.lower() and wanted <= set(self.tags(name))
        ][:limit]
        self._json(h, found, body)

    @staticmethod
    def _json(h: BaseHTTPRequestHandler, value: object, body: bool) -> None:
        payload = json.dumps(value).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    # -- requests ---------------------------------------------------------------------
    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, body: bool) -> None:
        payload = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        if body:
            h.wfile.write(payload)

    def _handle(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path, _, query = h.path.partition("?")
        self.log.append((h.command, path, h.headers.get("Range") or ""))
        if path == "/api/models":  # the model search: ?search=&filter=TAG&limit=N
            self._search(h, urllib.parse.parse_qs(query), body)
            return
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        found = api or resolve
        name = found.group(1) if found else ""
        repo = self.repos.get(name)
        if repo is None:
            self._error(h, 404, "RepoNotFound", body)
            return
        if repo.token and h.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(h, 401, "GatedRepo", body)
            return
        if api:
            siblings = [self.sibling(name, p) for p in sorted(repo.files)]
            self._json(h, {"id": name, "sha": repo.commit, "siblings": siblings}, body)
            return
        assert resolve is not None
        file = resolve.group(3)
        if file not in repo.files:
            self._error(h, 404, "EntryNotFound", body)
            return
        if self.throttle.get(file, 0) > 0 and body and not h.headers.get("Range"):
            self.throttle[file] -= 1
            h.send_response(429)
            h.send_header("Retry-After", "0")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        self._send_file(h, name, file, body)

    def _send_file(self, h: BaseHTTPRequestHandler, repo: str, file: str, body: bool) -> None:
        meta = self.sibling(repo, file)
        size = int(meta["size"])
        start, end = 0, size - 1
        match = _RANGE.fullmatch(h.headers.get("Range") or "")
        if file in self.ignore_range:
            match = None
        if match:
            start = int(match.group(1))
            end = min(int(match.group(2)), size - 1) if match.group(2) else size - 1
        etag = meta["lfs"]["sha256"] if "lfs" in meta else meta["blobId"]
        h.send_response(206 if match else 200)
        h.send_header("X-Repo-Commit", self.repos[repo].commit)
        h.send_header("ETag", f'"{meta["blobId"]}"')
        if "lfs" in meta:
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(size))
        h.send_header("Accept-Ranges", "bytes")
        h.send_header("Content-Length", str(end - start + 1))
        if match:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if not body:
            return
        count = end - start + 1
        cut = self.cut_after.get(file)
        if cut is not None and cut < count and not h.headers.get("Range"):
            del self.cut_after[file]  # once
        else:
            cut = None
        stall = self.stall_after.get(file)
        if stall is not None and stall >= count:
            stall = None
        if cut is not None or stall is not None or file in self.altered:
            with self.repos[repo].files[file].open("rb") as fh:
                fh.seek(start)
                data = fh.read(count)
            if file in self.altered and data:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            limit = cut if cut is not None else stall
            if limit is not None and limit < len(data):
                h.wfile.write(data[:limit])
                h.wfile.flush()
                if stall is not None and cut is None:
                    while not self.stop_stalling.wait(0.2):
                        pass
                h.close_connection = True
                return
            h.wfile.write(data)
            return
        h.wfile.flush()
        with self.repos[repo].files[file].open("rb") as fh:
            h.connection.sendfile(fh, start, count)


def wait_for(predicate, timeout: float = 30.0) -> bool:
    """Poll until predicate() is true or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def main() -> None:
    """`python -m tests.hubserver org/repo=FILE ...`: serve until killed; print the URL."""
    import sys

    server = HubServer()
    for arg in sys.argv[1:]:
        spec, _, file = arg.partition("=")
        repo, _, name = spec.rpartition("/") if spec.count("/") == 2 else (spec, "", "")
        path = Path(file)
        server.repos.setdefault(repo, Repo({})).files[name or path.name] = path
    with server:
        print(server.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
