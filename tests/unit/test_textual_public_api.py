"""The chat uses Textual's public API only: no overridden or called `_name` that Textual
defines (an upgrade could change or drop it), and no `obj._name` of another object."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import localllm.tui

TUI = Path(localllm.tui.__file__).parent


def _textual_private(cls: type, name: str) -> bool:
    """Whether `name` is a private member that one of `cls`'s Textual bases defines."""
    if not name.startswith("_") or name.startswith("__"):
        return False
    return any(
        base.__module__.startswith("textual") and name in vars(base)
        for base in inspect.getmro(cls)
    )


def test_no_private_textual_names_in_the_chat() -> None:
    found: list[str] = []
    for path in sorted(TUI.rglob("*.py")):
        module_name = "localllm." + ".".join(path.relative_to(TUI.parent).with_suffix("").parts)
        module = importlib.import_module(module_name)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef) or not hasattr(module, node.name):
                continue
            cls = getattr(module, node.name)
            for sub in ast.walk(node):
                name = None
                if isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = sub.name
                elif isinstance(sub, ast.Attribute):
                    owner = sub.value
                    is_self = isinstance(owner, ast.Name) and owner.id == "self"
                    is_super = isinstance(owner, ast.Call) and \
                        getattr(owner.func, "id", "") == "super"
                    if not (is_self or is_super) and sub.attr.startswith("_") \
                            and not sub.attr.startswith("__"):
                        found.append(f"{path.name}:{sub.lineno} .{sub.attr} of another object")
                        continue
                    name = sub.attr
                if name and name.startswith("_") and not name.startswith("__") \
                        and _textual_private(cls, name):
                    line = getattr(sub, "lineno", 0)
                    found.append(f"{path.name}:{line} {node.name}.{name}")
    assert not found, found


def test_the_check_sees_a_private_override() -> None:
    """The check above would catch what the chat used to do."""
    from textual.widget import Widget

    class Sneaky(Widget):
        def _size_updated(self, *args: object) -> bool:
            return False

    assert _textual_private(Sneaky, "_size_updated")
    assert not _textual_private(Sneaky, "render_line")
