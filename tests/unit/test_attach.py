"""@file in a chat prompt: text files are attached under their names; a missing, binary,
non-UTF-8 or oversized file refuses the prompt in one line; @mentions stay text."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.tui.attach import MAX_BYTES, AttachError, attach


def test_text_files_are_attached_under_their_names(tmp_path: Path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("def main():\n    return 1\n")
    (tmp_path / "notes.md").write_text("Has ```fences``` inside\n")
    out = attach("Review @src/app.py and @notes.md, thanks @alice!", tmp_path)
    assert [name for name, _ in out.files] == ["src/app.py", "notes.md"]
    assert out.text.startswith("Review @src/app.py and @notes.md, thanks @alice!")
    assert "File src/app.py:\n```python\ndef main():\n    return 1\n```" in out.text
    assert "File notes.md:\n~~~~markdown\nHas ```fences``` inside\n~~~~" in out.text
    assert attach("Hi @alice", tmp_path).files == ()  # a mention, not a file
    assert attach("no files here", tmp_path).text == "no files here"


@pytest.mark.parametrize(("name", "content", "said"), [
    ("missing.txt", None, "@missing.txt: no such file"),
    ("blob.bin", b"\x00\x01\x02", "@blob.bin: a binary file"),
    ("latin.txt", "caf\xe9".encode("latin-1"), "@latin.txt: not UTF-8 text"),
    ("huge.txt", b"x" * (MAX_BYTES + 1), f"{MAX_BYTES + 1:,} bytes is more than"),
])
def test_what_cannot_be_attached_is_one_line(tmp_path: Path, name: str,
                                             content: bytes | None, said: str):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    with pytest.raises(AttachError) as err:
        attach(f"Look at @{name}", tmp_path)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_images_go_as_themselves_named_with_at_or_pasted(tmp_path: Path):
    from tests.gguf_fixtures import noise_png

    (tmp_path / "cat.png").write_bytes(noise_png())
    (tmp_path / "my pics").mkdir()
    (tmp_path / "my pics" / "dog.jpg").write_bytes(noise_png(seed=2))  # a PNG named .jpg
    out = attach("What is @cat.png?", tmp_path)
    assert out.text == "What is @cat.png?" and out.files == ()
    assert [(a.name, a.kind, a.data) for a in out.media] == [("cat.png", "image", noise_png())]
    dragged = f"and '{tmp_path}/my pics/dog.jpg' too"  # a terminal's paste of a dragged file
    assert [a.name for a in attach(dragged, tmp_path).media] == [f"{tmp_path}/my pics/dog.jpg"]
    escaped = f"see {tmp_path}/my\\ pics/dog.jpg"
    assert len(attach(escaped, tmp_path).media) == 1
    assert attach(f"no such {tmp_path}/gone.png here", tmp_path).media == ()  # text, not a file
    with pytest.raises(AttachError, match=r"@gone\.png: no such file"):
        attach("look @gone.png", tmp_path)
    (tmp_path / "fake.wav").write_bytes(b"not audio")
    with pytest.raises(AttachError, match=r"@fake\.wav is not a wav, mp3 or flac file"):
        attach("@fake.wav", tmp_path)
