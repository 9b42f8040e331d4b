"""The file-system boundary as an attacker meets it: random trees of files, folders,
links in and out, loops, FIFOs and long names, with entries swapped for links to the
outside while the reads, listings and writes run. Nothing outside the root is ever read
or written, and nothing but PathRefused comes out.

The suite runs a small Hypothesis profile; `make fuzz` runs the same properties with at
least 10,000 trees (HYPOTHESIS_PROFILE=fuzz)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localllm.fsguard import PathRefused, Root, read_user_file, write_user_file

SECRET = b"OUTSIDE-SECRET"

NAMES = st.sampled_from(["a", "b", "c", "d.txt", "x" * 300, "..", "."])
# what an entry of the tree is: how an attacker or a cloned repository plants it
KINDS = st.sampled_from(
    [
        "file",
        "folder",
        "link-in-file",  # a relative link to a file inside
        "link-in-folder",  # a relative link to a folder inside
        "link-up",  # ../../outside/secret: climbs out
        "link-abs-out",  # /.../outside/secret
        "link-abs-in",  # an absolute link to a file inside (allowed)
        "link-out-folder",  # a link to the outside folder
        "loop",  # a link to itself
        "dangling",
        "fifo",
    ]
)
TREE = st.lists(
    st.tuples(
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
        st.sampled_from(["a", "b", "c", "d.txt", "e"]),
        KINDS,
    ),
    max_size=12,
)
OPS = st.lists(
    st.tuples(
        st.sampled_from(["read", "kind", "list", "write", "new", "append", "files"]),
        st.lists(NAMES, min_size=1, max_size=4),
        st.booleans(),  # an absolute name
    ),
    min_size=1,
    max_size=12,
)
SWAPS = st.lists(
    st.sampled_from(["file-link", "folder-link", "file-fifo", "folder-file"]), max_size=3
)


def _outside_state(outside: Path) -> dict[str, str]:
    """Every entry under the outside folder and the hash of each file's bytes."""
    state = {}
    for folder, dirs, files in os.walk(outside):
        for name in dirs + files:
            p = Path(folder) / name
            state[str(p)] = (
                hashlib.sha256(p.read_bytes()).hexdigest()
                if p.is_file() and not p.is_symlink()
                else "-"
            )
    return state


def _plant(root: Path, outside: Path, tree: list[tuple[list[str], str, str]]) -> None:
    for folders, name, kind in tree:
        parent = root.joinpath(*folders)
        if any(root.joinpath(*folders[: i + 1]).is_symlink() for i in range(len(folders))):
            continue  # the test plants only through real folders
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        p = parent / name
        if os.path.lexists(p):
            continue
        depth = len(folders) + 1
        try:
            if kind == "file":
                p.write_bytes(b"inside " + name.encode())
            elif kind == "folder":
                p.mkdir()
            elif kind == "link-in-file":
                (root / "in.txt").write_bytes(b"inside") if not (root / "in.txt").exists() else None
                p.symlink_to("../" * (depth - 1) + "in.txt")
            elif kind == "link-in-folder":
                p.symlink_to("../" * (depth - 1) + "." if depth > 1 else ".")
            elif kind == "link-up":
                p.symlink_to("../" * depth + "outside/secret")
            elif kind == "link-abs-out":
                p.symlink_to(outside / "secret")
            elif kind == "link-abs-in":
                (root / "in.txt").write_bytes(b"inside") if not (root / "in.txt").exists() else None
                p.symlink_to(root / "in.txt")
            elif kind == "link-out-folder":
                p.symlink_to(outside)
            elif kind == "loop":
                p.symlink_to(name)
            elif kind == "dangling":
                p.symlink_to("nowhere/at/all")
            elif kind == "fifo":
                os.mkfifo(p)
        except OSError:
            continue


def _swap_targets(root: Path) -> None:
    """What the swapper swaps: made before it starts (and before any call runs)."""
    (root / "sw").mkdir(exist_ok=True)
    (root / "sw" / "f").write_bytes(b"inside sw")
    (root / "swf").write_bytes(b"inside swf")


