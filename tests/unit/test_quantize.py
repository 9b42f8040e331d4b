"""`localllm quantize` and `localllm eval` on the real starter model, through the real
quantizers (llama.cpp's in a child process, mlx-lm's) and a real store folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from localllm.backends.base import ModelRef
from localllm.cli import main
from localllm.config import load_settings
from localllm.engine.evaluate import heldout_text, load_for_eval, perplexity
from localllm.errors import QuantizeFailed
from localllm.models import quantize as q
from localllm.models.store import ModelStore
from tests.conftest import THREADS, loads_model

PPL_TOKENS = 2048  # 4 windows of 512, 1024 scored tokens: enough to order the types


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One store for the module: f16 from the starter, then q8_0 and q4_0 from that f16."""
    data = tmp_path_factory.mktemp("quantize-data")
    models = data / "models"
    store = ModelStore(models)
    f16 = q.quantize(q.plan_quantize(store.resolve("starter"), "f16", models_dir=models), models)
    for target in ("q8_0", "q4_0"):
        q.quantize(q.plan_quantize(f16.ref, target, models_dir=models), models)
    return data


@pytest.fixture
@loads_model
def shared(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the CLI at the module's store; return its models folder."""
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(data_dir))
    return data_dir / "models"


def entries(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir()) if models.is_dir() else []


def test_heldout_text_is_long_enough(starter_ref: ModelRef) -> None:
    model = load_for_eval(starter_ref, models_dir=Path("/nonexistent"), n_threads=THREADS)
    try:
        assert len(model.tokenize(heldout_text())) >= 20_000
    finally:
        model.close()


