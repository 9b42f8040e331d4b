"""Every read and write of a user's files goes through here.

Two promises, kept with directory handles rather than path strings:

- `Root`: paths beneath one folder (the agent's). A path is walked from an open handle
  of the folder one component at a time; each folder is opened with O_NOFOLLOW and
  O_DIRECTORY relative to the one before, a symlink is read and its target walked the
  same way (a target that climbs above the folder, or an absolute one outside it, is
  refused), and a file is opened non-blocking and checked with fstat on the open
  descriptor (a FIFO, a socket or a device is refused, never waited on). Linux's
  openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) opens a file in one call where the
  kernel has it; whatever it refuses is walked, so the walk decides. Swapping a file or
  a folder for a link while a call runs cannot move it outside the folder: nothing is
  ever opened by a path the kernel resolves on its own.
- `write_user_file`: the user's own config files (`launch`, `mcp import`, the config
  writer). A symlinked file is written through the link (the link stays); the old
  content is first copied to a backup whose name is created exclusively (never one
  that exists); the new content goes to a temporary file created with O_EXCL and
  O_NOFOLLOW under a random name, and replaces the file with one rename.

Every refusal and every OS error is a `PathRefused` whose text names the path and says
why; the agent tells the model, a command prints one line and exits 2.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
import stat
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

MAX_LINK_HOPS = 40  # the kernel's own bound on links in one path
MAX_TRIES = 8  # a path that keeps changing under a call is refused after this many walks
Parts = list[str]  # a path as its components, relative to a Root
Kind = Literal["file", "folder", "link", "FIFO", "socket", "device"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _NOCTTY | _CLOEXEC


class PathRefused(Exception):
    """A path that was not read or written, and why (the text names it)."""


class _Missing(PathRefused):
    """A folder on the way to the path does not exist."""


def _say(shown: str, exc: OSError) -> PathRefused:
    why = {
        errno.ENAMETOOLONG: "its name is too long for the file system",
        errno.ELOOP: "it is a loop of symlinks",
        errno.ENOENT: "it does not exist",
        errno.ENOTDIR: "a part of it is not a folder",
        errno.EACCES: "permission denied",
        errno.EPERM: "not permitted",
        errno.EISDIR: "it is a folder",
        errno.ENOSPC: "the disk is full",
        errno.EROFS: "the file system is read-only",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return PathRefused(f"{shown}: {why}")


# -- openat2 (Linux 5.6+): the one-call fast path ------------------------------------
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every Linux architecture (the unified table)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _load_openat2() -> Callable[[int, str, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall = libc.syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long

    def openat2(dir_fd: int, path: str, flags: int) -> int:
        how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS)
        fd = syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return int(fd)

    try:  # the kernel may lack it, or a sandbox may refuse it
        probe = os.open(".", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        try:
            os.close(openat2(probe, ".", os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC))
        finally:
            os.close(probe)
    except OSError:
        return None
    return openat2


_probed: list[Callable[[int, str, int], int] | None] = []  # empty: not probed yet


def _fast_open() -> Callable[[int, str, int], int] | None:
    if not _probed:
        _probed.append(_load_openat2())
    return _probed[0]


# -- paths beneath a folder -----------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    kind: Kind
    size: int  # bytes, for a file; 0 otherwise


class Root:
    """One folder, held open; every path given is resolved beneath it."""

    def __init__(self, path: Path, *, openat2: bool = True) -> None:
        self.path = Path(os.path.realpath(path))
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
        except OSError as exc:
            raise _say(str(self.path), exc) from None
        self._openat2 = _fast_open() if openat2 else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    # names -------------------------------------------------------------------------
    def parts(self, name: str | Parts) -> list[str]:
        """A name the caller gave as components relative to the folder. An absolute name
        (or ~) is accepted when it lies lexically inside the folder; a list is components
        already (what `files` gives), taken as they are."""
        if isinstance(name, list):
            return name
        if not isinstance(name, str) or not name.strip():
            raise PathRefused("the path is empty")
        if "\x00" in name:
            raise PathRefused("the path contains a NUL character")
        raw = os.path.expanduser(name.strip())
        if os.path.isabs(raw):
            rel = os.path.relpath(os.path.normpath(raw), self.path)
            if rel == ".." or rel.startswith("../"):
                raise PathRefused(f"{name} is outside the folder the tools may use ({self.path})")
            raw = rel
        return [p for p in PurePosixPath(raw).parts if p not in ("", ".")]

    def shown(self, parts: list[str] | str) -> str:
        if isinstance(parts, str):
            return parts
        return "/".join(parts) or "."

    # the walk ------------------------------------------------------------------------
    def _walk(
        self, parts: list[str], *, follow_last: bool = True, make_dirs: bool = False
    ) -> tuple[int, str | None]:
        """(a new descriptor of the folder holding the last component, its name); the
        name is None when the path is the folder itself (or a folder named with a
        trailing '..'). Links are read, never followed by the kernel."""
        stack = [os.dup(self._fd)]
        todo = deque(parts)
        hops = 0
        shown = self.shown(parts)
        try:
            while todo:
                part = todo.popleft()
                if part in ("", "."):
                    continue
                if part == "..":
                    if len(stack) == 1:
                        via = " through a symlink" if hops else ""
                        raise PathRefused(
                            f"{shown} is outside the folder the tools may use ({self.path}){via}"
                        )
                    os.close(stack.pop())
                    continue
                last = not todo
                if last and not follow_last:
                    return stack.pop(), part
                try:
                    st = os.stat(part, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return stack.pop(), part
                    if not make_dirs:
                        raise _Missing(f"{shown}: {part} does not exist") from None
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o777, dir_fd=stack[-1])
                    todo.appendleft(part)
                    continue
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > MAX_LINK_HOPS:
                        raise PathRefused(f"{shown}: too many symlinks (a loop?)")
                    target = os.readlink(part, dir_fd=stack[-1])
                    if os.path.isabs(target):
                        rel = os.path.relpath(os.path.normpath(target), self.path)
                        if rel == ".." or rel.startswith("../"):
                            raise PathRefused(
                                f"{shown} is outside the folder the tools may use "
                                f"({self.path}) through a symlink"
                            )
                        while len(stack) > 1:
                            os.close(stack.pop())
                        target = rel
                    todo.extendleft(reversed(PurePosixPath(target).parts))
                    continue
                if last:
                    return stack.pop(), part
                if not stat.S_ISDIR(st.st_mode):
                    raise PathRefused(f"{shown}: {part} is not a folder")
                try:
                    stack.append(os.open(part, _DIR_FLAGS, dir_fd=stack[-1]))
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                        hops += 1  # swapped since the stat: look again (bounded by hops)
                        if hops > MAX_LINK_HOPS:
                            raise PathRefused(f"{shown} keeps changing; not used") from None
                        todo.appendleft(part)
                        continue
                    raise
            return stack.pop(), None
        except OSError as exc:
            raise _say(shown, exc) from None
        finally:
            for fd in stack:
                os.close(fd)

    def _open_leaf(self, dir_fd: int, leaf: str | None, folder: bool) -> int:
        if leaf is None:
            return os.dup(dir_fd)
        flags = _DIR_FLAGS if folder else _READ_FLAGS
        return os.open(leaf, flags, dir_fd=dir_fd)

    def open(self, name: str | Parts, *, folder: bool = False) -> int:
        """A read-only descriptor of the regular file (or, with folder=True, the folder)
        `name`: links inside followed, anything else refused. The caller closes it."""
        parts = self.parts(name)
        shown = self.shown(parts)
        fd = self._try_openat2(parts, folder)
        for _ in range(MAX_TRIES):
            if fd is not None:
                break
            dir_fd, leaf = self._walk(parts)
            try:
                fd = self._open_leaf(dir_fd, leaf, folder)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # became a link (or not a folder) since the walk: again
                raise _say(shown, exc) from None
            finally:
                os.close(dir_fd)
        if fd is None:
            raise PathRefused(f"{shown} keeps changing; not used")
        mode = os.fstat(fd).st_mode
        want = stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode)
        if not want:
            os.close(fd)
            what = _kind_of(mode)
            if folder:
                raise PathRefused(f"{shown} is a {what}, not a folder")
            raise PathRefused(
                f"{shown} is a folder"
                if what == "folder"
                else f"{shown} is a {what}, not a regular file"
            )
        return fd

    def _try_openat2(self, parts: list[str], folder: bool) -> int | None:
        if self._openat2 is None or not parts:
            return None
        flags = (
            (os.O_DIRECTORY | os.O_RDONLY | _CLOEXEC) if folder else (_READ_FLAGS & ~os.O_NOFOLLOW)
        )
        try:
            return self._openat2(self._fd, "/".join(parts), flags)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise PathRefused(f"{self.shown(parts)} does not exist") from None
            return None  # refused or unsure (EXDEV, ELOOP, EAGAIN, ...): the walk decides

    def kind(self, name: str | Parts) -> Kind | None:
        """What `name` is once links inside are followed; None when nothing is there."""
        parts = self.parts(name)
        try:
            dir_fd, leaf = self._walk(parts)
        except _Missing:
            return None
        try:
            if leaf is None:
                return "folder"
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _say(self.shown(parts), exc) from None
        finally:
            os.close(dir_fd)
        return _kind_of(st.st_mode)

    def read_bytes(self, name: str | Parts, *, limit: int) -> bytes:
        """The file's bytes; refused when it holds more than `limit`."""
        shown = self.shown(self.parts(name))
        fd = self.open(name)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise PathRefused(f"{shown} is {size:,} bytes; the limit is {limit:,}")
            chunks, total = [], 0
            while chunk := os.read(fd, 1 << 20):
                total += len(chunk)
                if total > limit:
                    raise PathRefused(f"{shown} grew past {limit:,} bytes while being read")
                chunks.append(chunk)
            return b"".join(chunks)
        except OSError as exc:
            raise _say(shown, exc) from None
        finally:
            os.close(fd)

    def list(self, name: str | Parts = ".") -> list[Entry]:
        """The folder's entries; links are shown as links (never followed here)."""
        fd = self.open(name, folder=True)
        try:
            return _entries(fd)
        except OSError as exc:
            raise _say(self.shown(self.parts(name)), exc) from None
        finally:
            os.close(fd)

    def files(
        self, name: str = ".", *, skip: frozenset[str] = frozenset(), limit: int = 20_000
    ) -> Iterator[Parts]:
        """The regular files under a folder (as components relative to the root, sorted
        per folder); links to folders are not entered, links to files are given and are
        opened like any name."""
        top = self.parts(name)
        todo: deque[list[str]] = deque([top])
        seen = 0
        while todo:
            parts = todo.popleft()
            try:
                entries = self.list(parts)
            except PathRefused:
                continue
            for e in sorted(entries, key=lambda e: e.name):
                if e.kind == "folder" and e.name not in skip:
                    todo.append([*parts, e.name])
                elif e.kind in ("file", "link"):
                    seen += 1
                    if seen > limit:
                        return
                    yield [*parts, e.name]

    # writing -------------------------------------------------------------------------
    def open_append(self, name: str) -> int:
        """A descriptor reading and appending to the regular file `name` (made, with its
        folders, when missing; never through a link): for downloads resumed where they
        stopped."""
        parts = self.parts(name)
        shown = self.shown(parts)
        dir_fd, leaf = self._walk(parts, follow_last=False, make_dirs=True)
        try:
            if leaf is None:
                raise PathRefused(f"{shown} is a folder")
            flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
            fd = os.open(leaf, flags | _CLOEXEC, 0o666, dir_fd=dir_fd)
        except OSError as exc:
            raise _say(shown, exc) from None
        finally:
            os.close(dir_fd)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise PathRefused(f"{shown} is a {_kind_of(mode)}, not a regular file")
        return fd

    def write(self, name: str, data: bytes, *, new: bool = False, make_dirs: bool = True) -> None:
        """Replace (or with new=True create, never replace) the file `name` whole: its
        links inside are followed, so an edit through a link changes the target."""
        parts = self.parts(name)
        shown = self.shown(parts)
        dir_fd, leaf = self._walk(parts, make_dirs=make_dirs)
        try:
            if leaf is None:
                raise PathRefused(f"{shown} is a folder")
            _replace(dir_fd, leaf, data, shown=shown, new=new)
        finally:
            os.close(dir_fd)


