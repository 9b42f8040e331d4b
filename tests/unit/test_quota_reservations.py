"""A key's daily token quota is spent only once: requests are admitted against what is
left after what running requests hold, their answers cut to fit, and what they held is
given back when they end (the server-level test is test_security's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.engine.accounting import Accounting
from localllm.errors import QuotaExceeded


@pytest.fixture
def accounting(tmp_path: Path):
    acc = Accounting(tmp_path / "gateway.sqlite3")
    acc.add_key("small", tokens_per_day=100)
    acc.add_key("free")
    yield acc
    acc.close()


def test_the_answer_is_cut_to_what_is_left_and_held_until_settled(accounting: Accounting):
    assert accounting.reserve("small", 10, 1000) == (90, 100)  # the answer cut to 90
    with pytest.raises(QuotaExceeded) as err:  # everything is held by the first
        accounting.reserve("small", 10, 5)
    assert "has 0 of its 100 tokens" in err.value.message and "100 held" in err.value.message
    assert err.value.status == 429 and err.value.retry_after >= 1
    accounting.record("small", 10, 0, 30, 1.0)  # it used 40 of them
    accounting.settle("small", 100)
    assert accounting.reserve("small", 10, 20) == (20, 30)  # 60 left: asked for less
    assert accounting.reserve("small", 10, None) == (20, 30)  # no limit asked: what's left
    with pytest.raises(QuotaExceeded) as err:
        accounting.reserve("small", 10, None)
    assert "40 used, 60 held" in err.value.message


def test_a_prompt_that_does_not_fit_what_is_left_is_refused(accounting: Accounting):
    with pytest.raises(QuotaExceeded) as err:
        accounting.reserve("small", 100, 1)
    assert "this prompt is 100 tokens" in err.value.message


def test_keys_without_a_quota_and_unknown_clients_are_not_limited(accounting: Accounting):
    assert accounting.reserve("free", 10_000, 500) == (500, 0)
    assert accounting.reserve("anonymous", 10_000, None) == (None, 0)
    accounting.settle("anonymous", 0)  # nothing held, nothing to give back
