"""OpenAI's response bodies, whole or as stream frames, built as plain dicts (one is built
per streamed frame, so they must be cheap) from the engine's deltas."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from localllm.backends.base import Chunk, FinishReason, GenerationStats, TokenLogprob, ToolCall
from localllm.engine.output import Delta
from localllm.server.wire import new_id, now


def usage(stats: GenerationStats | None, prompt_tokens: int) -> dict:
    if stats is not None:  # a remote engine's prompt is only counted at its end
        prompt_tokens = stats.prompt_tokens
    completion_tokens = stats.generated_tokens if stats else 0
    out: dict = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens if stats else 0},
    }
    if stats and stats.draft_proposed:  # extension: speculative decoding's figures
        out["speculative"] = {
            "proposed_tokens": stats.draft_proposed,
            "accepted_tokens": stats.draft_accepted,
            "acceptance": round(stats.draft_accepted / stats.draft_proposed, 4),
            "speedup": round(stats.speedup, 3),
        }
    elif stats and stats.draft_off:  # why a model that drafts did not for this request
        out["speculative"] = {"proposed_tokens": 0, "off": stats.draft_off}
    return out


def wire_finish(reason: FinishReason | None) -> str | None:
    # "cancelled" never reaches a client that is still listening; report it as a stop.
    return "stop" if reason == "cancelled" else reason


Scores = Sequence[TokenLogprob]


def _token_text(piece: bytes) -> str:
    return piece.decode("utf-8", "replace")


class Shapes:
    """The JSON bodies of one response: whole, or as stream frames. `scores` are the log
    probabilities of the tokens in a piece (when the request asked for them, else None)."""

    object_full = ""
    object_chunk = ""
    prefix = ""

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        self.id = new_id(self.prefix)
        self.created = now()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.logprobs = logprobs
        # set when the truncate-oldest policy dropped messages: said in the final bodies
        self.truncated: dict[str, int] | None = None
        # set when a remote model's local fallback answered: said in the final bodies
        self.fallback: dict[str, str | None] | None = None
        # set when the API key's daily quota cut max_tokens: said in the final bodies
        self.quota: dict[str, int] | None = None

    def _body(self, obj: str, choices: list[dict], use: dict | None = None) -> dict:
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if use is not None:
            body["usage"] = use
        return body

    def _said(self, body: dict) -> dict:
        if self.truncated is not None:
            body["truncated"] = self.truncated
        if self.fallback is not None:
            body["fallback"] = self.fallback
        if self.quota is not None:
            body["quota"] = self.quota
        return body

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        raise NotImplementedError

    def full(
        self,
        text: str,
        final: Chunk,
        scores: Scores = (),
        calls: Sequence[ToolCall] = (),
        *,
        reasoning: str = "",
    ) -> dict:
        choice = self._choice(
            text, final.finish_reason, scores, calls, whole=True, reasoning=reasoning
        )
        use = usage(final.stats, self.prompt_tokens)
        return self._said(self._body(self.object_full, [choice], use))

    def delta(self, text: str, scores: Scores = (), *, reasoning: str = "") -> dict:
        choice = self._choice(text, None, scores, (), whole=False, reasoning=reasoning)
        return self._body(self.object_chunk, [choice])

    def closing(
        self,
        final: Chunk,
        text: str,
        scores: Scores = (),
        calls: Sequence[ToolCall] = (),
        *,
        include_usage: bool,
        reasoning: str = "",
    ) -> list[dict]:
        choice = self._choice(
            text, final.finish_reason, scores, calls, whole=False, reasoning=reasoning
        )
        out = [self._said(self._body(self.object_chunk, [choice]))]
        if include_usage:
            out.append(self._body(self.object_chunk, [], usage(final.stats, self.prompt_tokens)))
        return out


def _wire_call(call: ToolCall, index: int | None = None) -> dict:
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        id=call.id,
        type="function",
        function={"name": call.name, "arguments": call.arguments},
    )
    return out


class ChatShapes(Shapes):
    object_full, object_chunk, prefix = "chat.completion", "chat.completion.chunk", "chatcmpl"

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        super().__init__(model, prompt_tokens, logprobs=logprobs)
        self._first = True

    def _scores(self, scores: Scores) -> dict | None:
        if not self.logprobs:
            return None
        return {
            "content": [
                {
                    "token": _token_text(s.piece),
                    "logprob": s.logprob,
                    "bytes": list(s.piece),
                    "top_logprobs": [
                        {"token": _token_text(b), "logprob": lp, "bytes": list(b)}
                        for _, lp, b in s.top
                    ],
                }
                for s in scores
            ]
        }

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        reason = "tool_calls" if calls else wire_finish(finish)
        if whole:
            message: dict[str, Any] = {"role": "assistant", "content": text or None}
            if reasoning:  # extension (vLLM, SGLang, DeepSeek): the think block, apart
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [_wire_call(c) for c in calls]
            elif not text:
                message["content"] = ""
            return {
                "index": 0,
                "message": message,
                "logprobs": self._scores(scores),
                "finish_reason": reason,
            }
        delta: dict[str, Any] = {"content": text} if text or self._first else {}
        if reasoning:
            delta["reasoning_content"] = reasoning
        if self._first:
            delta["role"] = "assistant"
            self._first = False
        if calls:
            delta["tool_calls"] = [_wire_call(c, i) for i, c in enumerate(calls)]
        logprobs = self._scores(scores) if scores else None
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason}


class TextShapes(Shapes):
    object_full = object_chunk = "text_completion"
    prefix = "cmpl"

    def __init__(self, model: str, prompt_tokens: int, *, logprobs: bool = False) -> None:
        super().__init__(model, prompt_tokens, logprobs=logprobs)
        self._offset = 0  # characters of text before the next token (text_offset)

    def _scores(self, scores: Scores) -> dict | None:
        if not self.logprobs:
            return None
        offsets = []
        for s in scores:
            offsets.append(self._offset)
            self._offset += len(_token_text(s.piece))
        return {
            "tokens": [_token_text(s.piece) for s in scores],
            "token_logprobs": [s.logprob for s in scores],
            "top_logprobs": [{_token_text(b): lp for _, lp, b in s.top} for s in scores],
            "text_offset": offsets,
        }

    def _choice(
        self,
        text: str,
        finish: FinishReason | None,
        scores: Scores,
        calls: Sequence[ToolCall],
        *,
        whole: bool,
        reasoning: str = "",
    ) -> dict:
        logprobs = self._scores(scores) if (whole or scores) else None
        return {
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": wire_finish(finish),
        }


def whole(shapes: Shapes, answer: Delta) -> dict:
    """The body of a whole answer."""
    assert answer.final is not None
    return shapes.full(
        answer.text, answer.final, answer.logprobs, answer.tool_calls, reasoning=answer.reasoning
    )


def frames(shapes: Shapes, delta: Delta, *, include_usage: bool) -> list[dict]:
    """The stream frames of one delta (none for a delta with nothing to say)."""
    if delta.final is None:
        if delta.empty:
            return []
        return [shapes.delta(delta.text, delta.logprobs, reasoning=delta.reasoning)]
    return shapes.closing(
        delta.final,
        delta.text,
        delta.logprobs,
        delta.tool_calls,
        include_usage=include_usage,
        reasoning=delta.reasoning,
    )
