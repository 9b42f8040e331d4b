"""A request's sampler chain on a llama.cpp model: llama.cpp's own samplers, in C, one
chain per sequence (logit bias, penalties over the last PENALTY_LAST_N tokens, then greedy,
or top-k / top-p / min-p / temperature and a seeded draw)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

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
