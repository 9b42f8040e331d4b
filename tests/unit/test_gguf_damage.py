"""Damaged and crafted GGUF headers: one line naming what is wrong, exit code 2, no
traceback, no llama.cpp output first; metadata nobody reads is skipped, whatever its size."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.cli import main
from localllm.errors import DamagedModel
from localllm.models.gguf import read_gguf

U8, U32, STR, ARR, U64 = 0, 4, 8, 9, 10


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return _s(key) + struct.pack("<I", vtype) + payload


def arr(etype: int, items: list[bytes]) -> bytes:
    return struct.pack("<IQ", etype, len(items)) + b"".join(items)


def gguf_file(path: Path, *kvs: bytes) -> Path:
    base = [kv("general.architecture", STR, _s("llama")),
            kv("llama.context_length", U32, struct.pack("<I", 2048))]
    extra_keys = {k[8:8 + struct.unpack_from("<Q", k)[0]] for k in kvs}
    kept = [b for b in base if b[8:8 + struct.unpack_from("<Q", b)[0]] not in extra_keys]
    body = [*kept, *kvs]
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(body)) + b"".join(body))
    return path


CASES = {
    "alignment-list": (
        kv("general.alignment", ARR, arr(U32, [struct.pack("<I", 32)] * 2)),
        "general.alignment is a list of 2, expected an integer",
    ),
    "alignment-odd": (kv("general.alignment", U32, struct.pack("<I", 24)), "power of two"),
    "ctx-string": (kv("llama.context_length", STR, _s("4096")),
                   "llama.context_length is a string, expected an integer"),
    "ctx-huge": (kv("llama.context_length", U32, struct.pack("<I", 2**32 - 1)),
                 "llama.context_length is 4294967295, out of range"),
    "tokens-int": (kv("tokenizer.ggml.tokens", U32, struct.pack("<I", 7)),
                   "tokenizer.ggml.tokens is an integer, expected a list"),
    "nested": (kv("tokenizer.ggml.tokens", ARR, arr(ARR, [arr(U8, [b"\x01"])])),
               "array of arrays"),
    "count-lie": (kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 2**62)),
                  "entries in the"),
    "name-int": (kv("general.name", U32, struct.pack("<I", 3)), "general.name is an integer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_crafted_headers_are_named_by_key(tmp_path: Path, case: str):
    entry, words = CASES[case]
    path = gguf_file(tmp_path / f"{case}.gguf", entry)
    with pytest.raises(DamagedModel) as err:
        read_gguf(path)
    assert words in err.value.message
    assert words in err.value.public_message and str(tmp_path) not in err.value.public_message


def test_info_says_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    path = gguf_file(tmp_path / "bad.gguf", CASES["ctx-string"][0])
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "llama.context_length is a string" in err


@pytest.mark.process
def test_run_refuses_before_llama_cpp_speaks(tmp_path: Path):
    path = gguf_file(tmp_path / "bad.gguf", CASES["alignment-list"][0])
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-m", "localllm", "run", "Hi", "--model", str(path),
                           "--max-tokens", "2"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "general.alignment is a list" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def test_metadata_nobody_reads_is_skipped_whatever_its_size(tmp_path: Path):
    blob = kv("vendor.blob", ARR, arr(U8, [b"\x00"] * 5_000_000))
    names = kv("vendor.names", ARR, arr(STR, [_s("x")] * 200_000))
    path = gguf_file(tmp_path / "big.gguf", blob, names)
    meta = read_gguf(path)
    assert meta.n_ctx_train == 2048 and meta.arch == "llama"


def test_a_truncated_file_is_refused_with_both_sizes(tmp_path: Path, starter_ref):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(starter_ref.path.read_bytes()[:30_000_000])
    env = {**os.environ, "LOCALLLM_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-m", "localllm", "run", "Hi", "--model", str(cut),
                           "--max-tokens", "2"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated" in lines[0] and "30,000,000" in lines[0], lines
