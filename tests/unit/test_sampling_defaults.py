"""Recommended sampling per model: GGUF general.sampling.*, an MLX folder's
generation_config.json, the starter's model card; a request's own values always win."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.backends.base import Message, ModelRef, SamplingParams
from localllm.config import Settings
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.models.gguf import read_meta
from localllm.models.sampling import STARTER_SAMPLING, recommended
from localllm.models.store import ModelStore
from tests.conftest import THREADS
from tests.gguf_fixtures import copy_with_metadata

RECOMMENDED = {"general.sampling.temp": 0.25, "general.sampling.top_k": 20,
               "general.sampling.top_p": 0.5, "general.sampling.penalty_repeat": 99.0}


def staged(starter_ref: ModelRef, tmp: Path) -> ModelRef:
    path = copy_with_metadata(starter_ref.path, tmp / "tuned.gguf", RECOMMENDED)
    return ModelRef("tuned", path, "gguf", "path", path.stat().st_size)


def test_what_each_format_recommends(starter_ref: ModelRef, tmp_path: Path):
    ref = staged(starter_ref, tmp_path)
    meta = read_meta(ref.path, "gguf")
    # a repeat penalty of 99 is out of range: left out, the model still loads
    assert dict(meta.sampling) == {"temperature": 0.25, "top_k": 20.0, "top_p": 0.5}
    assert recommended(ref).source == "GGUF general.sampling.*"
    assert recommended(starter_ref).values == STARTER_SAMPLING
    assert "model card" in str(recommended(starter_ref).source)
    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "generation_config.json").write_text(
        json.dumps({"temperature": 0.6, "top_p": 0.95, "repetition_penalty": 1.1}))
    mlx = ModelRef("m", folder, "mlx", "path")
    assert recommended(mlx).values == {"temperature": 0.6, "top_p": 0.95,
                                       "repeat_penalty": 1.1}
    assert recommended(mlx).source == "generation_config.json"
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": False,
                                                               "temperature": 0.6}))
    assert recommended(mlx).values == {}  # greedy by HF's rule: nothing to recommend


def test_a_request_s_own_values_win():
    rec = {"temperature": 0.25, "top_k": 20.0}
    asked = SamplingParams.asked(temperature=0.9, max_tokens=5).with_defaults(rec)
    assert (asked.temperature, asked.top_k, asked.max_tokens) == (0.9, 20, 5)
    assert isinstance(asked.top_k, int)
    built = SamplingParams(temperature=0.8).with_defaults(rec)  # built directly: all its own
    assert built.temperature == 0.8 and built.top_k == 40


def test_the_engine_applies_them(starter_ref: ModelRef, tmp_path: Path):
    ref = staged(starter_ref, tmp_path)
    settings = Settings(n_threads=THREADS, n_ctx=512, data_dir=tmp_path / "d",
                        cache_dir=tmp_path / "c")
    engine = Engine(settings, ModelStore(settings.models_dir, hf_cache=tmp_path / "hf"))
    seen: list[SamplingParams] = []
    engine.observers.append(lambda request, model, final, s: seen.append(request.params))
    try:
        engine.load(ref)
        ask = [Message("user", "Hi")]
        for params in (SamplingParams.asked(max_tokens=2),
                       SamplingParams.asked(max_tokens=2, temperature=0.7, top_k=3)):
            list(engine.generate(Request(params, messages=ask)))
        assert engine.status().sampling.values["temperature"] == 0.25
    finally:
        engine.close()
    assert (seen[0].temperature, seen[0].top_k, seen[0].top_p) == (0.25, 20, 0.5)
    assert (seen[1].temperature, seen[1].top_k, seen[1].top_p) == (0.7, 3, 0.5)


def test_show_and_info_say_where_each_value_came_from(starter_ref: ModelRef, tmp_path: Path):
    ref = staged(starter_ref, tmp_path)
    env = {"PATH": "/usr/bin:/bin", "LOCALLLM_CONFIG": str(tmp_path / "none.toml"),
           "LOCALLLM_DATA_DIR": str(tmp_path / "d"), "HOME": str(tmp_path)}

    def cli(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "localllm", *args], env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    shown = cli("show", str(ref.path), "--parameters").splitlines()
    assert "temperature 0.25  # GGUF general.sampling.*" in shown
    assert "min_p 0.05" in shown  # not recommended: localllm's default, no source
    info = json.loads(cli("info", str(ref.path), "--json"))
    assert info["sampling"] == {"recommended": {"temperature": 0.25, "top_k": 20.0,
                                                "top_p": 0.5},
                                "source": "GGUF general.sampling.*"}
    assert ("temperature 0.2, top_p 0.9, repeat_penalty 1.1, penalize_prompt false from "
            "SmolLM2's model card" in cli("info", "starter"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_newcomers_first_question_is_answered_right_with_the_defaults(
    starter_ref: ModelRef, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], seed: int,
):
    """`localllm run` with nothing but the question (and a seed, so the test is the same
    every time): the starter's defaults must not stop it answering in the question's own
    words. With the penalty over the prompt too, the answer was "The answer to this
    classic French question requires a bit of creative thinking"."""
    from localllm.cli import main

    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("LOCALLLM_CONFIG", str(tmp_path / "none.toml"))
    question = "What is the capital of France? Answer in one word."
    assert main(["run", question, "--seed", str(seed), "--max-tokens", "16",
                 "--threads", str(THREADS)]) == 0
    assert "Paris" in capsys.readouterr().out


def test_the_penalty_reads_the_answer_only_when_the_defaults_say_so():
    rec = dict(STARTER_SAMPLING)
    params = SamplingParams.asked(max_tokens=4).with_defaults(rec)
    assert params.repeat_penalty == 1.1 and params.penalize_prompt is False
    own = SamplingParams.asked(max_tokens=4, penalize_prompt=True).with_defaults(rec)
    assert own.penalize_prompt is True  # a caller's own choice wins, as for every field
