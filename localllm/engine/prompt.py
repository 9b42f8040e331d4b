"""A request's prompt: rendered by the model's chat template (tools included), laid out for
fill-in-the-middle, checked and fitted into the context. Pure functions of (model,
request): a tokenizer thread calls them before the worker admits the request."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Sequence

from localllm.backends import tools
from localllm.backends.base import LoadedModel, Message, ModelInfo, SamplingParams
from localllm.backends.media import no_media
from localllm.engine import grammar
from localllm.engine.request import Infill, Request
from localllm.errors import ContextOverflow, FimUnsupported, InvalidRequest

log = logging.getLogger(__name__)


def fit_prompt(model: LoadedModel, request: Request) -> tuple[list[int], int, int]:
    """The prompt tokens, and how many messages the truncate-oldest policy dropped to fit
    (with the length before); ContextOverflow when it does not fit and may not be cut.

    A prompt that cannot fit whatever it tokenizes to (more bytes than the context's
    tokens times the longest token, or more messages than tokens) is refused, or under
    truncate-oldest cut, before any of it is tokenized: a hostile body costs no
    tokenizer time."""
    n_ctx = model.info.n_ctx
    if request.infill is not None:
        tokens, dropped = infill_tokens(model, request.infill, request.params.max_tokens)
        if len(tokens) >= n_ctx:
            raise ContextOverflow(len(tokens), n_ctx)
        return tokens, dropped, 0
    messages = list(request.messages or [])
    least = least_tokens(model.info, request.prompt, request.suffix, messages)
    cut = request.context_policy == "truncate-oldest" and len(messages) > 1
    if least >= n_ctx and not cut:
        raise ContextOverflow(least, n_ctx, at_least=True)
    least_before = least  # what a cut reports as the length before (a lower bound)
    system = [m for m in messages[:1] if m.role == "system"]
    rest = messages[len(system) :]
    dropped = 0
    while least >= n_ctx and len(rest) > 1:  # cut by the bound first, without tokenizing
        rest, dropped = rest[1:], dropped + 1
        least = least_tokens(model.info, None, None, [*system, *rest])
    if least >= n_ctx:
        raise ContextOverflow(least, n_ctx, at_least=True)
    if dropped:
        request = dataclasses.replace(request, messages=[*system, *rest])
    tokens = render_prompt(model, request)
    if len(tokens) < n_ctx:
        return tokens, dropped, least_before if dropped else 0
    if not cut:
        raise ContextOverflow(len(tokens), n_ctx)
    before = len(tokens)
    while len(rest) > 1:
        rest = rest[1:]
        dropped += 1
        if rest[0].role == "assistant" and len(rest) > 1:
            rest, dropped = rest[1:], dropped + 1  # a turn starts with the user
        tokens = render_messages(model, request, [*system, *rest])
        if len(tokens) < n_ctx:
            log.info("dropped the %d oldest messages to fit %d tokens", dropped, n_ctx)
            return tokens, dropped, before
    raise ContextOverflow(len(tokens), n_ctx)


def least_tokens(
    info: ModelInfo, prompt: str | None, suffix: str | None, messages: Sequence[Message]
) -> int:
    """A lower bound on a prompt's length in tokens, from its size alone: no token covers
    more bytes than the vocabulary's longest, and each message is at least one token."""
    per = info.max_token_bytes
    if per <= 0:
        return 0
    size = sum(len(m.content.encode()) for m in messages)
    size += len((prompt or "").encode()) + len((suffix or "").encode())
    return max(-(-size // per), len(messages))


def check_token_ids(info: ModelInfo, tokens: Sequence[int]) -> None:
    """InvalidRequest naming the first prompt token id outside the model's vocabulary."""
    if info.n_vocab <= 0:
        return
    for i, tok in enumerate(tokens):
        if not 0 <= tok < info.n_vocab:
            raise InvalidRequest(
                f"prompt token {tok} at position {i} is not in the vocabulary of {info.id} "
                f"(ids 0 to {info.n_vocab - 1})",
                param="prompt",
            )


# the turn markers of common template families (ChatML, Llama 3, Gemma, Phi): in a chat
# whose template uses them, a model that writes one out as text has begun a turn of its own
TURN_MARKERS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<|end|>",
    "<|user|>",
)


def end_markers(request: Request, template: str | None) -> tuple[str, ...]:
    """The turn markers that end a chat's answer under its model's template (as Ollama's
    model files list them as stops); none for raw prompts, which may well contain them."""
    if request.messages is None or not template:
        return ()
    return _markers_in(template)


@functools.lru_cache(maxsize=32)
def _markers_in(template: str) -> tuple[str, ...]:
    # read once per template (a resident model's is the same string object every time)
    return tuple(m for m in TURN_MARKERS if m in template)


def render_prompt(model: LoadedModel, request: Request) -> list[int]:
    """The prompt tokens for a request: chat template, raw text, FIM, or given tokens."""
    info = model.info
    if request.messages is not None:
        return render_messages(model, request, request.messages)
    if request.prompt_tokens is not None:
        return list(request.prompt_tokens)
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []
    prompt = request.prompt or ""
    if request.suffix is None:
        return bos + model.tokenize(prompt, special=True)
    if info.fim is None:
        raise FimUnsupported(info.id)
    fim = info.fim
    prefix, suffix = model.tokenize(prompt), model.tokenize(request.suffix)
    return [*bos, fim.prefix, *prefix, fim.suffix, *suffix, fim.middle]


def render_messages(model: LoadedModel, request: Request, messages: Sequence[Message]) -> list[int]:
    """A chat's prompt: the template gets the tools when it knows them; a template that
    does not gets them described in a system message and the calls and results
    rewritten as turns it takes (backends/tools.py)."""
    for m in messages:
        for item in m.media:
            if item.kind not in model.info.media:
                raise no_media(model.info, item.kind)
    fmt = tools.format_for(model.info.chat_template)
    spec = request.tools
    variables = dict(request.template_vars or {})
    if fmt == "generic":
        messages = tools.generic_messages(messages, spec)
    elif spec is not None and spec.choice.mode != "none":
        variables["tools"] = [{"type": "function", "function": f} for f in spec.offered()]
    try:
        return model.render_chat(messages, variables)
    except InvalidRequest as exc:
        late = any(m.role == "system" for m in messages[1:])
        if exc.param != "messages" or not late:
            raise
    # a template that takes a system message only first (Claude Code sends others later
    # on): each later one goes into the user turn that follows it
    return model.render_chat(inline_late_system(messages), variables)


WARM_CHATS = (
    [Message("user", "Hello")],
    [Message("system", "Be brief."), Message("user", "Hello")],  # a template that wants one
)


def warm(model: LoadedModel) -> None:
    """Render a one-line chat at load, so that the first request does not compile the
    model's chat template (16 ms for the starter's here); a template that insists on a
    system message first gets one. A template that fails both is logged and left for the
    first request to report, in its own words."""
    if not model.info.chat_template:
        return
    for messages in WARM_CHATS:
        try:
            render_messages(model, Request(SamplingParams()), messages)
            return
        except Exception as exc:
            failure = exc
    log.warning("%s: its chat template failed a trial render: %s", model.info.id, failure)


def inline_late_system(messages: Sequence[Message]) -> list[Message]:
    """The messages with each system message after the first turn written at the start
    of the next user message (or, with none after it, at the end of the last one)."""
    out: list[Message] = []
    waiting: list[str] = []
    for i, m in enumerate(messages):
        if m.role == "system" and i > 0:
            waiting.append(m.content)
        elif m.role == "user" and waiting:
            out.append(dataclasses.replace(m, content="\n\n".join([*waiting, m.content])))
            waiting = []
        else:
            out.append(m)
    if waiting:
        last = max((i for i, m in enumerate(out) if m.role == "user"), default=None)
        if last is None:
            out.append(Message("user", "\n\n".join(waiting)))
        else:
            joined = "\n\n".join([out[last].content, *waiting])
            out[last] = dataclasses.replace(out[last], content=joined)
    return out


def with_tool_grammar(model: LoadedModel, request: Request) -> tuple[Request, str | None]:
    """The request with the grammar its tool calls must follow (when its choice or the
    template's format needs one), and the format the reply is read in."""
    spec = request.tools
    if spec is None or request.messages is None:
        return request, None
    fmt = tools.format_for(model.info.chat_template)
    if spec.choice.mode == "none":
        return request, None
    if spec.choice.mode == "auto":  # a call or an answer in text, never nothing at all
        request = dataclasses.replace(
            request, params=dataclasses.replace(request.params, min_tokens=1)
        )
    if not tools.constrained(fmt, spec):
        return request, fmt
    if request.params.grammar is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tools the model must call "
            f"(tool_choice {spec.choice.mode!r}, or a model whose template has no tool "
            "format); send one of them",
            param="response_format",
        )

    def marker(text: str) -> str:
        ids = model.tokenize(text, special=True)
        if len(ids) == 1 and not model.piece(ids[0]):  # a control token: named by its id
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    source = tools.lark_grammar(fmt, spec, marker)
    compiled = grammar.from_lark(source, param="tools")
    params = dataclasses.replace(request.params, grammar=compiled)
    return dataclasses.replace(request, params=params), fmt


