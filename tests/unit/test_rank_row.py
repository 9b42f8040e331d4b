"""How a reranker's query-document pair is laid out (backends/llamacpp_embed.rank_row),
with a word-per-token tokenizer: llama-server's default layout, a GGUF `rerank` template,
and a long document cut from either side to fit."""

from __future__ import annotations

from localllm.backends.llamacpp_embed import RankLayout, rank_row

BOS, EOS, SEP = 1, 2, 3
WORDS: dict[str, int] = {}


def tokenize(text: str, special: bool) -> list[int]:
    return [WORDS.setdefault(w, 100 + len(WORDS)) for w in text.split()]


def ids(text: str) -> list[int]:
    return tokenize(text, False)


DEFAULT = RankLayout(template=None, head=(BOS,), middle=(EOS, SEP), tail=(EOS,))
TEMPLATE = RankLayout(template="Query: {query} Document: {document} Relevant:",
                      head=(), middle=(), tail=())


def test_the_default_layout_is_llama_servers():
    row = rank_row(tokenize, DEFAULT, "the cat", "a dog ran", limit=100, cut=None)
    assert row == [BOS, *ids("the cat"), EOS, SEP, *ids("a dog ran"), EOS]


def test_a_template_is_filled_and_read_whole():
    row = rank_row(tokenize, TEMPLATE, "the cat", "a dog", limit=100, cut=None)
    assert row == ids("Query: the cat Document: a dog Relevant:")


def test_a_long_document_is_cut_from_the_side_asked():
    doc = " ".join(f"w{i}" for i in range(50))
    fixed = 1 + 2 + 2 + 1  # BOS, the query's two tokens, EOS SEP, and the closing EOS
    right = rank_row(tokenize, DEFAULT, "the cat", doc, limit=20, cut="right")
    left = rank_row(tokenize, DEFAULT, "the cat", doc, limit=20, cut="left")
    assert len(right) == len(left) == 20
    assert right[5:-1] == ids(doc)[: 20 - fixed] and left[5:-1] == ids(doc)[-(20 - fixed):]
    # uncut, the whole pair comes back (its length is refused where it is read)
    assert len(rank_row(tokenize, DEFAULT, "the cat", doc, limit=20, cut=None)) == 50 + fixed
    # a template's pair is cut in its document only, the words around it kept
    cut = rank_row(tokenize, TEMPLATE, "the cat", doc, limit=20, cut="right")
    assert len(cut) == 20
    assert cut[:4] == ids("Query: the cat Document:") and cut[-1:] == ids("Relevant:")
