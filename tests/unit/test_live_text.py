"""Where a streaming answer's open Markdown block starts, and the redraw pacer's clock."""

from __future__ import annotations

import pytest

from localllm.tui.live import open_block, shown_text
from localllm.tui.pacing import RedrawPacer


@pytest.mark.parametrize(
    ("text", "closed", "code"),
    [
        ("Once upon a", "", False),
        ("One.\n\nTwo", "One.\n\n", False),
        ("One.\n\nTwo.\n\n", "One.\n\nTwo.\n\n", False),
        ("A list:\n- a\n- b", "", False),  # no blank line yet: one open block
        ("Intro.\n\n```python\nprint(1)\n", "Intro.\n\n", True),
        ("```python\nx = 1\n\ny = 2\n", "", True),  # a blank line inside code closes nothing
        ("```python\nx = 1\n```\nAfter", "```python\nx = 1\n```\n", False),
        ("```\nx\n``` not a close\n", "", True),  # text after a closing fence: still code
        ("~~~\nx\n```\n", "", True),  # a fence closes only with its own kind
        ("````\n```\nx\n````\n", "````\n```\nx\n````\n", False),  # ... and length
        ("Text ```inline``` here\n\nMore", "Text ```inline``` here\n\n", False),
        ("```pyth", "", False),  # a fence line not yet ended is not a code block yet
    ],
)
def test_the_open_block(text: str, closed: str, code: bool) -> None:
    start, in_code = open_block(text)
    assert (text[:start], in_code) == (closed, code)


def test_a_code_block_is_shown_without_its_fence() -> None:
    assert shown_text("```python\nprint(1)\n", True) == "print(1)"
    assert shown_text("```python", True) == ""
    assert shown_text("Words and\n\nmore\n", False) == "Words and\n\nmore"


def test_the_pacer_draws_at_once_then_every_interval() -> None:
    now = [100.0]
    pacer = RedrawPacer(interval=0.1, clock=lambda: now[0])
    assert pacer.wait() == 0.0  # a new answer's first piece is due at once
    pacer.drawn()
    assert pacer.wait() == pytest.approx(0.1)
    now[0] += 0.04
    assert pacer.wait() == pytest.approx(0.06)
    now[0] += 0.06
    assert pacer.wait() == 0.0
    pacer.drawn()
    assert pacer.redraws == 2
    pacer.start()  # the next answer
    assert pacer.wait() == 0.0 and pacer.redraws == 0
