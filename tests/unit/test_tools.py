"""Tool calls without a model: formats, replies read per family, streamed reading, the
generic format's rewritten turns, and the grammars that constrain a required call."""

from __future__ import annotations

import json

import pytest

from localllm.backends import chat_template, tools
from localllm.backends.base import Message, ToolCall
from localllm.backends.tools import ReplyReader, ToolChoice, ToolSpec
from localllm.engine import grammar
from localllm.errors import InvalidRequest

WEATHER = {
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]},
}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {}}}


def spec(mode: str = "auto", name: str | None = None, parallel: bool = True) -> ToolSpec:
    return ToolSpec(
        tuple({"type": "function", "function": f} for f in (WEATHER, TIME)),
        ToolChoice(mode, name, parallel),  # type: ignore[arg-type]
    )


def test_format_from_template():
    assert tools.format_for(None) == "generic"
    assert tools.format_for("{{ messages }}") == "generic"
    assert tools.format_for("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert tools.format_for("{% if tools %}[TOOL_CALLS]{% endif %}") == "mistral"
    assert tools.format_for("{% if tools %}<|python_tag|>{% endif %}") == "llama3"


def test_each_family_is_read():
    names = ["get_weather", "get_time"]
    hermes = tools.parse(
        "hermes",
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        names,
    )
    assert hermes.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in hermes.calls] == [
        ("get_weather", {"city": "Oslo"}), ("get_time", {})]
    llama = tools.parse("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', names)
    assert [(c.name, c.arguments) for c in llama.calls] == [("get_weather", '{"city": "Oslo"}')]
    mistral = tools.parse(
        "mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', names)
    assert [c.name for c in mistral.calls] == ["get_time"] and mistral.content == ""
    generic = tools.parse(
        "generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}',
        names)
    assert [c.name for c in generic.calls] == ["get_weather"]
    assert tools.parse("generic", '{"content": "Hello"}', names).content == "Hello"
    # a call of a function that was not offered, or broken JSON, stays text
    assert tools.parse("llama3", '{"name": "rm_rf", "parameters": {}}', names).calls == []
    assert tools.parse("hermes", "<tool_call>{oops</tool_call>", names).content.startswith("<")
    assert all(c.id.startswith("call_") for c in hermes.calls)
    assert len({c.id for c in hermes.calls}) == 2


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "generic"])
def test_a_reply_nested_past_pythons_stack_stays_text(fmt: tools.ToolFormat):
    """json.loads raises RecursionError, not ValueError, for 100,000 brackets: a model (or
    a remote engine) writing them in a call was a 500. It is text that is not a call."""
    deep = "[" * 100_000
    for text in (
        f'<tool_call>{{"name": "get_time", "arguments": {deep}</tool_call>',
        f'{{"name": "get_time", "parameters": {deep}}}',
        f"[TOOL_CALLS]{deep}",
        f'{{"tool_calls": {deep}}}',
        deep,
    ):
        parsed = tools.parse(fmt, text, ["get_time"])
        assert parsed.calls == [] and parsed.content
        tools.cut_calls(fmt, text, ["get_time"])  # a reply cut short: no call, no crash
    for cut in (False, True):
        reader = ReplyReader(fmt, ["get_time"])
        reader.feed('<tool_call>{"name": "get_time", "arguments": ' + deep)
        assert not reader.close(cut=cut).calls


def test_streamed_reply_passes_content_and_holds_calls():
    reader = ReplyReader("hermes", ["get_weather"])
    out = [reader.feed(p) for p in ["Sure", ", one moment.", "\n<tool", "_call>\n{\"name\": ",
                                     '"get_weather", "arguments": {"city": "Oslo"}}',
                                     "\n</tool_call>"]]
    assert "".join(out) == "Sure, one moment.\n"
    assert out[2] == "\n"  # "<tool" could begin a call: held back until it is known
    rest = reader.close()
    assert rest.content == "" and [c.name for c in rest.calls] == ["get_weather"]
    plain = ReplyReader("hermes", ["get_weather"])
    text = [plain.feed("Just <b>text</b>"), plain.feed(" here <tool")]
    assert "".join(text) + plain.close().content == "Just <b>text</b> here <tool"
    generic = ReplyReader("generic", ["get_weather"])
    assert generic.feed('{"content": "Hi there"}') == "Hi there"
    assert generic.close().content == ""


def test_a_generic_answer_streams_as_it_grows():
    reader = ReplyReader("generic", ["get_weather"])
    pieces = ['{"con', 'tent": "Hel', 'lo \\"wor', 'ld\\" \\u00e9\\', "n", "\\ud83d",
              "\\ude00", ' bye"}']
    out = [reader.feed(p) for p in pieces]
    assert out[:3] == ["", "Hel", 'lo "wor']
    assert "".join(out) + reader.close().content == 'Hello "world" \u00e9\n\U0001f600 bye'
    cut = ReplyReader("generic", [])
    assert cut.feed('{"content": "half an ans') == "half an ans"
    assert cut.close().content == ""  # cut short by max_tokens: nothing more to add
    call = ReplyReader("generic", ["get_weather"])
    assert call.feed('{"tool_calls": [{"name": "get_weather", "arguments": {}}]}') == ""
    assert [c.name for c in call.close().calls] == ["get_weather"]


