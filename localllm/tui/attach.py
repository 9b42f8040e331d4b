"""`@path/to/file` in a chat prompt: the file's text goes with the prompt.

A word starting with @ that names a file (it has a / or a . in it, or exists) attaches
that file: its text is appended to the prompt in a fenced block, under its name. An
image or audio file (by its extension: .png, .jpg, .wav, ...) goes with the prompt as
itself, for a model that reads it; so does a pasted path to one (a terminal pastes a
dragged file as its path, quoted or with escaped spaces). A missing, binary,
unreadable, oversized or undecodable file refuses the whole prompt with one line, so
nothing is sent half-attached. Words like @alice (no / or ., no such file) stay text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from localllm.backends import media
from localllm.errors import InvalidRequest
from localllm.history import Attachment

MAX_BYTES = 1024 * 1024  # a larger file is refused: a prompt is not the place for it
_WORD = re.compile(r"(?<!\S)@(\S+)")
_TRAILING = ",;:!?)]}'\""  # punctuation after a path in a sentence is not part of it


class AttachError(ValueError):
    """A prompt's @file that cannot be attached; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Attached:
    text: str  # the prompt with the files' text appended
    files: tuple[tuple[str, str], ...]  # (the name as written, its text)
    media: tuple[Attachment, ...] = ()  # images and audio, sent as themselves


def attach(prompt: str, cwd: Path) -> Attached:
    """The prompt with every @file it names attached; AttachError for one that cannot be."""
    files: list[tuple[str, str]] = []
    pictures: list[Attachment] = []
    for match in _WORD.finditer(prompt):
        written = match.group(1).rstrip(_TRAILING)
        path = (cwd / Path(written).expanduser()).resolve()
        looks_like_path = "/" in written or "." in written or path.exists()
        seen = any(w == written for w, _ in files) or any(a.name == written for a in pictures)
        if not written or not looks_like_path or seen:
            continue
        if path.suffix.lower() in MEDIA_SUFFIXES:
            pictures.append(_media(written, path))
        else:
            files.append((written, _read(written, path)))
    for written, path in _pasted(prompt, cwd):
        if not any(a.name == written for a in pictures):
            pictures.append(_media(written, path))
    if not files:
        return Attached(prompt, (), tuple(pictures))
    blocks = [prompt.rstrip()]
    for written, text in files:
        fence = "~~~~" if "```" in text else "```"
        blocks.append(f"File {written}:\n{fence}{_language(written)}\n{text.rstrip()}\n{fence}")
    return Attached("\n\n".join(blocks), tuple(files), tuple(pictures))


MEDIA_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".wav", ".mp3", ".flac"}
# a path a terminal pastes for a dragged file: absolute or from ~, maybe quoted, spaces
# escaped with backslashes
_PASTED = re.compile(r"""(?<![\S@])(?:(['"])((?:/|~/)[^'"]+)\1|((?:/|~/)(?:[^\s'"\\]|\\.)+))""")


def _pasted(prompt: str, cwd: Path) -> list[tuple[str, Path]]:
    """The pasted paths in a prompt that name an existing image or audio file."""
    out = []
    for match in _PASTED.finditer(prompt):
        written = match.group(2) or match.group(3).rstrip(_TRAILING)
        path = (cwd / Path(re.sub(r"\\(.)", r"\1", written)).expanduser()).resolve()
        if path.suffix.lower() in MEDIA_SUFFIXES and path.is_file():
            out.append((written, path))
    return out


def _media(written: str, path: Path) -> Attachment:
    """An image or audio file, read and checked as the engine will read it."""
    if not path.is_file():
        raise AttachError(f"@{written}: no such file (looked in {path.parent})")
    size = path.stat().st_size
    if size > media.MAX_MEDIA_BYTES:
        raise AttachError(
            f"@{written}: {size:,} bytes is more than the {media.MAX_MEDIA_BYTES:,} an image "
            "or clip may have"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AttachError(f"@{written}: cannot be read ({exc.strerror})") from None
    try:
        if path.suffix.lower() in (".wav", ".mp3", ".flac"):
            item = media.audio(raw, param=f"@{written}")
        else:
            item = media.from_bytes(raw, param=f"@{written}")
    except InvalidRequest as exc:
        raise AttachError(exc.public_message) from None
    return Attachment(written, item.kind, raw)


def _read(written: str, path: Path) -> str:
    if not path.exists():
        raise AttachError(f"@{written}: no such file (looked in {path.parent})")
    if not path.is_file():
        raise AttachError(f"@{written}: not a file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise AttachError(
            f"@{written}: {size:,} bytes is more than the {MAX_BYTES:,} a prompt attaches"
        )
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise AttachError(f"@{written}: cannot be read ({exc.strerror})") from None
    if b"\0" in raw[:8192]:
        raise AttachError(f"@{written}: a binary file; only text files can be attached")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AttachError(f"@{written}: not UTF-8 text; only text files can be attached") from None


def _language(name: str) -> str:
    """The fence's language hint from the file's extension (none when unknown)."""
    suffix = Path(name).suffix.lower().lstrip(".")
    known = {
        "py": "python",
        "js": "javascript",
        "ts": "typescript",
        "rs": "rust",
        "md": "markdown",
        "sh": "sh",
        "json": "json",
        "toml": "toml",
        "yaml": "yaml",
        "yml": "yaml",
        "c": "c",
        "h": "c",
        "cpp": "cpp",
        "go": "go",
        "java": "java",
        "rb": "ruby",
        "html": "html",
        "css": "css",
        "sql": "sql",
        "txt": "",
    }
    return known.get(suffix, "")
