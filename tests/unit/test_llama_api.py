"""The llama.cpp functions localllm calls are declared in one place and checked at import."""

from __future__ import annotations

import types

import llama_cpp
import pytest

from localllm.backends import llama_api
from localllm.errors import BackendUnavailable


def test_the_installed_llama_cpp_python_matches_the_declarations() -> None:
    assert llama_api.mismatches(llama_cpp) == []
    assert len(llama_api.FUNCTIONS) > 60 and "llama_decode" in llama_api.FUNCTIONS


def test_a_renamed_or_reshaped_function_fails_the_import_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a llama-cpp-python bump that changes the C API looks like: one error, at the
    first load, that names every difference."""
    fake = types.SimpleNamespace(**{n: getattr(llama_cpp, n) for n in llama_api.NAMES})
    del fake.llama_memory_seq_rm  # renamed upstream
    decode = llama_cpp.llama_decode

    reshaped = types.SimpleNamespace(argtypes=[*decode.argtypes, object])  # an argument more
    fake.llama_decode = reshaped
    fake.__version__ = "9.9.9"
    assert llama_api.mismatches(fake) == [
        "llama_memory_seq_rm is missing",
        f"llama_decode takes {len(decode.argtypes) + 1} arguments, not {len(decode.argtypes)}",
    ]
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp", fake)
    with pytest.raises(BackendUnavailable) as err:
        llama_api.load()
    assert "llama-cpp-python 9.9.9" in err.value.message
    assert "llama_memory_seq_rm is missing" in err.value.message


def test_every_function_the_backend_calls_is_declared() -> None:
    """A call in the backend to a function not declared would escape the check."""
    import re
    from pathlib import Path

    import localllm.backends.llamacpp as backend

    source = Path(backend.__file__).read_text(encoding="utf-8")
    called = set(re.findall(r"\b_?ll\.(llama_[a-z_0-9]+|LLAMA_[A-Z_]+)", source))
    assert called and called <= set(llama_api.NAMES), called - set(llama_api.NAMES)
