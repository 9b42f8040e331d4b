"""JSON text from outside (a model's tool call, a client's arguments, a remote engine):
parsed with one rule for what is not JSON.

`json.loads` raises RecursionError, not ValueError, for arrays or objects nested deeper
than Python's stack allows ("[" * 100_000 is 100 KB): every caller that reads text it did
not write catches ValueError, so that text would have been a 500. Here it is a ValueError
(a json.JSONDecodeError) like any other text that is not JSON.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes | bytearray) -> Any:
    """json.loads, with nesting past Python's stack a JSONDecodeError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None


_DECODER = json.JSONDecoder()


def raw_decode(text: str, at: int = 0) -> tuple[Any, int]:
    """The JSON value starting at `at` and where it ends (JSONDecoder.raw_decode), with
    nesting past Python's stack a JSONDecodeError."""
    try:
        return _DECODER.raw_decode(text, at)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", "", 0) from None
