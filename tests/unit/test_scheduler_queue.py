"""The scheduler's queue without a model: what counts as work for the worker."""

from __future__ import annotations

from typing import Any, NoReturn


def test_a_request_held_back_gives_the_worker_nothing_to_do():
    """A ready request behind a deterministic one whose prompt is still being read does
    not count as work (the worker would spin on it until the tokenizer answers)."""
    import threading
    from types import SimpleNamespace

    from localllm.backends.base import SamplingParams
    from localllm.engine.scheduler import Scheduler

    def job(deterministic: bool, ready: bool) -> Any:  # the fields the queue reads of a Job
        request = SimpleNamespace(priority=None, params=SamplingParams(), messages=[],
                                  deterministic=deterministic)
        return SimpleNamespace(request=request, cancel=threading.Event(), ready=ready)

    def never(*_: object) -> NoReturn:
        raise AssertionError("nothing may start")

    hooks = SimpleNamespace(admit=never, prepare=never, ended=never)
    sched = Scheduler(SimpleNamespace(n_seq=2), hooks)
    first, second = job(True, False), job(False, True)
    sched.add(first)
    sched.add(second)
    assert not sched.busy
    first.ready = True
    assert sched.busy
    first.ready = False
    second.cancel.set()  # a cancelled one behind waits too: it is ended once the line moves
    assert not sched.busy
    plain = Scheduler(SimpleNamespace(n_seq=2), hooks)
    plain.add(job(False, False))
    plain.add(job(False, True))
    assert plain.busy  # a plain request being read holds back nobody
