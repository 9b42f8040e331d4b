"""Tool calls: how a model's template is told about tools, how its replies are read back,
and the grammars that make a required call always parse.

Each model family writes calls its own way, and its chat template says which:

- "hermes" (Hermes, Qwen 2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- "llama3" (Llama 3.1-3.3): a JSON object `{"name": ..., "parameters": {...}}`
- "mistral": `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`
- "generic": a template that knows no tools (the starter's, Gemma's). The server then
  describes the tools in a system message and asks for one JSON object, either
  `{"tool_calls": [{"name": ..., "arguments": {...}}]}` or `{"content": "..."}`; the
  reply is always constrained to that shape, so it always parses. Earlier calls and the
  tools' results are rewritten as assistant and user turns, which every template takes.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from localllm import jsontext
from localllm.backends.base import Message, ToolCall

ToolFormat = Literal["hermes", "llama3", "mistral", "generic"]


def format_for(template: str | None) -> ToolFormat:
    """The tool-call format a chat template speaks."""
    source = template or ""
    if "tools" not in source:
        return "generic"
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or "ipython" in source:
        return "llama3"
    return "generic"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """What the request allows: "auto", "none", "required", or one named function."""

    mode: Literal["auto", "none", "required", "function"] = "auto"
    name: str | None = None
    parallel: bool = True


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """The tools of a request, as the template receives them, and the caller's choice."""

    tools: tuple[dict[str, Any], ...]
    choice: ToolChoice = field(default_factory=ToolChoice)

    def functions(self) -> list[dict[str, Any]]:
        return [t["function"] for t in self.tools]

    def names(self) -> list[str]:
        return [f["name"] for f in self.functions()]

    def offered(self) -> list[dict[str, Any]]:
        """The functions the model may call under the choice."""
        if self.choice.mode == "function":
            return [f for f in self.functions() if f["name"] == self.choice.name]
        return self.functions()


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# -- prompts ------------------------------------------------------------------------


def generic_instructions(spec: ToolSpec) -> str:
    """The system text that teaches a template without tools the JSON reply format."""
    lines = [
        "You can call these tools. Each is described in JSON Schema:",
        *(json.dumps(f, ensure_ascii=False) for f in spec.offered()),
        "",
        "Reply with one JSON object. To call tools, reply "
        '{"tool_calls": [{"name": "<tool name>", "arguments": {<arguments>}}]}; '
        "the results come back in the next message. "
        + (
            "You must call a tool now."
            if spec.choice.mode in ("required", "function")
            else 'To answer the user directly, reply {"content": "<your answer>"}.'
        ),
    ]
    return "\n".join(lines)


def generic_messages(messages: Sequence[Message], spec: ToolSpec | None) -> list[Message]:
    """Messages a template without tool support accepts: the tool description joins the
    system message, an assistant's calls become its JSON reply, and tool results become a
    user turn (consecutive ones merged, so turns still alternate)."""
    out: list[Message] = []
    if spec is not None and spec.choice.mode != "none":
        text = generic_instructions(spec)
        if messages and messages[0].role == "system":
            text = f"{messages[0].content}\n\n{text}"
            messages = messages[1:]
        out.append(Message("system", text))
    for m in messages:
        if m.role == "assistant" and m.tool_calls:
            calls = [{"name": c.name, "arguments": _loads(c.arguments)} for c in m.tool_calls]
            out.append(Message("assistant", json.dumps({"tool_calls": calls}, ensure_ascii=False)))
        elif m.role == "assistant" and spec is not None and spec.choice.mode != "none":
            out.append(Message("assistant", json.dumps({"content": m.content}, ensure_ascii=False)))
        elif m.role == "tool":
            name = f" of {m.name}" if m.name else ""
            call = f" (call {m.tool_call_id})" if m.tool_call_id else ""
            text = f"The result{name}{call}: {m.content}"
            if out and out[-1].role == "user" and out[-1].content.startswith("The result"):
                merged = f"{out[-1].content}\n{text}"
                out[-1] = Message("user", merged, media=(*out[-1].media, *m.media))
            else:
                out.append(Message("user", text, media=m.media))  # a result's pictures too
        else:
            out.append(m)
    return out


