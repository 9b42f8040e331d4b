"""Speculative decoding over the wire: a per-request mode, its figures in `usage`."""

from __future__ import annotations

import openai
import pytest

from tests.backends.test_speculative import EDIT
from tests.conftest import ServerProcess


@pytest.fixture
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)


def ask(client: openai.OpenAI, mode: str):
    return client.chat.completions.create(
        model="starter",
        messages=[{"role": "user", "content": EDIT}],
        temperature=0,
        max_tokens=32,
        # plain greedy: under the starter's default repeat penalty this answer ends near
        # 32 tokens, sooner or later with the cache's state (the batch's numerics)
        extra_body={"speculate": mode, "repeat_penalty": 1.0},
    )


def test_lookup_reports_its_drafts_in_usage_and_changes_nothing(client: openai.OpenAI):
    plain = ask(client, "off")
    spec = ask(client, "lookup")
    assert spec.choices[0].message.content == plain.choices[0].message.content
    assert plain.usage is not None and "speculative" not in (plain.usage.model_extra or {})
    assert spec.usage is not None and plain.usage.completion_tokens == 32
    assert spec.usage.completion_tokens == 32
    figures = (spec.usage.model_extra or {})["speculative"]
    assert figures["proposed_tokens"] > 0 and figures["accepted_tokens"] > 0
    assert figures["accepted_tokens"] <= figures["proposed_tokens"]
    assert figures["acceptance"] == pytest.approx(
        figures["accepted_tokens"] / figures["proposed_tokens"], abs=1e-4
    )


def test_an_unknown_mode_is_a_clear_400(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, "always")
    assert err.value.status_code == 400
    assert "speculate" in str(err.value)


def test_draft_mode_without_a_draft_model_says_so(client: openai.OpenAI):
    with pytest.raises(openai.BadRequestError) as err:
        ask(client, "draft")
    assert "speculate 'draft' needs a draft model" in str(err.value)
