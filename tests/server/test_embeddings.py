"""/v1/embeddings through the `openai` client, and Ollama's /api/embed and
/api/embeddings, on the starter (a chat model: mean pooling over its last layer)."""

from __future__ import annotations

import base64
import struct
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import ServerProcess
from tests.gguf_fixtures import tiny_bert

TEXTS = ["The cat sat on the mat.", "A cat was sitting on a rug.",
         "Quarterly revenue grew by eight percent.", "def add(a, b): return a + b"]


def test_batch_shape_and_normalisation(server: ServerProcess):
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="x", max_retries=0)
    r = client.embeddings.create(model="starter", input=TEXTS)
    assert [d.index for d in r.data] == [0, 1, 2, 3]
    vectors = np.array([d.embedding for d in r.data])
    assert vectors.shape == (4, 576)  # SmolLM2-135M's hidden size
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens > len(TEXTS)
    # batched and alone give the same vector
    alone = client.embeddings.create(model="starter", input=TEXTS[2]).data[0].embedding
    assert np.allclose(alone, vectors[2], atol=1e-4)
    # the two sentences about a cat are nearer each other than either is to revenue
    sim = vectors @ vectors.T
    assert sim[0, 1] > sim[0, 2] and sim[0, 1] > sim[1, 2]
    # token ids and base64 (float32, little-endian) work too
    ids = httpx.post(server.base + "/tokenize", json={"content": TEXTS[0]}).json()["tokens"]
    by_ids = client.embeddings.create(model="starter", input=ids).data[0].embedding
    assert len(by_ids) == 576
    raw = httpx.post(server.base + "/v1/embeddings", json={
        "model": "starter", "input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = struct.unpack("<576f", base64.b64decode(raw["data"][0]["embedding"]))
    assert np.allclose(decoded, vectors[0], atol=1e-6)


def test_ollama_embed_routes(server: ServerProcess):
    r = httpx.post(server.base + "/api/embed", json={"model": "starter", "input": TEXTS[:2]},
                   timeout=60).json()
    assert len(r["embeddings"]) == 2 and len(r["embeddings"][0]) == 576
    assert r["prompt_eval_count"] > 2
    old = httpx.post(server.base + "/api/embeddings",
                     json={"model": "starter", "prompt": TEXTS[0]}, timeout=60).json()
    assert np.allclose(old["embedding"], r["embeddings"][0], atol=1e-5)
    refused = httpx.post(server.base + "/api/embed",
                         json={"model": "starter", "input": "x", "truncate": True})
    assert refused.status_code == 400 and "truncate" in refused.json()["error"]


def test_limits_are_clear(server: ServerProcess):
    long = httpx.post(server.base + "/v1/embeddings",
                      json={"model": "starter", "input": "word " * 5000}, timeout=60)
    assert long.status_code == 400 and "4096" in long.json()["error"]["message"]
    empty = httpx.post(server.base + "/v1/embeddings", json={"model": "starter", "input": []})
    assert empty.status_code == 400


@pytest.mark.model
def test_a_bert_embedding_model(tmp_path: Path):
    """The BERT family as llama.cpp runs it: a tiny random-weight BERT in the store,
    its CLS pooling from the GGUF, mean pooling on request."""
    store = tmp_path / "data" / "models"
    store.mkdir(parents=True)
    tiny_bert(store / "tiny-bert.gguf")
    srv = ServerProcess(tmp_path)
    try:
        body = {"model": "tiny-bert", "input": ["the cat sat", "a dog ran", "the cat sat"]}
        r = httpx.post(srv.base + "/v1/embeddings", json=body, timeout=60).json()
        vectors = np.array([d["embedding"] for d in r["data"]])
        assert vectors.shape == (3, 32)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
        assert np.allclose(vectors[0], vectors[2], atol=1e-5)
        assert r["usage"]["prompt_tokens"] == 15  # [CLS] three words [SEP], three times
        mean = httpx.post(srv.base + "/v1/embeddings", json={**body, "pooling": "mean"},
                          timeout=60).json()
        assert not np.allclose(mean["data"][0]["embedding"], vectors[0], atol=1e-3)
        shown = httpx.post(srv.base + "/api/show", json={"model": "tiny-bert"}).json()
        assert "embedding" in shown["capabilities"]
    finally:
        srv.stop()


def test_ollama_embed_keep_alive_is_read(server: ServerProcess):
    ok = httpx.post(server.base + "/api/embed",
                    json={"model": "starter", "input": "x", "keep_alive": "5m"}, timeout=60)
    assert ok.status_code == 200
    bad = httpx.post(server.base + "/api/embed",
                     json={"model": "starter", "input": "x", "keep_alive": "soon"})
    assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]
