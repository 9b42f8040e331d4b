"""Render a model's chat template (Jinja, from the GGUF or tokenizer metadata).

A template comes with the model file, so it is code from whoever made the file. It runs
in Jinja's immutable sandbox, and within bounds: at most RENDER_SECONDS of time (a
watchdog raises in the rendering thread, which stops any loop written in Jinja), and
at most MAX_OUTPUT characters in any value it builds on the way, the output included
(backends/template_bounds.py).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from types import TracebackType
from typing import Any, NoReturn

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension
from jinja2.parser import Parser

from localllm.backends.base import Message
from localllm.backends.template_bounds import MAX_OUTPUT, Bounded
from localllm.backends.tools import template_message
from localllm.errors import InvalidRequest

# Used when a model carries no template: ChatML, the most common instruct format.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


RENDER_SECONDS = 5.0


class RenderTimeout(Exception):
    """Raised inside a rendering thread by the watchdog."""


class _Watchdog:
    """Raise RenderTimeout in this thread if the block runs past `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._done = False
        self._fired = False
        self._tid = threading.get_ident()

    def __enter__(self) -> _Watchdog:
        _WATCHER.add(self)
        return self

    def fire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._fired = True
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._tid), ctypes.py_object(RenderTimeout)
            )

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _WATCHER.remove(self)
        with self._lock:
            self._done = True
            if self._fired:  # fired after the block's last bytecode: take the exception back
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._tid), None)


class _Watcher:
    """One thread that fires every render's watchdog that runs late. A timer thread per
    render took 0.1 ms to start on an idle machine, and a request's render took 2.2 ms
    in all (0.5 ms alone) while llama.cpp's threads held both cores here."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watched: set[_Watchdog] = set()
        self._thread: threading.Thread | None = None

    def add(self, dog: _Watchdog) -> None:
        with self._cond:
            self._watched.add(dog)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="localllm-render-watch", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def remove(self, dog: _Watchdog) -> None:
        with self._cond:
            self._watched.discard(dog)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for dog in [d for d in self._watched if d.deadline <= now]:
                    self._watched.discard(dog)
                    dog.fire()
                soonest = min((d.deadline for d in self._watched), default=None)
                self._cond.wait(None if soonest is None else soonest - now)


_WATCHER = _Watcher()


def _raise(message: str) -> NoReturn:
    raise InvalidRequest(
        f"The model's chat template rejected the messages: {message}", param="messages"
    )


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
    ensure_ascii: bool = False,
) -> str:
    """JSON as Hugging Face's templates expect it: no HTML escaping (Jinja's own tojson
    writes < as \u003c) and no ASCII escaping."""
    return json.dumps(
        value, indent=indent, separators=separators, sort_keys=sort_keys, ensure_ascii=ensure_ascii
    )


class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}`: Hugging Face marks the assistant's part for
    training masks with it; for a prompt its body renders as is."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's declared type)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    env = Bounded(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", _Generation]
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render(
    template: str | None,
    messages: Sequence[Message],
    *,
    bos_token: str,
    eos_token: str,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for `messages`, ending where the assistant's answer begins.
    `variables` (tools, enable_thinking, ...) are passed to the template as well."""
    try:
        compiled = _compile(template or CHATML)
        with _Watchdog(RENDER_SECONDS):
            return _bounded_text(
                compiled.generate(
                    {
                        **(variables or {}),
                        "messages": [template_message(m) for m in messages],
                        "add_generation_prompt": True,
                        "bos_token": bos_token,
                        "eos_token": eos_token,
                    }
                )
            )
    except InvalidRequest:
        raise
    except RenderTimeout:
        raise InvalidRequest(
            f"The model's chat template did not finish rendering in {RENDER_SECONDS:.0f} s "
            "(its loops may not end); the model file's template needs fixing",
            param="messages",
            code="template_failed",
        ) from None
    except (TemplateError, RecursionError, MemoryError, OverflowError, ValueError) as exc:
        raise InvalidRequest(
            f"The model's chat template failed to render: {exc}",
            param="messages",
            code="template_failed",
        ) from None


def _bounded_text(parts: Iterator[str]) -> str:
    out: list[str] = []
    size = 0
    for part in parts:
        size += len(part)
        if size > MAX_OUTPUT:
            raise TemplateError(f"its output passed {MAX_OUTPUT} characters")
        out.append(part)
    return "".join(out)