def template_message(m: Message) -> dict[str, Any]:
    """A message as Hugging Face templates read it (a call's arguments as an object)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _loads(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _loads(arguments: str) -> Any:
    try:
        return jsontext.loads(arguments)
    except ValueError:
        return arguments


# -- grammars -----------------------------------------------------------------------

# Compact JSON: no free whitespace between tokens, so a model cannot spend its answer on
# newlines (llguidance allows any amount by default).
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Tool schemas are written by agents for cloud APIs and may use keywords the grammar
# engine cannot enforce (uniqueItems, some formats): those are left unenforced (and
# logged) rather than refusing the agent's every request; the rest still holds.
TOOL_OPTIONS = {**JSON_OPTIONS, "lenient": True}


_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else")


def closed(schema: Any) -> Any:
    """A schema whose objects with listed properties take no others unless they say so
    (llama.cpp's grammar converter does the same): a small model otherwise invents keys
    for as long as it may. What it accepts still matches the schema."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [closed(sub) for sub in schema[key]]
    for key in _SCHEMA_ONE:
        if isinstance(schema.get(key), dict):
            out[key] = closed(schema[key])
    if "properties" in schema and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark %json rule for a tool call's schema, compact and lenient (TOOL_OPTIONS)."""
    return "%json " + json.dumps({**schema, "x-guidance": TOOL_OPTIONS})


def _call_schema(function: dict[str, Any], key: str = "arguments") -> dict[str, Any]:
    params = closed(function.get("parameters") or {"type": "object", "properties": {}})
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, key: params},
        "required": ["name", key],
        "additionalProperties": False,
    }


def _any_call(spec: ToolSpec, key: str = "arguments") -> dict[str, Any]:
    calls = [_call_schema(f, key) for f in spec.offered()]
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


# the most calls one constrained reply may make: a small model can otherwise repeat the
# same call until max_tokens
MAX_PARALLEL_CALLS = 8


def _calls_array(spec: ToolSpec, key: str = "arguments") -> dict[str, Any]:
    most = MAX_PARALLEL_CALLS if spec.choice.parallel else 1
    return {"type": "array", "items": _any_call(spec, key), "minItems": 1, "maxItems": most}


def constrained(fmt: ToolFormat, spec: ToolSpec) -> bool:
    """Whether the reply is held to a grammar: always for the generic format, and when a
    call is required (or one function named) for the others."""
    if spec.choice.mode == "none":
        return False
    return fmt == "generic" or spec.choice.mode in ("required", "function")


def lark_grammar(fmt: ToolFormat, spec: ToolSpec, marker: Callable[[str], str]) -> str:
    """A Lark grammar (llguidance's dialect, with %json) for the reply. `marker(text)`
    gives the grammar literal for a control text such as "[TOOL_CALLS]" (a special token
    is written by its id)."""
    if fmt == "generic":
        reply: dict[str, Any] = {
            "type": "object",
            "properties": {"tool_calls": _calls_array(spec)},
            "required": ["tool_calls"],
            "additionalProperties": False,
        }
        if spec.choice.mode == "auto":
            # an answer in text says something: an empty one would be a silent success
            content = {
                "type": "object",
                "properties": {"content": {"type": "string", "minLength": 1}},
                "required": ["content"],
                "additionalProperties": False,
            }
            reply = {"anyOf": [reply, content]}
        return f"start: {json_rule(reply)}\n"
    if fmt == "hermes":
        call = json_rule(_any_call(spec))
        repeat = f"{{1,{MAX_PARALLEL_CALLS}}}" if spec.choice.parallel else ""
        opening, closing = marker("<tool_call>"), marker("</tool_call>")
        return f'start: call{repeat}\ncall: {opening} "\\n" {call} "\\n" {closing} "\\n"?\n'
    if fmt == "mistral":
        return f"start: {marker('[TOOL_CALLS]')} {json_rule(_calls_array(spec))}\n"
    # llama3: one call as a JSON object with "parameters"
    return f"start: {json_rule(_any_call(spec, 'parameters'))}\n"


