"""/api/pull and /api/delete against the hub stand-in on loopback (HF_ENDPOINT)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from localllm.backends.base import ModelRef
from tests.conftest import ServerProcess
from tests.hubserver import HubServer


def test_pull_streams_progress_then_delete(tmp_path: Path, starter_ref: ModelRef):
    with HubServer() as hub:
        hub.add("test-org/tiny-GGUF", {"tiny-Q4_1.gguf": starter_ref.path})
        srv = ServerProcess(tmp_path, env={"HF_ENDPOINT": hub.url, "HF_TOKEN": ""})
        try:
            before = {m["name"] for m in httpx.get(srv.base + "/api/tags").json()["models"]}
            with httpx.stream("POST", srv.base + "/api/pull",
                              json={"model": "test-org/tiny-GGUF:Q4_1"}, timeout=120) as r:
                assert r.headers["content-type"].startswith("application/x-ndjson")
                lines = [json.loads(line) for line in r.iter_lines() if line]
            assert lines[0] == {"status": "pulling manifest"}
            assert lines[-1] == {"status": "success"}
            progress = [x for x in lines if "completed" in x]
            assert progress and progress[-1]["completed"] == progress[-1]["total"]
            assert progress[-1]["total"] == starter_ref.path.stat().st_size
            after = {m["name"] for m in httpx.get(srv.base + "/api/tags").json()["models"]}
            (pulled,) = after - before
            again = httpx.post(srv.base + "/api/pull", json={
                "model": "test-org/tiny-GGUF:Q4_1", "stream": False}, timeout=120)
            assert again.json() == {"status": "success"}  # already there: nothing to fetch
            chat = httpx.post(srv.base + "/api/chat", json={
                "model": pulled, "stream": False, "options": {"num_predict": 2},
                "messages": [{"role": "user", "content": "Hi"}]}, timeout=120)
            assert chat.status_code == 200 and chat.json()["done"]
            gone = httpx.request("DELETE", srv.base + "/api/delete", json={"model": pulled})
            assert gone.status_code == 200
            left = {m["name"] for m in httpx.get(srv.base + "/api/tags").json()["models"]}
            assert pulled not in left
            starter = httpx.request("DELETE", srv.base + "/api/delete", json={"model": "starter"})
            assert starter.status_code == 400 and "store" in starter.json()["error"]
            missing = httpx.post(srv.base + "/api/pull", json={"model": "test-org/nope"},
                                 timeout=60)
            assert missing.status_code >= 400 and "nope" in missing.json()["error"]
        finally:
            srv.stop()


@pytest.mark.parametrize("body", [{}, {"model": ""}])
def test_pull_needs_a_name(server: ServerProcess, body: dict):
    r = httpx.post(server.base + "/api/pull", json=body)
    assert r.status_code == 400 and "error" in r.json()
