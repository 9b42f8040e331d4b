"""The docs stay true to the code: the reference pages (CLI, settings, HTTP API) are
generated from the parser, the settings and the OpenAPI schema, and a page that is out
of date fails here (`make docs` writes them again); every setting says what it means;
the README stays a front door."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _reference():
    spec = importlib.util.spec_from_file_location("reference", ROOT / ".ci" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["cli.md", "settings.md", "http.md"])
def test_each_generated_reference_page_is_current(page: str):
    reference = _reference()
    path = ROOT / "docs" / "reference" / page
    assert path.read_text() == reference.PAGES[page](), (
        f"docs/reference/{page} is out of date: run `make docs`"
    )


def test_every_setting_and_command_is_in_the_reference():
    from localllm.cli import build_parser
    from localllm.config import Settings

    reference = _reference()
    settings = reference.settings_page()
    for field in dataclasses.fields(Settings):
        assert f"| `{field.name}` | `LOCALLLM_{field.name.upper()}` |" in settings
    cli = reference.cli_page()
    for name in build_parser().command_names:
        assert f"## `localllm {name}`" in cli
    assert "| <code>--eval-tokens N&#124;all</code> |" in cli  # a subcommand's flag
    http = reference.http_page()
    assert "## `POST /v1/chat/completions`" in http and "## `POST /infill`" in http


def test_every_setting_says_what_it_means():
    from localllm.config import Settings
    from localllm.config_doc import DYNAMIC_DEFAULTS, MEANING

    names = {f.name for f in dataclasses.fields(Settings)}
    assert set(MEANING) == names, (names - set(MEANING), set(MEANING) - names)
    assert set(DYNAMIC_DEFAULTS) <= names
    assert all(text.strip() for text in MEANING.values())


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 300
    assert "make run" in text and "make test" in text
    for link in ("docs/index.md", "docs/benchmarks.md", "docs/reference/cli.md"):
        assert f"]({link})" in text and (ROOT / link).exists()
