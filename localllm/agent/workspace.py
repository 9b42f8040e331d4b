"""The folder the chat's file tools may touch.

Every name the model gives is resolved beneath the folder's open handle by
`localllm.fsguard.Root`: `..` above the top, an absolute path elsewhere and a symlink
whose target is outside are refused, and so is anything that is not a regular file or
folder (a device, a FIFO, a socket: reading one could block or change the machine).
What is refused, and every OS error, reaches the model as a `ToolRefused` text."""

from __future__ import annotations

import os
from pathlib import Path

from localllm.fsguard import PathRefused, Root


class ToolRefused(Exception):
    """A call the tool will not run; the text goes back to the model as the result."""


class Workspace:
    """The folder, opened on first use (a folder that is gone, or was never there, is a
    refusal each tool tells the model, not an error when the chat sets tools up)."""

    def __init__(self, root: Path, *, openat2: bool = True) -> None:
        self.root = Path(os.path.realpath(root))
        self._openat2 = openat2
        self._fs: Root | None = None

    @property
    def fs(self) -> Root:
        if self._fs is None:
            try:
                self._fs = Root(self.root, openat2=self._openat2)
            except PathRefused as exc:
                raise ToolRefused(f"the tools' folder cannot be used: {exc}") from None
        return self._fs

    def close(self) -> None:
        if self._fs is not None:
            self._fs.close()
