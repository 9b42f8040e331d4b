"""Rewrite the `resource` blocks of localllm.rb from what pip resolves for this checkout.

    python packaging/homebrew/update_resources.py

Each dependency is pinned to the version pip picks (`pip install --dry-run --report`),
with the URL and SHA-256 of its source distribution from PyPI's JSON simple API, as
`brew update-python-resources` would write them. Packages Homebrew ships as formulas of
their own (listed in FORMULAS) are depended on instead. Needs network access to PyPI.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FORMULA = HERE / "localllm.rb"
FORMULAS = {"numpy", "certifi", "pillow"}  # `depends_on` in the formula, not resources
SKIP = {"localllm", "pip", "setuptools", "wheel"}
BEGIN, END = "  # resources: begin", "  # resources: end"


def resolved() -> list[tuple[str, str]]:
    """(name, version) of every package pip would install for this checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
             "--quiet", "--report", str(report), str(ROOT)],
            check=True,
        )
        rows = json.loads(report.read_text())["install"]
    found = {(r["metadata"]["name"], r["metadata"]["version"]) for r in rows}
    return sorted(
        ((n, v) for n, v in found if canonical(n) not in SKIP | FORMULAS),
        key=lambda nv: canonical(nv[0]),
    )


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sdist(name: str, version: str) -> tuple[str, str]:
    """The URL and SHA-256 of a release's source distribution on PyPI."""
    request = urllib.request.Request(
        f"https://pypi.org/simple/{canonical(name)}/",
        headers={"Accept": "application/vnd.pypi.simple.v1+json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        files = json.load(reply)["files"]
    for f in files:
        filename = f["filename"]
        base = filename.removesuffix(".tar.gz").removesuffix(".zip")
        if base == filename or f.get("yanked"):
            continue  # a wheel, or withdrawn
        stem, _, release = base.rpartition("-")
        if canonical(stem) == canonical(name) and release == version:
            return f["url"], f["hashes"]["sha256"]
    raise SystemExit(f"{name} {version} has no source distribution on PyPI")


def blocks(packages: list[tuple[str, str]]) -> str:
    out = []
    for name, version in packages:
        url, sha = sdist(name, version)
        out.append(f'  resource "{canonical(name)}" do\n    url "{url}"\n'
                   f'    sha256 "{sha}"\n  end\n')
    return "\n".join(out)


def main() -> None:
    text = FORMULA.read_text()
    start, end = text.index(BEGIN), text.index(END)
    new = text[: start + len(BEGIN)] + "\n" + blocks(resolved()) + text[end:]
    FORMULA.write_text(new)
    print(f"wrote {new.count('resource ')} resources into {FORMULA}")


if __name__ == "__main__":
    main()