def _swapper(root: Path, outside: Path, swaps: list[str], stop: threading.Event) -> None:
    """Swap entries for links out (and FIFOs, and files for folders) until told to stop."""
    if not swaps:
        return
    i = 0
    while not stop.is_set():
        kind = swaps[i % len(swaps)]
        i += 1
        try:
            if kind == "file-link":
                tmp = root / ".swl"
                if not os.path.lexists(tmp):
                    tmp.symlink_to(outside / "secret")
                os.replace(tmp, root / "swf")
                (root / ".swf").write_bytes(b"inside swf")
                os.replace(root / ".swf", root / "swf")
            elif kind == "folder-link":
                os.rename(root / "sw", root / ".sw-real")
                (root / "sw").symlink_to(outside)
                os.unlink(root / "sw")
                os.rename(root / ".sw-real", root / "sw")
            elif kind == "file-fifo":
                tmp = root / ".swfifo"
                if not os.path.lexists(tmp):
                    os.mkfifo(tmp)
                os.replace(tmp, root / "swf")
                (root / ".swf").write_bytes(b"inside swf")
                os.replace(root / ".swf", root / "swf")
            elif kind == "folder-file":
                os.rename(root / "sw", root / ".sw-real")
                (root / "sw").write_bytes(b"inside")
                os.unlink(root / "sw")
                os.rename(root / ".sw-real", root / "sw")
        except OSError:
            continue


def _name(parts: list[str], absolute: bool, root: Path) -> str:
    name = "/".join(parts)
    return str(root / name) if absolute else name


def _run_ops(fs: Root, root: Path, ops: list[tuple[str, list[str], bool]]) -> None:
    names_seen = ["swf", "sw/f", "sw/g", "sw", "."]
    for i, (op, parts, absolute) in enumerate(ops):
        for name in (_name(parts, absolute, root), names_seen[i % len(names_seen)]):
            try:
                if op == "read":
                    assert SECRET not in fs.read_bytes(name, limit=1 << 20)
                elif op == "kind":
                    fs.kind(name)
                elif op == "list":
                    for e in fs.list(name):
                        assert e.name != "secret"  # the outside folder is never listed
                elif op == "write":
                    fs.write(name, b"written")
                elif op == "new":
                    fs.write(name, b"created", new=True)
                elif op == "append":
                    fd = fs.open_append(name)
                    os.write(fd, b"more")
                    os.close(fd)
                elif op == "files":
                    for f in fs.files(name):
                        with contextlib.suppress(PathRefused):
                            assert SECRET not in fs.read_bytes(f, limit=1 << 20)
            except PathRefused:
                pass


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / "d").mkdir()
    return tmp_path / "root", outside


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
@given(tree=TREE, ops=OPS, swaps=SWAPS)
def test_nothing_outside_the_root_is_read_or_written(openat2: bool, tree, ops, swaps):
    with tempfile.TemporaryDirectory(prefix="fsguard-") as tmp:  # one per tree, removed
        _one_tree(Path(tmp), openat2, tree, ops, swaps)


def _one_tree(base: Path, openat2: bool, tree, ops, swaps) -> None:
    root, outside = base / "root", base / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret").write_bytes(SECRET)
    (outside / "d").mkdir()
    _plant(root, outside, tree)
    _swap_targets(root)
    before = _outside_state(outside)
    fs = Root(root, openat2=openat2)
    stop = threading.Event()
    swapper = threading.Thread(target=_swapper, args=(root, outside, swaps, stop))
    swapper.start()
    try:
        _run_ops(fs, root, ops)
    finally:
        stop.set()
        swapper.join()
        fs.close()
    assert _outside_state(outside) == before


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])
def test_a_file_swapped_with_a_link_out_is_never_read_through_it(world, openat2: bool):
    """The measured race: 53 of 55,849 reads returned the outside file before."""
    root, outside = world
    root.mkdir()
    _swap_targets(root)
    fs = Root(root, openat2=openat2)
    stop = threading.Event()
    swapper = threading.Thread(
        target=_swapper, args=(root, outside, ["file-link", "file-fifo", "folder-link"], stop)
    )
    swapper.start()
    read = refused = 0
    try:
        for _ in range(3000):
            for name in ("swf", "sw/f"):
                try:
                    data = fs.read_bytes(name, limit=1000)
                except PathRefused:
                    refused += 1
                    continue
                assert SECRET not in data
                read += 1
            try:
                fs.write("sw/new", b"x")
            except PathRefused:
                refused += 1
    finally:
        stop.set()
        swapper.join()
    assert read > 0 and not (outside / "new").exists()
    assert sorted(os.listdir(outside)) == ["d", "secret"]


