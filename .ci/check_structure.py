"""make lint's structure check: no module of the package over MAX_LINES lines (an engine
module over MAX_ENGINE_LINES), and no import circle among its modules, counting every
import (TYPE_CHECKING blocks and imports inside functions included: a circle hidden there
is still one a reader must untangle).

Run from the repository root: `python .ci/check_structure.py`; exit 1 with what is wrong.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "localllm"
MAX_LINES = 650
# the engine is split along its jobs: a module that grows past this holds a second one
MAX_ENGINE_LINES = 450


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The package's modules that `name` (at `path`) imports anywhere in its text."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports pkg.mod when it is a module, else a name of pkg
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.startswith(PACKAGE):
                found.add(target)
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def main() -> int:
    root = Path(PACKAGE)
    known = modules(root)
    problems = []
    for name, path in known.items():
        lines = len(path.read_text().splitlines())
        most = MAX_ENGINE_LINES if name.startswith(f"{PACKAGE}.engine.") else MAX_LINES
        if lines > most:
            problems.append(f"{path}: {lines} lines (at most {most}): split it by its jobs")
    graph = {name: imported(path, name, known) for name, path in known.items()}
    for group in circles(graph):
        problems.append("import circle: " + " -> ".join(group))
    for problem in problems:
        print(problem)
    if not problems:
        print(
            f"structure: {len(known)} modules, none over {MAX_LINES} lines (engine: "
            f"{MAX_ENGINE_LINES}), no import circle"
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
