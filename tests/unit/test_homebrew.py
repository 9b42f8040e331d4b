"""packaging/homebrew/localllm.rb: a virtualenv formula whose resources are every
dependency localllm installs, with a `service do` block for `brew services`. Checked with
`ruby -c`, and by loading it under a stand-in for Homebrew's formula DSL, where ruby is
present; its resources against the installed dependency tree everywhere."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FORMULA = ROOT / "packaging" / "homebrew" / "localllm.rb"
FORMULAS = {"numpy", "certifi", "pillow"}  # Homebrew formulas the formula depends on instead
VENV = {"pip", "setuptools", "wheel"}  # every virtualenv has them

# Just enough of Homebrew's DSL to load the formula and report what it declares.
STAND_IN = r"""
require "json"
module Language; module Python; module Virtualenv; end; end; end
class Formula
  @@facts = { "resources" => [], "depends_on" => [] }
  def self.facts = @@facts
  %w[desc homepage license].each do |name|
    define_singleton_method(name) { |value| @@facts[name] = value }
  end
  def self.head(url, **opts) = @@facts["head"] = url
  def self.depends_on(spec) = @@facts["depends_on"] << (spec.is_a?(Hash) ? spec.keys.first : spec)
  def self.resource(name, &block)
    r = Object.new
    def r.url(value) = @url = value
    def r.sha256(value) = @sha = value
    r.instance_eval(&block)
    @@facts["resources"] << { "name" => name, "url" => r.instance_variable_get(:@url),
                              "sha256" => r.instance_variable_get(:@sha) }
  end
  def self.service(&block) = @@facts["service"] = true
  def self.test(&block) = @@facts["test"] = true
end
load ARGV[0]
facts = Formula.facts
facts["methods"] = Localllm.instance_methods(false).map(&:to_s).sort
puts JSON.generate(facts)
"""


def runtime_closure() -> set[str]:
    """The canonical names of everything `pip install localllm` installs here."""
    seen: set[str] = set()
    todo = ["localllm"]
    while todo:
        name = canon(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in distribution(name).requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen - {"localllm"}


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.process
def test_formula_declares_every_dependency_and_a_service(tmp_path: Path):
    text = FORMULA.read_text()
    assert "include Language::Python::Virtualenv" in text
    assert "virtualenv_install_with_resources" in text
    assert 'run [opt_bin/"localllm", "serve"]' in text
    names = set(re.findall(r'resource "([^"]+)" do', text))
    missing = runtime_closure() - FORMULAS - VENV - names
    assert not missing, f"rerun packaging/homebrew/update_resources.py: {sorted(missing)}"
    for block in re.findall(r'resource "[^"]+" do\n(.*?)\n  end', text, re.S):
        url, sha = re.findall(r'(?:url|sha256) "([^"]+)"', block)
        assert url.startswith("https://files.pythonhosted.org/") and url.endswith(
            (".tar.gz", ".zip")), url
        assert re.fullmatch(r"[0-9a-f]{64}", sha)
    if shutil.which("ruby") is None:
        pytest.skip("ruby is not installed: the DSL load and `ruby -c` were not run")
    syntax = subprocess.run(["ruby", "-c", str(FORMULA)], capture_output=True, text=True)
    assert syntax.returncode == 0 and "Syntax OK" in syntax.stdout, syntax.stderr
    script = tmp_path / "stand_in.rb"
    script.write_text(STAND_IN)
    loaded = subprocess.run(["ruby", str(script), str(FORMULA)], capture_output=True,
                            text=True, timeout=60)
    assert loaded.returncode == 0, loaded.stderr
    facts = json.loads(loaded.stdout)
    assert facts["license"] == "Apache-2.0" and facts["head"].endswith(".git")
    assert {"cmake", "rust", "python@3.12"} <= set(facts["depends_on"])
    assert set(facts["depends_on"]) >= FORMULAS
    assert {r["name"] for r in facts["resources"]} == names
    assert facts["service"] is True and facts["test"] is True
    assert {"install", "caveats"} <= set(facts["methods"])