def test_refusals_name_the_path_and_the_reason(world):
    root, outside = world
    root.mkdir()
    (root / "loop").symlink_to("loop")
    (root / "out").symlink_to(outside / "secret")
    (root / "up").symlink_to("../outside/secret")
    os.mkfifo(root / "pipe")
    (root / "dir").mkdir()
    fs = Root(root)
    cases = {
        "loop": "too many symlinks",
        "out": "through a symlink",
        "up": "through a symlink",
        "../outside/secret": "outside the folder",
        str(outside / "secret"): "outside the folder",
        "pipe": "FIFO, not a regular file",  # opened non-blocking: refused, not waited on
        "dir": "is a folder",
        "x" * 300: "name is too long",
        "missing": "does not exist",
        "a\x00b": "NUL",
    }
    for name, said in cases.items():
        with pytest.raises(PathRefused, match=said):
            fs.read_bytes(name, limit=100)


def test_writes_replace_whole_through_a_random_temporary_name(world):
    root, outside = world
    root.mkdir()
    (root / "notes.txt").write_text("old")
    # a cloned repository can carry the old fixed temporary name as a link out
    (root / ".notes.txt.localllm-tmp").symlink_to(outside / "secret")
    fs = Root(root)
    fs.write("notes.txt", b"new")
    assert (root / "notes.txt").read_text() == "new" and not (root / "notes.txt").is_symlink()
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in root.iterdir()) == [".notes.txt.localllm-tmp", "notes.txt"]
    with pytest.raises(PathRefused, match="exists"):
        fs.write("notes.txt", b"again", new=True)
    assert (root / "notes.txt").read_text() == "new"


def test_a_users_symlinked_file_is_written_through_its_link_and_backed_up_uniquely(tmp_path: Path):
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "config.toml").write_text("original\n")
    link = tmp_path / "config.toml"
    link.symlink_to(dotfiles / "config.toml")
    saved = [write_user_file(link, f"version {i}\n") for i in range(3)]  # in one second
    assert link.is_symlink() and link.read_text() == "version 2\n"
    assert len({p for p in saved if p}) == 3  # three backups, none replaced
    assert sorted(p.read_text() for p in saved if p) == ["original\n", "version 0\n", "version 1\n"]
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(PathRefused, match=r"not UTF-8 text \(byte 11 is 0xe9\)"):
        read_user_file(tmp_path / "latin1.toml")
    os.mkfifo(tmp_path / "fifo.toml")
    with pytest.raises(PathRefused, match="FIFO"):
        read_user_file(tmp_path / "fifo.toml")


def test_a_new_file_takes_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path: Path):
    old = os.umask(0o077)  # a user who keeps new files private
    try:
        made = tmp_path / "new.toml"
        write_user_file(made, "a = 1\n", backup=False)
        Root(tmp_path).write("new2.txt", b"x", new=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "new2.txt").stat().st_mode) == 0o600
    kept = tmp_path / "shared.toml"
    kept.write_text("a = 1\n")
    kept.chmod(0o640)
    saved = write_user_file(kept, "a = 2\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640
    assert saved is not None and stat.S_IMODE(saved.stat().st_mode) == 0o640
