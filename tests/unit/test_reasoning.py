"""Splitting a reply's think block from its answer, however the stream cuts it."""

from __future__ import annotations

import pytest

from localllm.backends.reasoning import ReasoningSplitter, mode_for, split, without_reasoning

REPLY = "<think>\nThe user greets me.\n</think>\n\nHello! Use <think> tags like this."


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_any_cut_gives_the_same_split(size: int):
    s = ReasoningSplitter("tags")
    reasoning = answer = ""
    for piece in pieces(REPLY, size):
        r, a = s.feed(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = s.close()
    assert (reasoning + r).strip() == "The user greets me."
    assert answer + a == "Hello! Use <think> tags like this."  # a later tag is text


def test_modes():
    assert split("thinking...</think>Answer", "open") == ("thinking...", "Answer")
    assert split("still thinking when cut off", "open") == ("still thinking when cut off", "")
    assert split("Plain answer", "tags") == ("", "Plain answer")
    assert split("<think>x</think>y", None) == ("", "<think>x</think>y")  # no thinking model
    assert mode_for("{{ '<think>' }}", "<|im_start|>assistant\n<think>\n") == "open"
    assert mode_for("... '<think>' ...", "<|im_start|>assistant\n") == "tags"
    assert mode_for("no tags", "<|im_start|>assistant\n") is None


def test_the_next_prompt_leaves_reasoning_out():
    assert without_reasoning(REPLY) == "Hello! Use <think> tags like this."
    assert without_reasoning("no reasoning here") == "no reasoning here"
