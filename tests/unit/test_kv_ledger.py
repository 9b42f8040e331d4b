"""The KV ledger's record of the batches that read a prompt's last token (common.KVLedger):
what a rerun reads again, and the logits it may sample from instead, through cuts, copies
and saved states."""

from __future__ import annotations

import dataclasses

from localllm.backends.base import KVSnapshot
from localllm.backends.common import KVLedger

PROMPT = list(range(100, 130))  # 30 tokens


ROW = object()  # the logits a backend kept (the ledger only holds them)


def first_run(cached: int = 10) -> KVLedger:
    """A ledger after a run of PROMPT that found `cached` tokens, read the rest in one
    step (keeping the logits of its last token) and answered three tokens."""
    kv = KVLedger()
    kv.append(PROMPT[:cached], exact=False)
    kv.append(PROMPT[cached:], exact=False, final=True, row=ROW)
    kv.append([7, 8, 9], exact=False)
    return kv


def test_a_rerun_reads_the_last_batch_again():
    kv = first_run()
    assert kv.finals == [(10, 30)]
    assert kv.reread(PROMPT) == 10
    assert kv.reread(PROMPT[:-1]) == 29  # another prompt: no constraint
    assert kv.reread([*PROMPT[:-1], 5]) == 10  # the same prefix: reading from 10 is harmless


def test_a_cut_before_the_prompt_s_last_token_keeps_the_record():
    """Reuse never keeps a prompt's last token (it is read for its logits), so the cache
    a rerun finds ends one before the batch's end; a cut further back drops it."""
    kv = first_run()
    kv.cut(29)
    assert kv.reread(PROMPT) == 10
    kv.cut(28)
    assert kv.finals == [] and kv.reread(PROMPT) == 30


def test_copies_and_saved_states_carry_the_record():
    src = first_run()
    dst = KVLedger()
    dst.copied(src, 29)
    assert dst.reread(PROMPT) == 10
    dst.copied(src, 20)
    assert dst.reread(PROMPT) == 30
    restored = KVLedger()
    restored.restored(KVSnapshot(tuple(PROMPT[:29]), 0, None, finals=tuple(src.finals)))
    assert restored.reread(PROMPT) == 10
    restored.clear()
    assert restored.finals == [] and restored.reread(PROMPT) == 30


def test_a_picture_in_the_last_batch_is_not_read_again():
    """A picture (stand-in ids below zero) is read in a call of its own: the batch that
    gave the logits is the text after it."""
    kv = KVLedger()
    kv.append([1, 2, -50, -51, -52, 3, 4], exact=False, final=True)
    assert kv.finals == [(5, 7)]


def test_each_turn_of_a_conversation_keeps_its_record():
    kv = first_run()
    follow = [*PROMPT, 7, 8, 9, 40, 41, 42]
    kv.cut(32)  # the answer's last token was not read
    kv.append(follow[32:], exact=False, final=True)
    assert kv.finals == [(10, 30), (32, 36)]
    assert kv.reread(follow) == 32 and kv.reread(PROMPT) == 10


def test_the_kept_logits_answer_only_the_whole_prompt_they_came_from():
    kv = first_run()
    assert kv.resume(PROMPT) is ROW  # the answer after it is the caller's to cut
    assert kv.resume(PROMPT[:-1]) is None
    assert kv.resume([*PROMPT[:-1], 5]) is None
    assert kv.resume([*PROMPT, 7]) is None  # a longer prompt reads its new tokens
    kv.cut(30)
    assert kv.resume(PROMPT) is ROW
    kv.cut(29)  # the prompt's last token left the cache: its logits go with it
    assert kv.kept is None and kv.resume(PROMPT) is None
    assert kv.reread(PROMPT) == 10  # the batch is still recorded


def test_kept_logits_follow_copies_of_the_whole_prompt_and_states_saved_in_ram():
    src = first_run()
    dst = KVLedger()
    dst.copied(src, 33)
    assert dst.resume(PROMPT) is ROW
    dst.copied(src, 29)
    assert dst.resume(PROMPT) is None
    saved = src.saved(0, None)
    restored = KVLedger()
    restored.restored(saved)
    assert restored.tokens == src.tokens and restored.resume(PROMPT) is ROW
    restored.restored(dataclasses.replace(saved, kept=None))  # as a state read from disk
    assert restored.resume(PROMPT) is None and restored.reread(PROMPT) == 10
    src.cut(29)
    assert src.saved(0, None).kept is None
    src.clear()
    assert src.kept is None


def test_a_later_prompt_s_logits_replace_the_earlier_ones():
    kv = first_run()
    follow = [*PROMPT, 7, 8, 9, 40, 41, 42]
    later = object()
    kv.append(follow[33:], exact=False, final=False, row=later)  # read beside others
    assert kv.resume(follow) is later and kv.resume(PROMPT) is None


def test_a_saved_state_counts_its_kept_logits_in_ram():
    import numpy as np

    kv = KVLedger()
    kv.append(PROMPT, exact=False, row=np.zeros(1000, np.float32))
    assert kv.saved(5000, None).ram_bytes == 5000 + 4000
    kv.cut(10)
    assert kv.saved(5000, None).ram_bytes == 5000
