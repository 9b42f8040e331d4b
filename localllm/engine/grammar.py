"""Constrained decoding through llguidance: JSON schemas, JSON objects and Lark grammars.

llguidance was chosen over xgrammar (the other well-kept engine): it is one 8 MB wheel
with no dependencies for every platform we support, where xgrammar pulls in torch,
transformers and triton; it compiles a JSON schema lazily (no per-schema warm-up), and it
is the engine llama.cpp itself links for `--llguidance`. It masks tokens from a plain
vocabulary table, so one code path serves both backends.

A grammar is carried through the engine as llguidance's own serialized form (a str), so
`SamplingParams` stays free of library objects. Each running request gets a matcher; the
scheduler asks it for the allowed tokens before it samples and tells it what was sampled.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from typing import Any

import numpy as np

from localllm.backends.base import Decoding
from localllm.backends.tools import JSON_OPTIONS, TOOL_OPTIONS, closed
from localllm.errors import InvalidRequest

log = logging.getLogger(__name__)

_tokenizers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _llg() -> Any:
    import llguidance

    return llguidance


def from_json_schema(
    schema: dict[str, Any], *, param: str = "response_format", lenient: bool = False
) -> str:
    """The grammar for JSON matching `schema`; InvalidRequest naming what the library
    cannot honour (an unsupported keyword, a bad reference, ...). `lenient` (tool
    schemas) leaves such keywords unenforced instead (see tools.TOOL_OPTIONS)."""
    llg = _llg()
    options = TOOL_OPTIONS if lenient else JSON_OPTIONS
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(
            json.dumps(closed(schema)), overrides=options
        )
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"The JSON schema cannot be used: {exc}", param=param) from None
    check(grammar, param=param)
    return grammar


def any_json_object() -> str:
    """`response_format: {"type": "json_object"}`: any JSON object."""
    return from_json_schema({"type": "object"})


def from_lark(source: str, *, param: str) -> str:
    grammar = _llg().LLMatcher.grammar_from_lark(source)
    check(grammar, param=param)
    failed, notes = _llg().LLMatcher.validate_grammar_with_warnings(grammar)
    if notes and not failed:
        log.info("a tool schema is enforced in part: %s", "; ".join(notes))
    return grammar


def check(grammar: str, *, param: str) -> None:
    """InvalidRequest with llguidance's message when the grammar cannot be compiled."""
    error = _llg().LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequest(f"The schema or grammar is not supported: {error}", param=param)


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads from a tokenizer: every token's bytes, the
    special tokens, and a tokenize function (llguidance calls it with bytes)."""

    def __init__(self, model: Decoding) -> None:
        self.tokens, self.special_token_ids = model.vocab_bytes()
        info = model.info
        self.eos_token_id = min(info.eog_ids) if info.eog_ids else 0
        self.bos_token_id = info.bos_id
        self._tokenize = model.tokenize

    def __call__(self, data: bytes | str) -> list[int]:
        text = data.decode("utf-8", "ignore") if isinstance(data, bytes) else data
        return self._tokenize(text)


def tokenizer(model: Decoding) -> Any:
    """llguidance's tokenizer for a loaded model, built once per model (~1 s for a 50k
    vocabulary) on first use."""
    with _lock:
        cached = _tokenizers.get(model)
        if cached is None:
            llg = _llg()
            vocab = _Vocabulary(model)
            cached = llg.LLTokenizer(
                llg.TokenizerWrapper(vocab),
                n_vocab=model.info.n_vocab or len(vocab.tokens),
                eos_token=sorted(model.info.eog_ids) or None,
            )
            _tokenizers[model] = cached
        return cached


class Constraint:
    """One request's grammar state on one model."""

    def __init__(self, model: Decoding, grammar: str) -> None:
        llg = _llg()
        self._n_vocab = model.info.n_vocab
        self._matcher = llg.LLMatcher(tokenizer(model), grammar, log_level=0)
        if self._matcher.is_error():
            raise InvalidRequest(
                f"The schema or grammar is not supported: {self._matcher.get_error()}",
                param="response_format",
            )
        # the first token's mask, here: a schema that admits no value at all (a $ref
        # that only refers to itself) is the request's fault, said before it starts
        self._first: bytes | None = self._matcher.compute_bitmask()
        if self._matcher.is_error() or self._matcher.is_stopped():
            raise InvalidRequest(
                "The JSON schema or grammar admits no value at all (is there a $ref that "
                "only refers to itself?); check response_format and the tools' schemas.",
                param="response_format",
            )

    def allowed(self) -> np.ndarray:
        """A bool per token id: may it come next?"""
        first, self._first = self._first, None
        bits = np.frombuffer(first or self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[: self._n_vocab].view(np.bool_)
        self._raise_on_error()
        return allowed

    def accept(self, token: int) -> None:
        self._matcher.consume_token(token)
        self._raise_on_error()

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more."""
        return bool(self._matcher.is_stopped())

    def _raise_on_error(self) -> None:
        if self._matcher.is_error():
            # llguidance gives up on a grammar that grows without end (an object that
            # must contain itself); its message goes on with its whole internal state
            first = self._matcher.get_error().strip().splitlines()[0][:200]
            raise InvalidRequest(
                f"Decoding under the JSON schema or grammar failed ({first}); a schema "
                "that must contain itself admits no value: check response_format and the "
                "tools' schemas.",
                param="response_format",
            )
