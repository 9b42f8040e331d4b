"""A request's sampler chain on a llama.cpp model: llama.cpp's own samplers, in C, one
chain per sequence (logit bias, penalties over the last PENALTY_LAST_N tokens, then greedy,
or top-k / top-p / min-p / temperature and a seeded draw)."""

from __future__ import annotations

import ctypes
import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from localllm.backends.base import SamplingParams
from localllm.backends.common import penalties
from localllm.backends.llama_api import LlamaApi

PENALTY_LAST_N = 64


def sampler_chain(ll: LlamaApi, vocab: Any, params: SamplingParams, history: Sequence[int]) -> Any:
    """The chain for `params`, its penalties primed with the end of `history`."""
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    add = ll.llama_sampler_chain_add
    n_vocab = ll.llama_vocab_n_tokens(vocab)
    if params.logit_bias:
        biases = (ll.llama_logit_bias * len(params.logit_bias))()
        for i, (tok, bias) in enumerate(params.logit_bias):
            biases[i].token, biases[i].bias = tok, bias
        add(chain, ll.llama_sampler_init_logit_bias(n_vocab, len(biases), biases))
    penalized = penalties(params)
    if penalized:
        add(
            chain,
            ll.llama_sampler_init_penalties(
                n_vocab,
                PENALTY_LAST_N,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            ),
        )
    if params.temperature <= 0:
        add(chain, ll.llama_sampler_init_greedy())
    else:
        if params.top_k > 0:
            add(chain, ll.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(chain, ll.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(chain, ll.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, ll.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        add(chain, ll.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    if penalized:
        for tok in history[-PENALTY_LAST_N:]:
            ll.llama_sampler_accept(chain, tok)
    return chain


# llama_token_data as numpy lays it out: (id int32, logit float, p float), 12 bytes
TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def sample_row(ll: LlamaApi, chain: Any, logits: Any, allowed: Any = None) -> int:
    """Sample a token from a row of logits held here, not in the context, and accept it:
    what llama_sampler_sample does with a row of the context's (every token a candidate,
    the chain applied, the choice accepted), so the same chain picks the same token from
    the same numbers. `allowed` rules out the tokens it marks False; `logits` is not
    changed."""
    cand = np.empty(len(logits), TOKEN_DATA)
    cand["id"] = np.arange(len(logits), dtype=np.int32)
    cand["logit"] = logits
    cand["p"] = 0.0
    if allowed is not None:
        cand["logit"][~allowed] = -np.inf
    data = cand.ctypes.data_as(ctypes.POINTER(ll.llama_token_data))
    array = ll.llama_token_data_array(data, len(cand), -1, False)
    ll.llama_sampler_apply(chain, ctypes.byref(array))
    if not 0 <= array.selected < array.size:
        raise RuntimeError(f"the sampler chain selected candidate {array.selected} of {array.size}")
    token = int(array.data[array.selected].id)
    ll.llama_sampler_accept(chain, token)
    return token