def test_each_quantization_loads_answers_and_shows_its_provenance(
    shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert entries(shared) == ["starter-f16", "starter-f16-q4_0", "starter-f16-q8_0"]
    for name in ("starter-f16", "starter-f16-q8_0", "starter-f16-q4_0"):
        args = ["run", "What is the capital of France?", "--model", name]
        assert main([*args, "--max-tokens", "8", "--temperature", "0"]) == 0
        assert capsys.readouterr().out.strip(), f"{name} gave no answer"
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert re.search(r"starter-f16-q4_0 +gguf .*Q4_0 .*store: q4_0 of starter-f16 \(20", listing)
    assert re.search(r"starter-f16 +gguf .*F16 .*store: f16 of starter \(", listing)
    assert main(["info", "starter-f16-q8_0"]) == 0
    info = capsys.readouterr().out
    assert "quantized from   starter-f16 (F16, " in info and "to q8_0 on 20" in info


def test_perplexity_orders_as_expected(shared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, text, ppl = ModelStore(shared), heldout_text(), {}
    for name in ("starter-f16", "starter-f16-q8_0", "starter-f16-q4_0"):
        model = load_for_eval(store.resolve(name), models_dir=shared, n_threads=THREADS)
        try:
            ppl[name] = perplexity(model, text, max_tokens=PPL_TOKENS)
        finally:
            model.close()
    f16, q8, q4 = (ppl[n].value for n in ("starter-f16", "starter-f16-q8_0", "starter-f16-q4_0"))
    assert ppl["starter-f16"].scored == 1024 and ppl["starter-f16"].windows == 4
    assert abs(q8 / f16 - 1) < 0.01, (f16, q8)
    assert q4 > f16 and q4 > q8, (f16, q8, q4)
    # the command prints the same figure
    assert main(["eval", "starter-f16-q4_0", "--tokens", str(PPL_TOKENS),
                 "--threads", str(THREADS)]) == 0
    out = capsys.readouterr().out
    assert f"perplexity {q4:.3f} over 1,024 tokens (4 windows of 512" in out


def test_quantize_command_reports_size_speed_and_perplexity(
    shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["quantize", "starter-f16", "--to", "q4_1", "--name", "report-q4_1"]
    assert main([*args, "--eval-tokens", "1024", "--threads", str(THREADS)]) == 0
    out = capsys.readouterr().out
    assert "starter-f16 (F16, 258.3 MiB) -> report-q4_1 (q4_1, about 93.8 MiB)" in out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("starter-f16 ", "report-q4_1 "))
    }
    assert rows["starter-f16"][1:4] == ["llamacpp", "F16", "258.3"]
    assert rows["report-q4_1"][1:4] == ["llamacpp", "Q4_1", "93.8"]
    assert float(rows["report-q4_1"][5]) > 0 and float(rows["starter-f16"][5]) > 0
    assert float(rows["report-q4_1"][6]) > float(rows["starter-f16"][6])  # perplexity
    assert "perplexity over 512 scored tokens of the held-out text" in out
    assert re.search(r"Scored the first 1,024 of its [\d,]+ tokens \(--eval-tokens all scores", out)
    (shared / "report-q4_1" / "report-q4_1.gguf").unlink()
    (shared / "report-q4_1" / "localllm.json").unlink()
    (shared / "report-q4_1").rmdir()


def test_k_quant_fallback_is_reported(shared: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["quantize", "starter-f16", "--to", "q4_k_m", "--name", "k-quant", "--no-report"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "tensors fall back to another type: K-quants need rows that are a multiple of 256" in out
    assert re.search(r"note: 180 of 272 tensors fall back", out)
    assert main(["info", "k-quant"]) == 0
    assert "180 of 272 tensors fell back" in capsys.readouterr().out


def test_requantizing_needs_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quantize", "starter", "--to", "q4_0"]) == 1
    err = capsys.readouterr().err
    assert "already quantized (Q4_1)" in err and "--allow-requantize" in err
    assert not load_settings().models_dir.exists() or entries(load_settings().models_dir) == []


def test_unknown_type_and_missing_source(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quantize", "starter", "--to", "q3_x"]) == 1
    assert "unknown type 'q3_x'; choose one of f16, q4_0" in capsys.readouterr().err
    assert main(["quantize", "no-such-model", "--to", "f16"]) == 2
    assert "Model 'no-such-model' was not found" in capsys.readouterr().err
    models = load_settings().models_dir
    assert not models.exists() or entries(models) == []


def test_unwritable_store_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("LOCALLLM_DATA_DIR", str(blocker / "data"))
    assert main(["quantize", "starter", "--to", "f16"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write to the store {blocker}/data/models" in err
    assert blocker.read_text() == "not a folder"


def test_too_little_disk_is_refused_with_the_numbers(
    starter_ref: ModelRef, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a full file system cannot be staged without root: the free space is reported as 10 MiB
    real = q.shutil.disk_usage
    monkeypatch.setattr(q.shutil, "disk_usage", lambda p: real(p)._replace(free=10 * 2**20))
    models = tmp_path / "models"
    with pytest.raises(QuantizeFailed) as err:
        q.plan_quantize(starter_ref, "f16", models_dir=models)
    assert "needs about 258.3 MiB and only 10.0 MiB is free" in err.value.message
    assert entries(models) == []


def _start(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "localllm", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )


def _wait_for_output(models: Path, proc: subprocess.Popen[bytes]) -> psutil.Process:
    """The quantizer child, once it has started writing its output."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(models.glob(".quantize-*/model/*.gguf")):
            children = psutil.Process(proc.pid).children()
            if children:
                return children[0]
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.01)
    raise AssertionError("the quantizer never started writing")


def test_a_killed_quantization_leaves_nothing_in_the_store(
    shared: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = entries(shared)
    proc = _start(["quantize", "starter-f16", "--to", "q5_k_m", "--name", "killed", "--no-report"])
    child = _wait_for_output(shared, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    child.wait(timeout=10)  # the quantizer dies with the command that started it
    assert [e for e in entries(shared) if not e.startswith(".")] == before
    assert main(["list"]) == 0
    assert "killed" not in capsys.readouterr().out
    leftovers = list(shared.glob(".quantize-killed-*"))
    assert leftovers, "the killed run's staging folder should still be there to sweep"
    assert q.sweep_stale(shared) == leftovers
    assert entries(shared) == before


def test_a_crashed_quantizer_is_reported_and_cleaned_up(shared: Path) -> None:
    before = entries(shared)
    proc = _start(["quantize", "starter-f16", "--to", "q5_k_m", "--name", "crashed"])
    child = _wait_for_output(shared, proc)
    child.send_signal(signal.SIGKILL)  # as a segfault in native code would end it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert b"Cannot quantize starter-f16: the worker process died (signal 9)" in err
    assert entries(shared) == before


def test_mlx_4bit_from_the_imported_starter_runs_on_mlx(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("mlx_lm")
    assert main(["quantize", "starter", "--to", "mlx-4bit", "--no-report"]) == 1
    assert "--allow-requantize" in capsys.readouterr().err
    args = ["quantize", "starter", "--to", "mlx-4bit", "--allow-requantize", "--no-report"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "-> starter-mlx-4bit (mlx-4bit, group size 64" in out
    assert "warning: requantizing Q4_1 to mlx-4bit" in out
    assert entries(load_settings().models_dir) == ["starter-mlx", "starter-mlx-4bit"]
    assert main(["info", "starter-mlx-4bit"]) == 0
    info = capsys.readouterr().out
    assert "mlx-4bit (group 64)" in info and "backend          mlx" in info
    assert "quantized from   starter (Q4_1, " in info and "(requantized)" in info
    run = ["run", "Say hello.", "--model", "starter-mlx-4bit", "--max-tokens", "4"]
    assert main([*run, "--temperature", "0", "--stats"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "generated 4 tokens" in captured.err


@pytest.mark.model
def test_eval_on_a_given_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "notes.txt"
    text.write_text(heldout_text()[:4000], encoding="utf-8")  # about 800 tokens: one window
    assert main(["eval", "starter", "--file", str(text), "--threads", str(THREADS)]) == 0
    out = capsys.readouterr().out
    assert re.search(
        rf"starter \(llamacpp, Q4_1\): perplexity \d+\.\d{{3}} over 256 tokens "
        rf"\(1 window of 512, second halves scored\) of {text}",
        out,
    ), out
    text.write_text("Too short to score.", encoding="utf-8")  # bad input: exit code 2
    assert main(["eval", "starter", "--file", str(text)]) == 2
    err = capsys.readouterr().err
    assert "perplexity needs at least one window of 512 tokens; the text gives 5" in err
    assert main(["eval", "starter", "--file", str(tmp_path / "missing.txt")]) == 2
    assert f"cannot read {tmp_path / 'missing.txt'} as UTF-8 text" in capsys.readouterr().err


def test_the_report_is_bounded_unless_asked_and_shows_progress_in_a_log(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What `quantize` and `eval` score by default, `all`, and progress where stderr is
    not a terminal (a line at every tenth, not a redrawn bar)."""
    from localllm.cli import build_parser
    from localllm.cli.common import DEFAULT_EVAL_TOKENS, bounded_note, progress_printer

    parser = build_parser()
    assert parser.parse_args(["eval", "m"]).tokens == DEFAULT_EVAL_TOKENS == 4096
    assert parser.parse_args(["eval", "m", "--tokens", "all"]).tokens is None
    q = parser.parse_args(["quantize", "m", "--to", "q4_0", "--eval-tokens", "ALL"])
    assert q.eval_tokens is None
    assert parser.parse_args(["quantize", "m", "--to", "q4_0"]).eval_tokens == 4096
    assert bounded_note(512, 33_500, 1024, "--tokens") == (
        "; the first 1,024 of its 33,500 tokens (--tokens all scores the whole)"
    )
    assert bounded_note(512, 900, 1024, "--tokens") == ""  # the whole text was read
    assert bounded_note(512, 33_500, None, "--tokens") == ""
    show = progress_printer("Evaluating starter", piped=True)
    assert show is not None  # pytest's stderr is not a terminal
    for i in range(41):
        show(i / 40)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"Evaluating starter: {p}%" for p in range(0, 101, 10)]
    assert progress_printer("Downloading") is None  # the others stay quiet in a log
