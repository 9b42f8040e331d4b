"""The folder the chat's file tools may touch, and the checks every path goes through.

A path the model names is read relative to the folder. It is refused, with the reason,
when it leads out of the folder (`..`, an absolute path elsewhere, or a symlink whose
target is outside), or when it names something that is not a regular file or folder (a
device, a FIFO, a socket: reading one could block or change the machine)."""

from __future__ import annotations

import os
import stat
from pathlib import Path


class ToolRefused(Exception):
    """A call the tool will not run; the text goes back to the model as the result."""


class Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def path(self, name: str, *, must_exist: bool = True) -> Path:
        """`name` inside the folder, its symlinks followed; ToolRefused otherwise."""
        if not isinstance(name, str) or not name.strip():
            raise ToolRefused("the path is empty")
        if "\x00" in name:
            raise ToolRefused("the path contains a NUL character")
        raw = Path(os.path.expanduser(name.strip()))
        joined = raw if raw.is_absolute() else self.root / raw
        resolved = joined.resolve()  # symlinks followed, `..` folded
        if resolved != self.root and not resolved.is_relative_to(self.root):
            via = " (through a symlink)" if joined.absolute() != resolved else ""
            raise ToolRefused(f"{name} is outside the folder the tools may use ({self.root}){via}")
        if not resolved.exists():
            if must_exist:
                raise ToolRefused(f"{name} does not exist (in {self.root})")
            return resolved
        mode = resolved.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ToolRefused(f"{name} is not a regular file or folder")
        return resolved

    def shown(self, path: Path) -> str:
        """A path as the model and the user see it: relative to the folder."""
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return str(path)
        return str(rel) if str(rel) != "." else "."