def test_generic_turns_alternate_for_a_strict_template():
    history = [
        Message("system", "Be brief."),
        Message("user", "Weather in Oslo and Rome?"),
        Message("assistant", "", tool_calls=(
            ToolCall("call_1", "get_weather", '{"city": "Oslo"}'),
            ToolCall("call_2", "get_weather", '{"city": "Rome"}'))),
        Message("tool", "3 C", tool_call_id="call_1", name="get_weather"),
        Message("tool", "19 C", tool_call_id="call_2", name="get_weather"),
    ]
    out = tools.generic_messages(history, spec())
    assert [m.role for m in out] == ["system", "user", "assistant", "user"]
    assert out[0].content.startswith("Be brief.\n\nYou can call these tools")
    assert json.loads(out[2].content) == {"tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}}]}
    assert "3 C" in out[3].content and "19 C" in out[3].content
    # a template that refuses any role but user and model takes the rewritten turns
    text = chat_template.render(GEMMA_LIKE, out, bos_token="<bos>", eos_token="<eos>")
    assert text.count("<start_of_turn>user") == 2 and text.endswith("<start_of_turn>model\n")
    with pytest.raises(InvalidRequest, match="alternate"):
        chat_template.render(GEMMA_LIKE, history[1:], bos_token="",
                             eos_token="")


def test_grammars_compile_for_every_format():
    for fmt in ("hermes", "llama3", "mistral", "generic"):
        for s in (spec("required"), spec("function", "get_time", parallel=False), spec()):
            if not tools.constrained(fmt, s):
                continue
            source = tools.lark_grammar(fmt, s, json.dumps)
            grammar.from_lark(source, param="tools")  # raises when llguidance refuses it
    assert not tools.constrained("hermes", spec("auto"))
    assert tools.constrained("generic", spec("auto"))
    assert not tools.constrained("generic", spec("none"))


def test_a_generic_answer_in_text_is_never_empty(tmp_path):
    """tool_choice auto on a model without a tool template: the reply is a call list or
    {"content": "..."}, and the grammar does not let the content be empty (a small model
    would otherwise answer nothing and it would pass as a success)."""
    from localllm.backends.base import LoadOptions
    from localllm.backends.fake import FakeModel, Script, write_fake_model

    model = FakeModel(write_fake_model(tmp_path / "fake.gguf"), LoadOptions(), Script())
    source = tools.lark_grammar("generic", spec("auto"), json.dumps)
    constraint = grammar.Constraint(model, grammar.from_lark(source, param="tools"))
    for byte in b'{"content": "':
        assert constraint.allowed()[byte], chr(byte)
        constraint.accept(byte)
    allowed = constraint.allowed()
    assert not allowed[ord('"')]  # the string may not close at once
    assert allowed[ord("O")] and allowed[ord(" ")]


def test_closed_schema_keeps_what_it_says():
    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "b": {"type": "object", "properties": {}, "additionalProperties": True},
        "properties": {"type": "array", "items": {"type": "object", "properties": {}}}}}
    out = tools.closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["b"]["additionalProperties"] is True
    assert "additionalProperties" not in out["properties"]["properties"]  # a property's name
    assert out["properties"]["properties"]["items"]["additionalProperties"] is False


def test_unsupported_schema_is_named():
    with pytest.raises(InvalidRequest, match="uniqueItems"):
        grammar.from_json_schema({"type": "array", "uniqueItems": True})
    with pytest.raises(InvalidRequest, match="uri-reference"):
        grammar.from_json_schema({"type": "string", "format": "uri-reference"})


# A Gemma-style template (written for this test): only user and model turns, strictly
# alternating, a system message folded into the first user turn.
GEMMA_LIKE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] + '\n\n' %}{% set rest = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}"
    "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant') }}"
    "{% endif %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + m['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)



def read(fmt: str, text: str, *, cut: bool) -> tools.Parsed:
    reader = ReplyReader(fmt, ["get_weather", "get_time"])  # type: ignore[arg-type]
    shown = reader.feed(text)
    rest = reader.close(cut=cut)
    return tools.Parsed(shown + rest.content, rest.calls)


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
LONDON = '{"name": "get_weather", "arguments": {"city": "London"}}'


@pytest.mark.parametrize("fmt, text", [
    ("generic", '{"tool_calls": [' + PARIS + ", " + LONDON + ', {"name": "get_we'),
    ("hermes", f"<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{LONDON}\n</tool_call>\n"
               '<tool_call>\n{"name": "get_'),
    ("mistral", "[TOOL_CALLS][" + PARIS + ", " + LONDON + ', {"name": '),
    ("hermes", f"```json\n{PARIS}\n```\n```json\n{LONDON}\n```\n```json\n" + '{"name": "get_'),
])
def test_a_reply_cut_by_its_limit_keeps_the_calls_it_finished(fmt: str, text: str):
    parsed = read(fmt, text, cut=True)
    assert [json.loads(c.arguments)["city"] for c in parsed.calls] == ["Paris", "London"]
    assert parsed.content == ""  # the unfinished call never reaches the content