INFILL_RESERVE = 256  # tokens kept free for the answer when /infill says no n_predict


def infill_tokens(
    model: LoadedModel, infill: Infill, n_predict: int | None
) -> tuple[list[int], int]:
    """The /infill prompt laid out as llama.cpp lays it out, and how many extra chunks
    were left out: [BOS] [repo marker, name] then per extra chunk [file separator,
    filename] and its text; then the prefix, suffix and middle markers around the code,
    and the text typed so far. The prefix and suffix are never cut; the extra context
    keeps its newest chunks that fit beside them and the answer."""
    info = model.info
    fim = info.fim
    if fim is None:
        raise FimUnsupported(info.id)
    tok = model.tokenize
    bos = [info.bos_id] if info.add_bos and info.bos_id is not None else []
    core = [
        fim.prefix,
        *tok(infill.prefix),
        fim.suffix,
        *tok(infill.suffix),
        fim.middle,
        *tok(infill.typed),
    ]
    head = [fim.rep, *tok("myproject\n")] if fim.rep is not None else []
    room = info.n_ctx - len(bos) - len(core) - len(head) - (n_predict or INFILL_RESERVE)
    chunks: list[list[int]] = []
    for filename, text in reversed(infill.extra):
        part = [fim.sep, *tok(f"{filename}\n")] if fim.sep is not None else []
        part += tok(text)
        if len(part) > room:
            break
        room -= len(part)
        chunks.append(part)
    dropped = len(infill.extra) - len(chunks)
    extra = [t for part in reversed(chunks) for t in part]
    return [*bos, *(head if extra else []), *extra, *core], dropped