# -- reading replies ----------------------------------------------------------------


@dataclass(slots=True)
class Parsed:
    content: str = ""
    calls: list[ToolCall] = field(default_factory=list)


def _as_calls(items: Any, names: set[str], key: str = "arguments") -> list[ToolCall] | None:
    """ToolCalls from decoded JSON (a call or a list of them); None when it is not calls
    of offered functions."""
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list) or not items:
        return None
    calls = []
    for item in items:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        args = item.get(key, item.get("arguments", item.get("parameters", {})))
        if isinstance(args, str):
            args = _loads(args)
        calls.append(ToolCall(new_call_id(), item["name"], json.dumps(args, ensure_ascii=False)))
    return calls


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def _hermes_calls(text: str, known: set[str]) -> tuple[list[ToolCall], bool]:
    """The calls of the <tool_call> blocks up to the first that is not a call of an
    offered function, and whether every block was one."""
    calls: list[ToolCall] = []
    for block in _HERMES.findall(text):
        try:
            found = _as_calls(jsontext.loads(block), known)
        except ValueError:
            found = None
        if not found:
            return calls, False
        calls += found
    return calls, True


# A Hermes-family model (Qwen 2.5 Coder above all) often writes a call without its tags:
# the call's JSON alone on a line, mostly in a ```json fence. That is read as the call it
# is when each value is a call of an offered function and nothing but whitespace and
# fences follows it; prose before it stays content.
# an untagged call's head; "{{" too: Qwen2.5's template shows the call as
# {{"name": ..., "arguments": ...}} (a Jinja escape left in its text), and its models copy it
_BARE_HEAD = re.compile(r'(?:^|\n)[ \t]*(?:```(?:json)?[ \t]*\n\s*)?(\{\{?\s*"name"\s*:)')
_GAP = re.compile(r"(?:\s|```(?:json)?)*")
_FENCE_LINE = re.compile(r"```(?:json)?[ \t]*\n\s*")
_FENCE_START = re.compile(r"```(?:j|js|jso|json)?[ \t]*")
_BRACE_START = re.compile(r'\{\{?\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?')


def _bare_calls(text: str, known: set[str], whole: bool = True) -> tuple[int, list[ToolCall]]:
    """Where a reply's untagged calls begin and the calls (none: it has none). `whole`
    False: the reply was cut short, and the calls complete before the cut count."""
    head = _BARE_HEAD.search(text)
    if head is None:
        return len(text), []
    values: list[Any] = []
    i = head.start(1)
    while (i := _skip_gap(text, i)) < len(text):
        doubled = text.startswith("{{", i)  # {{...}}: the object inside the extra braces
        try:
            value, i = jsontext.raw_decode(text, i + doubled)
        except ValueError:
            if whole:
                return len(text), []
            break
        if doubled:
            if not text.startswith("}", i):
                return (len(text), []) if whole else (head.start(), [])
            i += 1
        values += value if isinstance(value, list) else [value]
    return head.start(), _as_calls(values, known) or []


def _skip_gap(text: str, i: int) -> int:
    gap = _GAP.match(text, i)
    return gap.end() if gap else i


def _could_open(line: str) -> bool:
    """Whether `line` (a line start to the end of the text so far) could still grow into
    the head of an untagged call."""
    rest = line.lstrip(" \t")
    if rest.startswith("```"):
        fence = _FENCE_LINE.match(rest)
        if fence is None:
            return _FENCE_START.fullmatch(rest) is not None
        rest = rest[fence.end() :]
    elif "```".startswith(rest):
        return True
    return not rest or _BRACE_START.fullmatch(rest) is not None


def _open_tail(text: str, sent: int) -> int:
    """How many characters at the end of `text` (none before `sent`) could begin an
    untagged call: a fence or an object begun at a line's start, not yet decided."""
    start = text.rfind("\n", 0, sent) + 1  # the line that holds `sent`
    while True:
        if start >= sent and _could_open(text[start:]):
            return len(text) - start
        newline = text.find("\n", start)
        if newline < 0:
            return 0
        start = newline + 1


