"""Finding a model's projector (mmproj) beside it, and what it reads, from its header."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.errors import DamagedModel
from localllm.models import projector
from localllm.models.gguf import projector_kinds
from tests.gguf_fixtures import tiny_projector


def _touch(folder: Path, *names: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"GGUF")


def test_a_folder_of_one_model_takes_any_projector_there(tmp_path: Path) -> None:
    _touch(tmp_path / "m", "m-Q4_K_M.gguf", "mmproj-model-q8_0.gguf", "mmproj-model-f16.gguf")
    found = projector.beside(tmp_path / "m" / "m-Q4_K_M.gguf")
    assert found == tmp_path / "m" / "mmproj-model-f16.gguf"
    _touch(tmp_path / "n", "n.gguf")
    assert projector.beside(tmp_path / "n" / "n.gguf") is None


def test_a_folder_of_several_models_takes_only_one_named_for_it(tmp_path: Path) -> None:
    _touch(tmp_path, "llava.gguf", "other.gguf", "llava.mmproj.gguf", "mmproj-x.gguf")
    assert projector.beside(tmp_path / "llava.gguf") == tmp_path / "llava.mmproj.gguf"
    assert projector.beside(tmp_path / "other.gguf") is None
    # a split model's shards are one model
    _touch(tmp_path / "s", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "mmproj.gguf")
    assert projector.beside(tmp_path / "s" / "big-00001-of-00002.gguf") is not None


def test_what_a_projector_reads_comes_from_its_header(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    path = tiny_projector(tmp_path / "m" / "mmproj.gguf")
    assert projector_kinds(path) == frozenset({"image"})
    _touch(tmp_path / "m", "model.gguf")
    assert projector.kinds(tmp_path / "m" / "model.gguf") == frozenset({"image"})
    (tmp_path / "bad.gguf").write_bytes(b"nope")
    with pytest.raises(DamagedModel):
        projector_kinds(tmp_path / "bad.gguf")


def test_the_projector_counts_in_the_memory_estimate(tmp_path: Path) -> None:
    from localllm.backends.base import ModelRef
    from localllm.models import fit
    from localllm.models.starter import starter_path
    from tests.gguf_fixtures import vision_folder

    starter = starter_path()
    assert starter is not None
    folder = vision_folder(tmp_path / "models")
    plain = fit.estimate(ModelRef("starter", Path(starter), "gguf", "starter"), 1024)
    seer = fit.estimate(ModelRef("seer", folder / "SmolLM2-135M-Instruct.Q4_1.gguf", "gguf",
                                 "store"), 1024)
    proj = (folder / "mmproj-seer-f16.gguf").stat().st_size
    assert seer.weights == plain.weights + proj and seer.kv == plain.kv


def test_a_projector_named_with_mmproj_counts_for_the_default_model(tmp_path: Path) -> None:
    from localllm.config import Settings
    from localllm.engine.load_plan import Planner
    from localllm.models.store import ModelStore
    from tests.gguf_fixtures import tiny_projector

    proj = tiny_projector(tmp_path / "proj.gguf")
    store = ModelStore(tmp_path / "models", hf_cache=tmp_path / "hf")
    plain = Planner(Settings(data_dir=tmp_path / "d"), store)
    named = Planner(Settings(data_dir=tmp_path / "d", mmproj=str(proj)), store)
    starter = store.resolve("starter")
    assert named.mmproj_for(starter) == str(proj)
    assert plain.mmproj_for(starter) is None
    grown = named.plan(starter, 1024).need.weights - plain.plan(starter, 1024).need.weights
    assert grown == proj.stat().st_size
