"""The sandbox a model's chat template renders in, bounded in memory while it renders.

A template is code from whoever made the model file. Jinja's immutable sandbox keeps it
from the machine; this keeps it from the memory: no value it builds may weigh more than
MAX_OUTPUT characters, checked before the value is made. Weight is a string's length, a
container's items' weights plus a few characters each (what printing it writes), and
every way a template builds a value is checked: `*`, `+`, `%` and `~`, list, tuple and
dict literals, the filters and string methods that grow text (join, replace, format,
center, ljust, rjust, zfill, expandtabs, indent, wordwrap). Before this, a template that
doubled a 16 MB string (`(['x' * 16000000] * 30) | join`) built 480 M characters before
the bound on the output applied.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateError, nodes, pass_environment, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame
from jinja2.filters import do_indent, do_join, do_replace, do_wordwrap
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_OUTPUT = 16 * 1024 * 1024  # characters of rendered prompt, and of any value on the way
MAX_INT_BITS = 4096  # a template's integer arithmetic: far past any real template's need
_ITEM = 4  # what printing a container writes per item beside it: quotes, comma, space
_WIDE = re.compile(r"[{%][^{}%]*?\d{5,}")  # a format width of 10,000 or more


def weight(value: Any, limit: int = MAX_OUTPUT) -> int:
    """The value's weight, counted until it passes `limit` (then that much and a bit)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, list | tuple | set | frozenset):
            total += _ITEM * len(item)
            stack.extend(item)
        elif isinstance(item, Mapping):
            total += _ITEM * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 1
    return total


def held(value: Any, what: str) -> Any:
    """The value, if it weighs at most MAX_OUTPUT; TemplateError naming `what` else."""
    if weight(value) > MAX_OUTPUT:
        raise TemplateError(f"{what} would be over the output limit ({MAX_OUTPUT:,} characters)")
    return value


def _ahead(size: int, what: str) -> None:
    if size > MAX_OUTPUT:
        raise TemplateError(f"{what} would be over the output limit ({MAX_OUTPUT:,} characters)")


def _format_ahead(fmt: str, args: Any, what: str) -> None:
    if _WIDE.search(fmt):
        raise TemplateError(f"{what} asks for a width over the output limit")
    _ahead(len(fmt) + weight(args), what)


class _Generator(CodeGenerator):
    """Jinja's code generator, with `~` and list, tuple and dict literals checked."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.held(")
        super().visit_List(node, frame)
        self.write(", 'a list')")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx == "store":  # a loop's or an assignment's targets
            super().visit_Tuple(node, frame)
            return
        self.write("environment.held(")
        super().visit_Tuple(node, frame)
        self.write(", 'a tuple')")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.held(")
        super().visit_Dict(node, frame)
        self.write(", 'a dict')")


class Bounded(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every value a template builds held to MAX_OUTPUT."""

    code_generator_class = _Generator
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters.update(
            join=_join, replace=_replace, indent=_indent, center=_center, wordwrap=_wordwrap
        )
        self.filters["format"] = _format

    @staticmethod
    def held(value: Any, what: str) -> Any:
        return held(value, what)

    @staticmethod
    def bounded_concat(parts: Sequence[Any]) -> str:
        texts = [p if isinstance(p, str) else str(held(p, "a value joined with ~")) for p in parts]
        _ahead(sum(len(t) for t in texts), "joining text with ~")
        return "".join(texts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**":
            both_ints = isinstance(right, int) and isinstance(left, int)
            if both_ints and (abs(right) > 256 or left.bit_length() * right > MAX_INT_BITS):
                raise TemplateError(f"a power with exponent {right} is too large to compute")
            return left**right
        if operator == "+":
            if isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
                _ahead(weight(left) + weight(right), "adding them")
            return left + right
        if operator == "%":
            if isinstance(left, str):
                _format_ahead(left, right, "formatting with %")
            return left % right
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateError("a product too large to compute")
            return left * right
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | list | tuple) and isinstance(times, int):
                _ahead(weight(seq) * max(times, 0), f"repeating {len(seq)} items {times} times")
        return left * right

    def wrap_str_format(self, value: Any) -> Any:
        """The sandbox's str.format and format_map, checked before they run."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text = value.__self__

        def checked(*args: Any, **kwargs: Any) -> str:
            _format_ahead(text, (args, kwargs), f"str.{value.__name__}")
            result: str = wrapped(*args, **kwargs)
            return result

        return checked

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str):
            args = _method_ahead(owner, name, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def _method_ahead(
    text: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Refuse a string method whose result would pass the limit, before it runs; its
    arguments (an iterator given to join is read here, once)."""
    what = f"str.{name}"
    if name == "join" and args:
        items = list(args[0])
        _ahead(weight(items) + len(text) * len(items), what)
        return (items, *args[1:])  # an iterator is read once: checked, then joined
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str):
        count = text.count(args[0]) if args[0] else len(text) + 1
        _ahead(len(text) + count * len(str(args[1])), what)
    elif name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        _ahead(args[0], what)
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        _ahead(len(text) + text.count("\t") * max(size, 0), what)
    return args


@pass_eval_context
def _join(context: Any, value: Any, d: str = "", attribute: Any = None) -> str:
    items = list(value)
    _ahead(weight(items) + len(d) * len(items), "join")
    return do_join(context, items, d, attribute)


@pass_eval_context
def _replace(context: Any, s: str, old: str, new: str, count: int | None = None) -> str:
    n = str(s).count(old) if old else len(str(s)) + 1
    _ahead(len(str(s)) + min(n, count if count is not None else n) * len(str(new)), "replace")
    return do_replace(context, s, old, new, count)


def _format(value: str, *args: Any, **kwargs: Any) -> str:
    _format_ahead(value, (args, kwargs), "format")
    if args and kwargs:
        raise TemplateError("format takes positional or keyword arguments, not both")
    return value % (kwargs or args)


def _indent(text: str, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    """Jinja's `indent`, refusing an output over the limit before making it."""
    pad = width if isinstance(width, str) else " " * max(0, min(int(width), MAX_OUTPUT + 1))
    _ahead(len(text) + len(pad) * (text.count("\n") + 1), f"an indent of {len(pad)} characters")
    return do_indent(text, pad, first, blank)


def _center(text: str, width: int = 80) -> str:
    _ahead(width, f"centering in {width} characters")
    return text.center(width)


@pass_environment
def _wordwrap(environment: Any, s: str, width: int = 79, *args: Any, **kwargs: Any) -> str:
    _ahead(len(s) * 2, "wordwrap")
    return do_wordwrap(environment, s, width, *args, **kwargs)
