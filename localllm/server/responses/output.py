"""A response object and its stream events, built from the engine's deltas.

Output items come in the order the model wrote them: a `reasoning` item while a thinking
model thinks (its text in `content`, as `reasoning_text`), a `message` item with one
`output_text` part for the answer, then one `function_call` item per call (a call is sent
whole, once its arguments parse). The stream is OpenAI's event sequence: response.created,
response.in_progress, then per item output_item.added, its part and text (or argument)
deltas and their .done events, output_item.done, and last response.completed (or
response.incomplete when the answer hit max_output_tokens), every event numbered.
"""

from __future__ import annotations

import uuid
from typing import Any

from localllm.backends.base import Chunk, ToolCall
from localllm.engine.output import Delta
from localllm.server.wire import now


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(final: Chunk | None, prompt_tokens: int) -> dict[str, Any]:
    stats = final.stats if final is not None else None
    given = stats.prompt_tokens if stats else prompt_tokens
    generated = stats.generated_tokens if stats else 0
    cached = stats.cached_tokens if stats else 0
    return {
        "input_tokens": given,
        # the prompt cache keeps every prompt it reads: what was not read from it, it wrote
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": given - cached},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": given + generated,
    }


def call_item(call: ToolCall, namespace: str | None = None) -> dict[str, Any]:
    item = {
        "type": "function_call",
        "id": item_id("fc"),
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
        "status": "completed",
    }
    return item if namespace is None else {**item, "namespace": namespace}


class Answer:
    """One response under construction: `frame` turns deltas into stream events; `body`
    is the response object at any point (in_progress, then completed or incomplete)."""

    def __init__(
        self,
        model: str,
        prompt_tokens: int,
        echo: dict[str, Any],
        namespaces: dict[str, str] | None = None,
    ) -> None:
        self.id = item_id("resp")
        self.created = now()
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.echo = echo  # the request's settings, repeated in the response object
        self.namespaces = namespaces or {}  # a namespaced function's namespace, by name
        self.output: list[dict[str, Any]] = []
        self.final: Chunk | None = None
        self.status = "in_progress"
        self._seq = 0
        self._open: dict[str, Any] | None = None  # the reasoning or message item streaming

    def body(self) -> dict[str, Any]:
        incomplete = self.status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": self.status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": self.output,
            "usage": usage(self.final, self.prompt_tokens) if self.final else None,
            **self.echo,
        }

    # -- whole --------------------------------------------------------------------------
    def whole(self, answer: Delta) -> dict[str, Any]:
        if answer.reasoning:
            self.output.append(self._reasoning(answer.reasoning.strip(), "completed"))
        if answer.text or not (answer.reasoning or answer.tool_calls):
            self.output.append(self._message(answer.text, "completed"))
        self.output += [call_item(c, self.namespaces.get(c.name)) for c in answer.tool_calls]
        self._end(answer.final)
        return self.body()

    # -- streamed -----------------------------------------------------------------------
    def head(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self.body()),
            self._event("response.in_progress", response=self.body()),
        ]

    def frame(self, delta: Delta) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if delta.reasoning:
            out += self._switch("reasoning")
            out += self._grow("response.reasoning_text.delta", delta.reasoning)
        if delta.text:
            out += self._switch("message")
            out += self._grow("response.output_text.delta", delta.text)
        if delta.final is None:
            return out
        if not self.output and self._open is None and not delta.tool_calls:
            out += self._switch("message")  # an empty answer is still a message
        out += self._switch(None)
        for call in delta.tool_calls:
            out += self._call(call)
        self._end(delta.final)
        name = "response.incomplete" if self.status == "incomplete" else "response.completed"
        out.append(self._event(name, response=self.body()))
        return out

    # -- pieces -------------------------------------------------------------------------
    def _end(self, final: Chunk | None) -> None:
        self.final = final
        cut = final is not None and final.finish_reason == "length"
        self.status = "incomplete" if cut else "completed"

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self._seq += 1
        return {"type": kind, "sequence_number": self._seq - 1, **fields}

    @staticmethod
    def _reasoning(text: str, status: str) -> dict[str, Any]:
        return {
            "type": "reasoning",
            "id": item_id("rs"),
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": None,
            "status": status,
        }

    @staticmethod
    def _message(text: str, status: str) -> dict[str, Any]:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {
            "type": "message",
            "id": item_id("msg"),
            "status": status,
            "role": "assistant",
            "content": [part],
        }

    def _part_event(
        self, kind: str, item: dict[str, Any], index: int, part: dict[str, Any]
    ) -> dict[str, Any]:
        return self._event(kind, item_id=item["id"], output_index=index, content_index=0, part=part)

    def _switch(self, kind: str | None) -> list[dict[str, Any]]:
        """Close the item being streamed (if it is not of `kind`) and open one of `kind`."""
        out: list[dict[str, Any]] = []
        item = self._open
        if item is not None and item["type"] == kind:
            return out
        if item is not None:
            index = self.output.index(item)
            part = item["content"][0]
            text_kind = "output_text" if item["type"] == "message" else "reasoning_text"
            done = f"response.{text_kind}.done"
            extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
            out.append(
                self._event(
                    done,
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    text=part["text"],
                    **extra,
                )
            )
            if item["type"] == "message":
                out.append(self._part_event("response.content_part.done", item, index, part))
            item["status"] = "completed"
            out.append(self._event("response.output_item.done", output_index=index, item=item))
            self._open = None
        if kind is None:
            return out
        if kind == "message":
            fresh = self._message("", "in_progress")
        else:
            fresh = self._reasoning("", "in_progress")
        shown = {**fresh, "content": []}
        self.output.append(fresh)
        self._open = fresh
        index = len(self.output) - 1
        out.append(self._event("response.output_item.added", output_index=index, item=shown))
        if kind == "message":
            part = {**fresh["content"][0]}
            out.append(self._part_event("response.content_part.added", fresh, index, part))
        return out

    def _grow(self, kind: str, text: str) -> list[dict[str, Any]]:
        item = self._open
        assert item is not None
        item["content"][0]["text"] += text
        extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
        return [
            self._event(
                kind,
                item_id=item["id"],
                output_index=self.output.index(item),
                content_index=0,
                delta=text,
                **extra,
            )
        ]

    def _call(self, call: ToolCall) -> list[dict[str, Any]]:
        item = call_item(call, self.namespaces.get(call.name))
        self.output.append(item)
        index = len(self.output) - 1
        return [
            self._event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=call.arguments,
            ),
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=call.arguments,
                name=call.name,
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]