def until_repeat(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls up to the first that repeats the one before it (same function, same
    arguments): a small model that says the same call again has stopped making progress,
    and the repeat would run the same thing twice."""
    for i in range(1, len(calls)):
        if (calls[i].name, calls[i].arguments) == (calls[i - 1].name, calls[i - 1].arguments):
            return calls[:i]
    return calls


def _complete_items(text: str) -> list[Any]:
    """The whole JSON values at the start of a JSON array's body that was cut short
    (`{"a": 1}, {"b": ...` gives the first object only)."""
    items: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \n\t\r,":
            i += 1
        try:
            value, i = jsontext.raw_decode(text, i)
        except ValueError:
            return items
        items.append(value)


def cut_calls(fmt: ToolFormat, text: str, names: Sequence[str]) -> list[ToolCall]:
    """The calls that were complete in a reply that hit its token limit (the unfinished
    tail is dropped): whole <tool_call> blocks, or the whole items of a call array."""
    known = set(names)
    if fmt == "hermes":
        calls = _hermes_calls(text, known)[0]
        return calls if calls or "<tool_call>" in text else _bare_calls(text, known, False)[1]
    body = text.strip()
    if fmt == "generic":
        head = re.match(r'\{\s*"tool_calls"\s*:\s*\[', body)
        body = body[head.end() :] if head else ""
        key = "arguments"
    elif fmt == "mistral":
        body = body.removeprefix("[TOOL_CALLS]").strip().removeprefix("[")
        key = "arguments"
    else:
        return []  # llama3's one call: cut short, there is none
    return _as_calls(_complete_items(body), known, key) or []


def parse(fmt: ToolFormat, text: str, names: Sequence[str]) -> Parsed:
    """The content and calls in a whole reply. Text that does not parse as calls of the
    offered functions stays content."""
    known = set(names)
    if fmt == "generic":
        try:
            reply = jsontext.loads(text)
        except ValueError:
            return Parsed(text)
        if isinstance(reply, dict) and "tool_calls" in reply:
            made = _as_calls(reply["tool_calls"], known)
            if made:
                return Parsed("", made)
        if isinstance(reply, dict) and isinstance(reply.get("content"), str):
            return Parsed(reply["content"])
        return Parsed(text)
    if fmt == "hermes":
        calls, whole = _hermes_calls(text, known)
        if not whole:
            return Parsed(text)
        if calls:
            return Parsed(_HERMES.sub("", text).strip(), calls)
        at, calls = _bare_calls(text, known)
        return Parsed(text[:at].strip(), calls) if calls else Parsed(text)
    stripped = text.strip()
    if fmt == "mistral":
        body = stripped.removeprefix("[TOOL_CALLS]").strip()
        key = "arguments"
    else:
        body = stripped.removeprefix("<|python_tag|>").strip()
        key = "parameters"
    try:
        found = _as_calls(jsontext.loads(body), known, key)
    except ValueError:
        # Llama 3 may write several calls separated by ";"
        found = None
        if fmt == "llama3" and ";" in body:
            parts = [p for p in body.split(";") if p.strip()]
            try:
                found = _as_calls([jsontext.loads(p) for p in parts], known, key)
            except ValueError:
                found = None
    return Parsed("", found) if found else Parsed(text)


GENERIC_CONTENT = '{"content": "'  # how a generic answer begins (compact JSON: see JSON_OPTIONS)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}


class ReplyReader:
    """Reads a streamed reply: content is passed on as it comes, calls are held until the
    reply ends (a call is only sent whole, as its arguments must parse). A generic answer
    is JSON, `{"content": "..."}`: its string is decoded and passed on as it grows."""

    def __init__(self, fmt: ToolFormat, names: Sequence[str]) -> None:
        self.fmt = fmt
        self.names = list(names)
        self._text = ""
        self._sent = 0  # characters of _text passed on as content
        self._held = False
        self._bare = False  # hermes: held at an untagged call's head
        self._scan = len(GENERIC_CONTENT)  # generic: where the answer's string is read to
        self._decoded = 0  # generic: characters of the answer passed on
        self._closed = False  # generic: the answer's string has ended

    def feed(self, piece: str) -> str:
        """The content that can be passed on after `piece`."""
        self._text += piece
        if self.fmt == "generic":
            return self._generic()
        if self._held:
            return ""
        text = self._text
        if self.fmt == "hermes":
            at = text.find("<tool_call>", self._sent)
            bare = _BARE_HEAD.search(text, max(self._sent - 1, 0))
            if bare is not None and (at < 0 or bare.start() < at):
                at, self._bare = bare.start(), True
            if at >= 0:
                self._held = True
                return self._take(at)
            tail = max(_partial_suffix(text, "<tool_call>"), _open_tail(text, self._sent))
            return self._take(len(text) - tail)
        start = text.lstrip()
        if not start:
            return ""
        if self._sent == 0 and (start[0] in "{[" or start.startswith("<|python_tag|>")):
            self._held = True  # a call, most likely: decided at the end
            return ""
        return self._take(len(text))

    def _generic(self) -> str:
        """The next decoded characters of a generic answer's string (none for calls)."""
        text = self._text
        if self._closed or not text.startswith(GENERIC_CONTENT):
            return ""
        out: list[str] = []
        i = self._scan
        while i < len(text):
            ch = text[i]
            if ch == '"':
                self._closed = True
                break
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            if i + 1 >= len(text):
                break  # the escape is not complete yet
            kind = text[i + 1]
            if kind != "u":
                out.append(_ESCAPES.get(kind, kind))
                i += 2
                continue
            if i + 6 > len(text):
                break
            code = int(text[i + 2 : i + 6], 16)
            if 0xD800 <= code < 0xDC00:  # a surrogate pair: both halves first
                if i + 12 > len(text):
                    break
                low = int(text[i + 8 : i + 12], 16)
                out.append(chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)))
                i += 12
                continue
            out.append(chr(code))
            i += 6
        self._scan = i
        decoded = "".join(out)
        self._decoded += len(decoded)
        return decoded

    def _held_call(self) -> bool:
        """Whether what was held back is a tool call in the making (not an answer)."""
        if self.fmt == "generic":
            return not self._text.startswith(GENERIC_CONTENT)
        return self._held

    def _take(self, end: int) -> str:
        out = self._text[self._sent : end]
        self._sent = max(self._sent, end)
        return out

    def close(self, cut: bool = False) -> Parsed:
        """The rest: content not yet passed on, and the calls (up to the first repeat).
        `cut`: the reply hit its token limit; a call it was writing is dropped, and the
        calls before it are kept, so call JSON never reaches the content."""
        parsed = parse(self.fmt, self._text, self.names)
        if cut and not parsed.calls and self._held_call():
            return Parsed("", until_repeat(cut_calls(self.fmt, self._text, self.names)))
        parsed.calls = until_repeat(parsed.calls)
        if not parsed.calls:
            if self.fmt == "generic":
                if self._decoded:  # streamed as it came (cut short: what was read of it)
                    answered = parsed.content if parsed.content != self._text else ""
                    return Parsed(answered[self._decoded :])
                return Parsed(parsed.content)
            return Parsed(self._text[self._sent :])
        if self._bare:  # what was held is the calls, in their fences
            return Parsed("", parsed.calls)
        if self.fmt == "hermes":
            rest = _HERMES.sub("", self._text[self._sent :]).strip()
            if cut and "<tool_call>" in rest:  # a call it was writing: dropped
                rest = rest[: rest.index("<tool_call>")].strip()
            return Parsed(rest, parsed.calls)
        return Parsed("", parsed.calls)


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of `text` could begin `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def with_spec(messages: Sequence[Message], fmt: ToolFormat, spec: ToolSpec | None) -> list[Message]:
    """The messages to render for a format: rewritten for the generic one."""
    if fmt == "generic":
        return generic_messages(messages, spec)
    return [replace(m) for m in messages]
