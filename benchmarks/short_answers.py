"""Short questions with checkable answers: what a newcomer asks first. Each prompt comes
with a regular expression a right answer matches (case-insensitive, anywhere in the
answer). Used by bench_starter_sampling to score sampling candidates on short answers
beside its long-form loop set."""

from __future__ import annotations

import re

ONE_WORD = " Answer in one word."

SHORT: list[tuple[str, str, str]] = [
    # (kind, prompt, a right answer matches)
    ("capital", "What is the capital of France?" + ONE_WORD, r"\bparis\b"),
    ("capital", "What is the capital of France?", r"\bparis\b"),
    ("capital", "What is the capital of Japan?" + ONE_WORD, r"\btokyo\b"),
    ("capital", "What is the capital of Italy?" + ONE_WORD, r"\brome\b"),
    ("capital", "What is the capital of Germany?" + ONE_WORD, r"\bberlin\b"),
    ("capital", "What is the capital of Spain?" + ONE_WORD, r"\bmadrid\b"),
    ("capital", "What is the capital of England?" + ONE_WORD, r"\blondon\b"),
    ("capital", "What is the capital of Russia?" + ONE_WORD, r"\bmoscow\b"),
    ("capital", "What is the capital of Egypt?" + ONE_WORD, r"\bcairo\b"),
    ("arithmetic", "What is 2+2?", r"\b4\b|\bfour\b"),
    ("arithmetic", "What is 3 + 5? Reply with the number only.", r"\b8\b"),
    ("arithmetic", "What is 10 - 3? Reply with the number only.", r"\b7\b"),
    ("arithmetic", "What is 6 times 7? Reply with the number only.", r"\b42\b"),
    ("arithmetic", "What is 9 + 10? Reply with the number only.", r"\b19\b"),
    ("arithmetic", "What is 5 times 5? Reply with the number only.", r"\b25\b"),
    ("arithmetic", "What is 100 minus 1? Reply with the number only.", r"\b99\b"),
    ("arithmetic", "What is 2 times 3? Reply with the number only.", r"\b6\b"),
    ("arithmetic", "How many days are there in a week?", r"\b7\b|\bseven\b"),
    ("arithmetic", "How many legs does a spider have?", r"\b8\b|\beight\b"),
    ("definition", "What is the opposite of hot?" + ONE_WORD, r"\bcold\b"),
    ("definition", "What colour is the sky on a clear day?" + ONE_WORD, r"\bblue\b"),
    ("definition", "Which animal says moo?" + ONE_WORD, r"\bcows?\b"),
    ("definition", "What is frozen water called?" + ONE_WORD, r"\bice\b"),
    ("definition", "What do bees make?" + ONE_WORD, r"\bhoney\b"),
    ("definition", "What is the largest planet in our solar system?" + ONE_WORD, r"jupiter"),
    ("definition", "What is the opposite of up?" + ONE_WORD, r"\bdown\b"),
    ("definition", "What is a baby cat called?" + ONE_WORD, r"\bkitten"),
    ("definition", "What star is at the centre of our solar system?" + ONE_WORD, r"\bsun\b"),
    ("word", "Reply with the single word banana.", r"\bbanana\b"),
    ("word", "Reply with the single word yes.", r"\byes\b"),
    ("word", "Reply with the single word hello.", r"\bhello\b"),
    ("word", "Reply with the single word green.", r"\bgreen\b"),
    ("word", "Reply with the single word ready.", r"\bready\b"),
    ("word", "Reply with the single word ocean.", r"\bocean\b"),
    ("word", "Say only the word OK.", r"\bok\b"),
    ("word", "Repeat after me: good morning", r"good morning"),
    ("code", "Write a Python expression that reverses a string s.", r"s\[::-1\]|reversed\(s\)"),
    ("code", "Which Python function gives the length of a list?" + ONE_WORD, r"\blen\b"),
    ("code", "Which keyword defines a function in Python?" + ONE_WORD, r"\bdef\b"),
    ("code", "Write one line of Python that prints hello.", r"print\(\s*['\"]hello"),
    ("code", "How do you import the math module in Python?", r"import math"),
    ("code", "Which Python operator gives the remainder of a division?", r"%|modulo"),
]


def right(answer: str, pattern: str) -> bool:
    return re.search(pattern, answer, re.IGNORECASE) is not None
