"""A model's chat template is code from the model file: a hostile one is stopped in time,
in output size and in one-step allocations, with a 400 that says so."""

from __future__ import annotations

import threading

import pytest

from localllm.backends import chat_template
from localllm.backends.base import Message
from localllm.errors import InvalidRequest

MESSAGES = [Message("user", "hi")]


def render(template: str) -> str:
    return chat_template.render(template, MESSAGES, bos_token="<s>", eos_token="</s>")


def test_endless_nested_loops_are_stopped(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.5)
    loops = ("{% for a in range(100000) %}{% for b in range(100000) %}"
             "{% for c in range(100000) %}{% endfor %}{% endfor %}{% endfor %}")
    with pytest.raises(InvalidRequest) as err:
        render(loops)
    assert "did not finish rendering" in err.value.message
    assert err.value.code == "template_failed"
    # the thread is usable afterwards: no exception is left pending for it
    assert render("{{ messages[0]['content'] }}!") == "hi!"


def test_renders_share_one_watchdog_thread(monkeypatch: pytest.MonkeyPatch):
    """A thread started per render cost a request milliseconds while llama.cpp's threads
    held the cores; one watcher thread serves every render, also renders at once."""
    started: list[str] = []
    real = threading.Thread.start

    def start(self: threading.Thread) -> None:
        started.append(self.name)
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    results: list[str] = []
    echo = "{{ messages[0]['content'] }}"
    renders = [threading.Thread(target=lambda: results.append(render(echo))) for _ in range(4)]
    for t in renders:
        real(t)
    for t in renders:
        t.join()
    for _ in range(20):
        assert render(echo) == "hi"
    assert results == ["hi"] * 4
    assert set(started) <= {"localllm-render-watch"} and len(started) <= 1


def test_output_is_bounded(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(chat_template, "MAX_OUTPUT", 10_000)
    with pytest.raises(InvalidRequest) as err:
        render("{% for a in range(100000) %}{{ 'xxxxxxxxxx' }}{% endfor %}")
    assert "output passed 10000 characters" in err.value.message


@pytest.mark.parametrize("expr", ["'a' * 10**10", "[1] * 100000000", "9 ** 100000"])
def test_one_huge_operation_is_refused(expr: str):
    with pytest.raises(InvalidRequest) as err:
        render("{{ " + expr + " }}")
    assert "too large" in err.value.message or "over the" in err.value.message


@pytest.mark.parametrize("template", [
    "{% set x = 9 ** 256 %}{{ x ** 256 }}",  # each power small, the chain enormous
    "{% set ns = namespace(v=9 ** 256) %}{% for i in range(64) %}"
    "{% set ns.v = ns.v * ns.v %}{% endfor %}{{ ns.v }}",
    "{{ '%d' % (9 ** 250 * 9 ** 250 * 9 ** 250 * 9 ** 250 * 9 ** 250 * 9 ** 250) }}",
])
def test_integers_that_grow_without_bound_are_refused(template: str):
    # before: Python's "Exceeds the limit (4300 digits)" as a 500, or minutes of work
    with pytest.raises(InvalidRequest) as err:
        render(template)
    assert "too large" in err.value.message and err.value.code == "template_failed"
    assert "4300" not in err.value.message


@pytest.mark.parametrize("template", ["{{ ('x\n' * 100000) | indent(1000) }}",
                                      "{{ ('x\n' * 1000) | indent(' ' * 100000) }}",
                                      "{{ 'x' | center(100000000) }}"])
def test_padding_filters_are_bounded_before_they_allocate(template: str):
    with pytest.raises(InvalidRequest) as err:
        render(template)
    assert "output limit" in err.value.message


def test_the_padding_filters_still_work():
    assert render("{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|"
                  "{{ 'ab' | center(6) }}") == "a\n  b|  a\n  b|  ab  "


def test_a_template_stopped_on_one_thread_leaves_others_alone(monkeypatch):
    monkeypatch.setattr(chat_template, "RENDER_SECONDS", 0.3)
    results: list[str] = []

    def normal() -> None:
        for _ in range(200):
            results.append(render("{% for m in messages %}{{ m['content'] }}{% endfor %}"))

    t = threading.Thread(target=normal)
    t.start()
    with pytest.raises(InvalidRequest):
        render("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
               "{% endfor %}")
    t.join()
    assert results == ["hi"] * 200


@pytest.mark.parametrize("template", [
    "{{ (['x' * 16000000] * 30) | join }}",  # round 4: 480 M characters before any bound
    "{{ ['x' * 16000000] * 30 }}",
    "{{ ['x' * 9000000, 'y' * 9000000] }}",
    "{% set s = 'x' * 9000000 %}{{ s ~ s }}",
    "{% set s = 'x' * 9000000 %}{{ s + s }}",
    "{% set s = 'x' * 9000000 %}{{ (s, s) }}",
    "{% set s = 'x' * 9000000 %}{{ {'a': s, 'b': s} }}",
    "{% set s = 'x' * 9000000 %}{{ '%s%s' % (s, s) }}",
    "{{ '%099999999d' % 1 }}",
    "{% set s = 'x' * 9000000 %}{{ s.replace('x', 'xx') }}",
    "{% set s = 'x' * 9000000 %}{{ s | replace('x', 'xx') }}",
    "{% set s = 'x' * 9000000 %}{{ '-'.join([s, s]) }}",
    "{% set s = 'x' * 9000000 %}{{ '{}{}'.format(s, s) }}",
    "{{ 'x'.ljust(99999999) }}",
    "{{ ('\t' * 1000000).expandtabs(100) }}",
    "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(30) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
])
def test_values_are_bounded_while_the_template_renders(template: str):
    """No value a template builds may pass the output limit, checked before it is built:
    the peak of Python's allocations stays near the largest value allowed (the 16 MB
    strings the templates start from), never the hundreds of MB they asked for."""
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest) as err:
            render(template)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "output limit" in err.value.message and err.value.code == "template_failed"
    assert peak < 64 * 1024 * 1024, peak


def test_what_real_templates_do_still_renders():
    """Joins, concatenation, formatting and literals of ordinary size are untouched."""
    out = render(
        "{% set parts = ['a', 'b'] %}{{ parts | join(', ') }}|{{ '-'.join(parts) }}|"
        "{{ 'x' ~ 1 ~ none }}|{{ [1, 2] + [3] }}|{{ '%s=%d' % ('n', 2) }}|"
        "{{ '{}!'.format('hi') }}|{{ {'k': (1, 2)} }}|{{ 'ab' | replace('a', 'c') }}|"
        "{% for a, b in [(1, 2)] %}{{ a + b }}{% endfor %}|{{ 'x' | format() }}"
    )
    assert out == "a, b|a-b|x1None|[1, 2, 3]|n=2|hi!|{'k': (1, 2)}|cb|3|x"
