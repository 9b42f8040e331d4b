"""Images and audio attached to a chat message, as the chat shows them: a one-line note
(kind, name, size) always, and the picture itself where the terminal draws pictures
(Sixel, or Kitty's graphics protocol, through textual-image)."""

from __future__ import annotations

import io
import logging
import sys
from collections.abc import Iterator

from textual.widget import Widget
from textual.widgets import Static

from localllm.history import Attachment
from localllm.units import format_bytes

log = logging.getLogger(__name__)


def probe() -> bool:
    """Whether this terminal draws pictures. textual-image asks the terminal when first
    imported, which it can only do before the app takes the screen: call this first."""
    out = sys.__stdout__
    if out is None or not out.isatty():
        return False
    try:
        from textual_image import renderable
        from textual_image.widget import Image  # noqa: F401  (its import reads the cell size)
    except Exception as exc:  # a terminal that answers oddly: notes only
        log.info("no inline pictures: %s", exc)
        return False
    return renderable.Image in (renderable.SixelImage, renderable.TGPImage)


def note(item: Attachment) -> str:
    """One line for an attachment: ▣ image cat.png · 640x480 · 58.1 KiB."""
    size = format_bytes(len(item.data))
    if item.kind != "image":
        return f"♪ {item.kind} {item.name} · {size}"
    try:
        from PIL import Image

        with Image.open(io.BytesIO(item.data)) as img:
            width, height = img.size
        return f"▣ image {item.name} · {width}x{height} · {size}"
    except Exception:
        return f"▣ image {item.name} · {size}"


def shown(item: Attachment, *, inline: bool) -> Iterator[Widget]:
    """The widgets for an attachment: its note, and the picture where `inline`."""
    yield Static(note(item), classes="attachment", markup=False)
    if not inline or item.kind != "image":
        return
    try:
        from PIL import Image as PILImage
        from textual_image.widget import Image

        picture = PILImage.open(io.BytesIO(item.data))
        yield Image(picture, classes="picture")
    except Exception as exc:  # the note stands for it
        log.info("could not draw %s: %s", item.name, exc)