def test_a_reply_cut_inside_its_first_call_has_no_calls_and_no_json():
    parsed = read("generic", '{"tool_calls": [{"name": "get_weather", "argu', cut=True)
    assert parsed.calls == [] and parsed.content == ""


def test_a_cut_generic_answer_keeps_its_text():
    parsed = read("generic", '{"content": "It is sunny in Par', cut=True)
    assert parsed.content == "It is sunny in Par" and parsed.calls == []


def test_a_repeated_call_ends_the_list():
    text = '{"tool_calls": [' + ", ".join([PARIS, PARIS, LONDON]) + "]}"
    parsed = read("generic", text, cut=False)
    assert [json.loads(c.arguments)["city"] for c in parsed.calls] == ["Paris"]
    # different calls in a row are kept
    text = '{"tool_calls": [' + ", ".join([PARIS, LONDON, PARIS]) + "]}"
    assert len(read("generic", text, cut=False).calls) == 3


def test_one_call_unless_parallel_is_asked():
    single = tools.lark_grammar("generic", spec("required", parallel=False), str)
    several = tools.lark_grammar("generic", spec("required", parallel=True), str)
    assert '"maxItems": 1' in single
    assert f'"maxItems": {tools.MAX_PARALLEL_CALLS}' in several


def stream(text: str, names: list[str], size: int = 3) -> tuple[list[str], tools.Parsed]:
    """`text` fed to a Hermes reader a few characters at a time: what it passed on at each
    piece, and what it gave at the end."""
    reader = ReplyReader("hermes", names)
    shown = [reader.feed(text[i : i + size]) for i in range(0, len(text), size)]
    return shown, reader.close()


# Qwen2.5-Coder-1.5B-Instruct's reply to Codex CLI's "create hello.txt" request
# (2026-12-06, .ci/clients.py): its call without <tool_call> tags, in a json fence
CODER_CALL = (
    "```json\n{\n"
    '  "name": "exec_command",\n'
    '  "arguments": {\n    "cmd": "echo \'hello from localllm\' > hello.txt",\n'
    '    "shell": "bash"\n  }\n}\n```'
)


def test_an_untagged_hermes_call_in_a_fence_is_a_call():
    parsed = tools.parse("hermes", CODER_CALL, ["exec_command"])
    assert parsed.content == "" and [c.name for c in parsed.calls] == ["exec_command"]
    assert json.loads(parsed.calls[0].arguments)["cmd"].startswith("echo")
    shown, rest = stream("I will write it.\n" + CODER_CALL, ["exec_command"])
    assert "".join(shown) + rest.content == "I will write it.\n"  # no JSON reaches the text
    assert [c.name for c in rest.calls] == ["exec_command"]
    # bare, without a fence, and two calls, each in its fence
    assert len(tools.parse("hermes", PARIS, ["get_weather"]).calls) == 1
    two = f"```json\n{PARIS}\n```\n\n```json\n{LONDON}\n```\n"
    shown, rest = stream(two, ["get_weather"])
    assert "".join(shown) == "" and len(rest.calls) == 2


def test_json_that_is_not_an_offered_call_stays_text_and_is_all_passed_on():
    for text in [
        CODER_CALL,  # a function that was not offered
        CODER_CALL + "\nThis writes the file.",  # prose after it: an example, not a call
        '```json\n{"name": "Ada", "age": 36}\n```',
        "```python\nprint({'name': 1})\n```\nDone.",
        '{"city": "Oslo"}\n{"name"',
        "Use ``` for code.\n`x` and {braces}\n",
    ]:
        for size in (1, 3, 1000):
            shown, rest = stream(text, ["get_weather"], size)
            assert "".join(shown) + rest.content == text and rest.calls == []
    # a fence of another language is passed on as soon as its first line says so
    shown, _ = stream("```python\nprint(1)\n", ["get_weather"], 1)
    assert "".join(shown).startswith("```python\n")


def test_a_call_in_the_double_braces_qwens_template_shows_is_read():
    """Qwen2.5's template shows a call as {{"name": ..., "arguments": ...}} (a Jinja
    escape left in its text), and Qwen2.5-Coder-1.5B answered exactly that at temperature
    0 (`localllm run --tools`, "Which function is defined in src/calc.py?"): it is the
    call, streamed or whole; braces that do not close as a call's stay text."""
    text = '{{"name": "read_file", "arguments": {"path": "src/calc.py"}}}'
    whole = tools.parse("hermes", text, ["read_file"])
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == [
        ("read_file", {"path": "src/calc.py"})] and whole.content == ""
    reader = ReplyReader("hermes", ["read_file"])
    shown = "".join(reader.feed(ch) for ch in text)
    assert shown == "" and [c.name for c in reader.close().calls] == ["read_file"]
    for kept in ('{{"name": "read_file", "arguments": {}}', "Use {{name}} here."):
        assert tools.parse("hermes", kept, ["read_file"]).calls == []