def _kind_of(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def _entries(fd: int) -> list[Entry]:
    out = []
    with os.scandir(fd) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            kind = _kind_of(st.st_mode)
            out.append(Entry(e.name, kind, st.st_size if kind == "file" else 0))
    return out


def _temp_name(leaf: str) -> str:
    return f".{leaf[:80]}.{secrets.token_hex(6)}.localllm-tmp"


def _write_new(dir_fd: int, name: str, data: bytes, mode: int | None) -> None:
    """Create `name` in the folder exclusively (never through a link) holding `data`,
    with `mode`, or (None) the mode the user's umask gives a new file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    fd = os.open(name, flags, 0o666 if mode is None else 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(
    dir_fd: int, leaf: str, data: bytes, *, shown: str, new: bool = False, backup: bool = False
) -> str | None:
    """Write `data` as `leaf` in the folder whole (a temporary file, then one rename);
    with backup=True the old file is first copied to a name made exclusively. The
    backup's name, or None."""
    try:
        try:
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{shown} is a {_kind_of(st.st_mode)}, not a file; not written")
        if st is not None and new:
            raise PathRefused(f"{shown} exists")
        mode = stat.S_IMODE(st.st_mode) if st is not None else None
        saved = _backup(dir_fd, leaf) if backup and st is not None else None
        tmp = _temp_name(leaf)
        _write_new(dir_fd, tmp, data, mode)
        try:
            if new:  # link(2) fails when the name exists: a file made meanwhile is kept
                os.link(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            else:
                os.replace(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
        return saved
    except FileExistsError:
        raise PathRefused(f"{shown} exists") from None
    except OSError as exc:
        raise _say(shown, exc) from None


def _backup(dir_fd: int, leaf: str) -> str:
    """Copy `leaf` to `leaf.bak-YYYYmmdd-HHMMSS` (or -2, -3, ... after it when taken),
    created exclusively: an earlier backup is never replaced."""
    fd = os.open(leaf, _READ_FLAGS, dir_fd=dir_fd)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 10_000):
        name = f"{leaf}.bak-{stamp}" + (f"-{n}" if n > 1 else "")
        try:
            _write_new(dir_fd, name, b"".join(chunks), mode)
        except FileExistsError:
            continue
        return name
    raise PathRefused(f"{leaf}: no free backup name")


# -- the user's own files (configs) ---------------------------------------------------
def read_user_file(path: Path, *, limit: int = 16 << 20) -> str | None:
    """The UTF-8 text of a user's file (links followed: it is theirs), None when there is
    none; refused when it is not a regular file, is larger than `limit` or is not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOCTTY | _CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _say(str(path), exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{path} is a {_kind_of(st.st_mode)}, not a file")
        if st.st_size > limit:
            raise PathRefused(f"{path} is {st.st_size:,} bytes; the limit is {limit:,}")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    except OSError as exc:
        raise _say(str(path), exc) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PathRefused(
            f"{path} is not UTF-8 text (byte {exc.start:,} is {data[exc.start]:#04x}); "
            "fix it or move it away"
        ) from None


def write_user_file(path: Path, text: str | bytes, *, backup: bool = True) -> Path | None:
    """Write a user's file whole. A symlink is written through (the link stays, its
    target is replaced); with backup=True the old content is kept first under a name
    that did not exist. The backup's path, or None when there was no file."""
    real = Path(os.path.realpath(path))
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        dir_fd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except OSError as exc:
        raise _say(str(real.parent), exc) from None
    try:
        data = text.encode("utf-8") if isinstance(text, str) else text
        saved = _replace(dir_fd, real.name, data, shown=str(path), backup=backup)
    finally:
        os.close(dir_fd)
    return real.parent / saved if saved else None
