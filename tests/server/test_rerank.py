"""/v1/rerank (and llama-server's other names for it) on tiny random-weight BERT
rerankers written with the `gguf` package (tests/gguf_fixtures.py: tiny_bert with a
classification head): real llama.cpp rank pooling, the answers noise. What is checked is
the plumbing: each score is the head's output for its pair, in the documents' order
whatever the batching, sorted best first, tokens counted, long documents cut or refused,
and the two request shapes (Jina/Cohere, and Hugging Face TEI as Continue sends it)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServerProcess, starts_process
from tests.gguf_fixtures import tiny_bert
from tests.unit.test_cli import cli

FLAT_SCORE = 0.75  # the flat reranker's head has zero weights: every pair scores its bias
DOCS = ["the cat sat on the mat", "a dog ran", "code file", "the dog sat on the cat"]
TRAINED_CTX = 128  # tiny_bert's context: the longest pair a rank context takes


@pytest.fixture(scope="module")
@starts_process
def ranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("rerank")
    store = home / "data" / "models"
    store.mkdir(parents=True)
    tiny_bert(store / "tiny-reranker.gguf", head=(1.0, 0.1), seed=3)
    srv = ServerProcess(home)
    yield srv
    srv.stop()


def _rank(srv: ServerProcess, path: str = "/v1/rerank", **body: object) -> httpx.Response:
    return httpx.post(srv.base + path, json={"model": "tiny-reranker", **body}, timeout=120)


def _scores(srv: ServerProcess, query: str, docs: list[str]) -> list[float]:
    """Each document's score, in the documents' order."""
    results = _rank(srv, query=query, documents=docs).json()["results"]
    return [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]


def test_scores_best_first_and_the_same_however_batched(ranker: ServerProcess):
    r = _rank(ranker, query="the cat", documents=DOCS)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == "tiny-reranker"
    results = body["results"]
    assert sorted(x["index"] for x in results) == [0, 1, 2, 3]
    scores = [x["relevance_score"] for x in results]
    assert scores == sorted(scores, reverse=True)
    assert len(set(scores)) == len(scores)  # a random head tells the pairs apart
    assert all("document" not in x for x in results)  # only when asked
    # each pair's score alone is its score among the others, and the tokens add up
    alone = [_rank(ranker, query="the cat", documents=[d]).json() for d in DOCS]
    by_index = {x["index"]: x["relevance_score"] for x in results}
    for i, one in enumerate(alone):
        assert one["results"][0]["relevance_score"] == pytest.approx(by_index[i], abs=1e-4)
    assert body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    # [CLS] the cat [SEP] [SEP] a dog ran [SEP]: llama-server's layout of a BERT pair
    assert alone[1]["usage"]["prompt_tokens"] == 1 + 2 + 2 + 3 + 1


def test_top_n_and_documents_returned(ranker: ServerProcess):
    full = _rank(ranker, query="the cat", documents=DOCS).json()["results"]
    r = _rank(ranker, "/rerank", query="the cat", documents=[{"text": d} for d in DOCS],
              top_n=2, return_documents=True).json()["results"]
    assert [x["index"] for x in r] == [x["index"] for x in full[:2]]
    assert [x["document"]["text"] for x in r] == [DOCS[x["index"]] for x in r]
    # top_n past the number of documents gives them all; every llama-server name answers
    for path in ("/v1/reranking", "/reranking"):
        got = _rank(ranker, path, query="the cat", documents=DOCS, top_n=50).json()["results"]
        assert [x["index"] for x in got] == [x["index"] for x in full]


@pytest.mark.process
def test_the_score_is_the_heads_output(tmp_path: Path):
    store = tmp_path / "data" / "models"
    store.mkdir(parents=True)
    tiny_bert(store / "flat-reranker.gguf", head=(0.0, FLAT_SCORE), seed=4)
    tiny_bert(store / "tiny-reranker.gguf", head=(1.0, 0.1), seed=3)
    tiny_bert(store / "nan-reranker.gguf", head=(1.0, 0.1), poison=math.nan)
    tiny_bert(store / "inf-embedder.gguf", poison=math.inf)
    srv = ServerProcess(tmp_path)
    try:
        body = {"model": "flat-reranker", "query": "the cat", "documents": DOCS[:3]}
        r = httpx.post(srv.base + "/v1/rerank", json=body, timeout=60).json()
        assert [x["relevance_score"] for x in r["results"]] == [FLAT_SCORE] * 3
        tei = httpx.post(srv.base + "/rerank", timeout=60, json={
            "model": "flat-reranker", "query": "the cat", "texts": DOCS[:2]}).json()
        assert [x["score"] for x in tei] == pytest.approx([1 / (1 + math.exp(-FLAT_SCORE))] * 2)
        raw = httpx.post(srv.base + "/rerank", timeout=60, json={
            "model": "flat-reranker", "query": "the cat", "texts": DOCS[:2], "raw_scores": True})
        assert [x["score"] for x in raw.json()] == [FLAT_SCORE] * 2
        # two rerankers and a default that is not one: a request naming none must choose
        unnamed = httpx.post(srv.base + "/rerank", timeout=60,
                             json={"query": "the cat", "texts": DOCS[:2]})
        assert unnamed.status_code == 400
        assert "(flat-reranker, nan-reranker, tiny-reranker)" in unnamed.json()["error"]["message"]
        # round 4: a head that yields NaN or infinity was a 500 (JSON has neither); now a
        # 502 naming the model and the input
        bodies: list[tuple[str, dict[str, Any]]] = [
            ("/v1/rerank", {"model": "nan-reranker", "query": "the cat", "documents": DOCS}),
            ("/rerank", {"model": "nan-reranker", "query": "the cat", "texts": DOCS}),
            ("/v1/embeddings", {"model": "inf-embedder", "input": ["a cat", "the dog"]}),
            ("/api/embed", {"model": "inf-embedder", "input": "a cat"}),
        ]
        for path, body in bodies:
            bad = httpx.post(srv.base + path, json=body, timeout=60)
            assert bad.status_code == 502, (path, bad.text)
            error = bad.json()["error"]
            message = error if isinstance(error, str) else error["message"]
            assert str(body["model"]) in message and "input 0" in message and "finite" in message
    finally:
        srv.stop()


def test_continues_tei_reranker_body(ranker: ServerProcess):
    """Continue's `huggingface-tei` reranker (core/context/rerankers/huggingface-tei.ts,
    continuedev/continue): POST {apiBase}rerank, this body, a bare list back, sorted by
    `index` on its side and read for `score`. With `truncate: true` a chunk longer than the
    model takes is cut from the right, not refused."""
    long_doc = " ".join(["the", "cat", "sat"] * 60)  # 180 tokens: past the 128 it takes
    texts = [DOCS[0], long_doc, DOCS[1]]
    body = {"query": "the cat", "return_text": False, "raw_scores": False, "texts": texts,
            "truncation_direction": "Right", "truncate": True}
    r = httpx.post(ranker.base + "/rerank", json=body, timeout=60,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    rows = r.json()
    assert isinstance(rows, list) and sorted(x["index"] for x in rows) == [0, 1, 2]
    assert all(0.0 < x["score"] < 1.0 and set(x) == {"index", "score"} for x in rows)
    raw = _scores(ranker, "the cat", texts[:1] + texts[2:])
    by_index = {x["index"]: x["score"] for x in rows}
    assert by_index[0] == pytest.approx(1 / (1 + math.exp(-raw[0])), abs=1e-5)
    assert by_index[2] == pytest.approx(1 / (1 + math.exp(-raw[1])), abs=1e-5)


def test_a_long_document_is_cut_from_the_side_asked_or_refused(ranker: ServerProcess):
    words = [w for _ in range(40) for w in ("the", "cat", "sat", "on", "mat")]  # 200
    long_doc = " ".join(words)
    refused = _rank(ranker, query="the cat", documents=["a dog", long_doc])
    assert refused.status_code == 400, refused.text
    message = refused.json()["error"]["message"]
    assert "document 1" in message and str(TRAINED_CTX) in message and "tokens" in message
    # the pair's other tokens: [CLS] the cat [SEP] [SEP] ... [SEP]
    room = TRAINED_CTX - (1 + 2 + 2 + 1)
    right = _rank(ranker, query="the cat", documents=[long_doc], truncate=True).json()
    assert right["usage"]["prompt_tokens"] == TRAINED_CTX
    left = _rank(ranker, query="the cat", documents=[long_doc], truncate=True,
                 truncation_direction="Left").json()
    head, tail = _scores(ranker, "the cat", [" ".join(words[:room]), " ".join(words[-room:])])
    assert right["results"][0]["relevance_score"] == pytest.approx(head, abs=1e-4)
    assert left["results"][0]["relevance_score"] == pytest.approx(tail, abs=1e-4)


def test_bad_requests_name_the_limit(ranker: ServerProcess):
    none = _rank(ranker, query="q", documents=[])
    assert none.status_code == 400 and "at least one document" in none.text
    many = _rank(ranker, query="q", documents=["x"] * 10_000)
    assert many.status_code == 400 and "1000" in many.text
    both = _rank(ranker, query="q", documents=["a"], texts=["b"])
    assert both.status_code == 400
    neither = _rank(ranker, query="q")
    assert neither.status_code == 400 and "documents" in neither.text
    unknown = _rank(ranker, query="q", documents=["a"], rank_fields=["title"])
    assert unknown.status_code == 400 and "rank_fields" in unknown.text
    chat = httpx.post(ranker.base + "/v1/rerank", timeout=60,
                      json={"model": "starter", "query": "q", "documents": ["a", "b"]})
    assert chat.status_code == 400, chat.text
    error = chat.json()["error"]
    assert error["code"] == "not_a_reranker"
    assert "starter is not a reranking model" in error["message"] and "GGUF" in error["message"]


def test_listings_say_rerank(ranker: ServerProcess):
    shown = httpx.post(ranker.base + "/api/show", json={"model": "tiny-reranker"}, timeout=30)
    assert shown.json()["capabilities"] == ["rerank"]
    models = httpx.get(ranker.base + "/v1/models", timeout=30).json()["data"]
    rows = {m["id"]: m for m in models}
    assert rows["tiny-reranker"]["capabilities"] == ["rerank"]
    assert "rerank" not in rows["starter"]["capabilities"]
    info = cli("info", "tiny-reranker", "--json", tmp=ranker.log.parent)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["capabilities"] == ["rerank"]


def test_open_webuis_external_reranker_body(ranker: ServerProcess):
    """Open WebUI's external reranker (backend/open_webui/retrieval/models/external.py,
    open-webui/open-webui): POST to the URL the user gives, the model the user names,
    `top_n` the number of documents, a Bearer key and its user headers; it sorts the
    results by `index` and reads `relevance_score`."""
    docs = DOCS[:3]
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-none",
               "X-OpenWebUI-User-Name": "Ada", "X-OpenWebUI-User-Id": "u-1",
               "X-OpenWebUI-User-Email": "ada@example.com", "X-OpenWebUI-User-Role": "user"}
    body = {"model": "tiny-reranker", "query": "the cat", "documents": docs, "top_n": len(docs)}
    r = httpx.post(ranker.base + "/v1/rerank", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    got = [x["relevance_score"] for x in sorted(r.json()["results"], key=lambda x: x["index"])]
    assert got == pytest.approx(_scores(ranker, "the cat", docs), abs=1e-5)
