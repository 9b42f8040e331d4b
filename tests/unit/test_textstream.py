from localllm.backends.textstream import TextAssembler


def feed(pieces: list[bytes], stop: tuple[str, ...] = ()) -> tuple[list[str], bool]:
    asm = TextAssembler(stop)
    out = []
    for p in pieces:
        out.append(asm.push(p))
        if asm.stopped:
            return out, True
    out.append(asm.flush())
    return out, asm.stopped


def test_multibyte_character_split_across_tokens_is_never_emitted_half():
    data = "a🎉é".encode()
    pieces = [data[i : i + 1] for i in range(len(data))]
    out, _ = feed(pieces)
    assert "".join(out) == "a🎉é"
    assert all("\ufffd" not in s for s in out)
    # the emoji's four bytes produce text only when the last one arrives
    assert out[1:5] == ["", "", "", "🎉"]


def test_stop_string_spanning_tokens_is_removed_with_everything_after():
    out, stopped = feed([b"Hello ", b"wor", b"ld", b"! more"], stop=("world",))
    assert stopped
    assert "".join(out) == "Hello "


def test_held_back_prefix_is_released_when_it_does_not_complete_a_stop():
    out, stopped = feed([b"The wo", b"rm turns"], stop=("world",))
    assert not stopped
    assert out[0] == "The "  # 'wo' might start 'world', so it waits
    assert "".join(out) == "The worm turns"


def test_stop_inside_one_token_and_earliest_of_several():
    out, stopped = feed([b"abcXYZdef"], stop=("def", "XYZ"))
    assert stopped
    assert "".join(out) == "abc"


def test_stop_completed_by_a_later_token():
    asm = TextAssembler(("END",))
    assert asm.push(b"the EN") == "the "
    assert asm.push(b"D") == ""
    assert asm.stopped


def test_invalid_bytes_become_replacement_not_an_exception():
    out, _ = feed([b"ok\xff", b"!"])
    assert "".join(out) == "ok\ufffd!"
