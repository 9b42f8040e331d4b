"""The chat's answering: a prompt sent, the conversation submitted to the engine (a full
context asks the user, never cuts silently), the answer streamed into the view as typed
deltas (reasoning folded apart), saved as it grows, and its stats shown at the end.
`ChatApp` (tui/app.py) is this plus its layout, conversations and commands."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from textual import on, work
from textual.containers import VerticalScroll

from localllm.agent.loop_guard import LoopGuard
from localllm.backends import reasoning
from localllm.backends.base import (
    Chunk,
    CoreModel,
    Media,
    Message,
    ModelInfo,
    SamplingParams,
    ToolCall,
)
from localllm.backends.media import from_bytes, no_media, with_markers
from localllm.backends.reasoning import without_reasoning
from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.engine.request import Request
from localllm.engine.stream import ChunkStream
from localllm.errors import ContextOverflow, LocalLLMError
from localllm.history import Attachment, Conversation, History, StoredMessage
from localllm.tui.attach import Attached, AttachError, attach
from localllm.tui.commands import COMPACT_AT, SUMMARY_PREFIX, Commands, summary_text
from localllm.tui.pacing import RedrawPacer
from localllm.tui.screens.dialogs import FullContextScreen
from localllm.tui.widgets.chat_input import ChatInput
from localllm.tui.widgets.messages import ChatMessage, speculation_text
from localllm.tui.widgets.status import StatusBar, context_text

NEW_TITLE = "New chat"
INTERRUPTED = {"interrupted": True}  # an answer's stats until it ends
SAVE_EVERY_S = 1.0  # a streaming answer is saved this often


def device_label(info: ModelInfo) -> str:
    """Backend, device and why that backend: 'llamacpp cpu (2 threads), auto: not Apple Silicon'."""
    reason = info.extra.get("backend_reason")
    return f"{info.backend} {info.device}" + (f", {reason}" if reason else "")


class Answering(Commands):
    """What sending a prompt and streaming its answer need of the app."""

    settings: Settings
    engine: EngineClient
    history: History
    conv: Conversation | None
    generating: bool
    remote_model: str | None  # a remote engine's model the chat talks to (NAME/MODEL)
    pacer: RedrawPacer
    _stream: ChunkStream | None

    @property
    def chat(self) -> VerticalScroll:
        raise NotImplementedError

    @property
    def status(self) -> StatusBar:
        raise NotImplementedError

    @property
    def prompt_box(self) -> ChatInput:
        raise NotImplementedError

    async def open_conversation(self, cid: int) -> None:
        raise NotImplementedError

    async def refresh_sidebar(self) -> None:
        raise NotImplementedError

    def _retitle(self, cid: int, title: str) -> None:
        raise NotImplementedError

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        if self.generating:
            self.notify("An answer is still streaming: wait for it or press Esc to stop it.")
            return
        try:
            attached = attach(event.text, Path.cwd())
            self._check_readable(attached)
        except AttachError as exc:  # the prompt stays in the box: nothing is lost
            self.notify(str(exc), title="Not sent", severity="error", timeout=10)
            return
        self.prompt_box.clear()
        self.prompt_box.remember(event.text)
        if event.text.startswith("//"):  # a prompt that starts with a slash
            attached = dataclasses.replace(attached, text=attached.text[1:])
        elif event.text.startswith("/") and await self.run_command(event.text):
            return
        if attached.files:
            await self._say_attached(attached)
        await self.send(attached.text, attached.media)

    def _check_readable(self, attached: Attached) -> None:
        """AttachError when the loaded model cannot read an attached picture or clip (a
        remote model's engine says for itself)."""
        info = self.engine.status().model_info
        if self.remote_model is not None or info is None:
            return
        for item in attached.media:
            if item.kind not in info.media:
                raise AttachError(f"@{item.name}: {no_media(info, item.kind).public_message}")

    async def _say_attached(self, attached: Attached) -> None:
        """A note of what each @file adds to the prompt, in the model's tokens."""
        notes = []
        for name, text in attached.files:
            if self.remote_model is None and self.engine.status().model_info is not None:
                n = await asyncio.to_thread(self.engine.with_model, None, _counter(text))
                notes.append(f"{name} ({n:,} tokens)")
            else:
                notes.append(f"{name} ({len(text):,} characters)")
        self.notify("Attached " + ", ".join(notes), title="Files")

    async def send(self, text: str, media: Sequence[Attachment] = ()) -> None:
        assert self.conv is not None
        mid = self.history.add(self.conv.id, "user", text, attachments=media)
        if self.conv.title == NEW_TITLE:
            self._retitle(self.conv.id, _title_from(text))
        await self.chat.mount(ChatMessage("user", text, message_id=mid, attachments=media))
        self.chat.scroll_end(animate=False)
        self.generate()

    def _request(self, conv: Conversation) -> Request:
        s = conv.settings
        stored = self.history.messages(conv.id)
        system = s.system_prompt.strip()
        summary = summary_text(stored)  # what /compact kept of the older turns
        if summary:
            system = f"{system}\n\n{SUMMARY_PREFIX}{summary}".strip()
        messages = [Message("system", system)] if system else []
        messages += [
            _message(m) for m in stored if m.in_context and m.role in ("user", "assistant", "tool")
        ]
        params = SamplingParams.asked(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens
        )
        return Request(
            params,
            messages=messages,
            speculate=s.speculate,
            client="chat",
            model=self.remote_model,
            tools=self.agent_for(conv).spec(),
            template_vars=None if s.thinking is None else {"enable_thinking": s.thinking},
        )

    @work(exclusive=True, group="generate", exit_on_error=False)
    async def generate(self) -> None:
        conv = self.conv
        if conv is None:
            return
        self.generating = True
        try:
            await self._ensure_model_settings(conv)
            await self._answer_then_stream(conv)
            if self._nearly_full(conv):
                await self.compact(conv, auto=True)
        except LocalLLMError as exc:
            self.notify(exc.message, title="Generation failed", severity="error", timeout=10)
        finally:
            self.generating = False
            self._stream = None

    @work(exclusive=True, group="generate", exit_on_error=False)
    async def compact_now(self) -> None:
        conv = self.conv
        if conv is None or self.generating:
            return
        self.generating = True
        try:
            await self.compact(conv, auto=False)
        finally:
            self.generating = False

    def _nearly_full(self, conv: Conversation) -> bool:
        """The last answer left the context over COMPACT_AT full (local models)."""
        info = self.engine.status().model_info
        last = next(
            (
                m
                for m in reversed(self.history.messages(conv.id))
                if m.stats and "prompt_tokens" in m.stats
            ),
            None,
        )
        if info is None or last is None or self.remote_model is not None or last.stats is None:
            return False
        used = last.stats["prompt_tokens"] + last.stats["generated_tokens"]
        return used > COMPACT_AT * info.n_ctx

    async def _ensure_model_settings(self, conv: Conversation) -> None:
        """Reload the model when the conversation asks for another context size or backend."""
        want, backend = conv.settings.n_ctx, conv.settings.backend or self.settings.backend
        status = self.engine.status()
        info = status.model_info
        if info is None or self.remote_model is not None:
            return
        other_ctx = bool(want) and info.n_ctx != want
        other_backend = backend != status.backend_preference
        if other_ctx or other_backend:
            what = f"a {want}-token context" if other_ctx else f"backend {backend}"
            self.status.state = f"reloading with {what}"
            info = await asyncio.to_thread(
                self.engine.load, status.model_ref, n_ctx=want, backend=backend
            )
            self.status.state = ""
            self.status.device = device_label(info)
            self.status.context = context_text(0, info)

    async def _start(self, conv: Conversation) -> ChunkStream | None:
        """Submit the conversation; on a full context ask the user, never cut silently."""
        asked = False
        while True:
            stream = self.engine.submit(self._request(conv))
            self._stream = stream  # Esc works during the prefill too
            try:
                started = await stream.started()
                if started.fallback_from is not None:
                    self.notify(
                        f"{started.fallback_from} is unavailable ({started.note}); "
                        f"{started.model} answers instead.",
                        title="Remote model down",
                        severity="warning",
                        timeout=10,
                    )
                return stream
            except ContextOverflow as exc:
                if not asked:
                    asked = True
                    choice = await self.push_screen_wait(
                        FullContextScreen(exc.prompt_tokens, exc.n_ctx)
                    )
                    if choice == "new":
                        await self._move_last_prompt_to_new_chat(conv)
                        return None
                    if choice != "drop":
                        return None
                if not await self._drop_oldest_turn(conv, exc):
                    return None

    async def _drop_oldest_turn(self, conv: Conversation, exc: ContextOverflow) -> bool:
        kept = [m for m in self.history.messages(conv.id) if m.in_context]
        # the oldest turn: a prompt, and its answers and tool results up to the next prompt
        later = next((i for i, m in enumerate(kept) if i > 0 and m.role == "user"), None)
        if later is None:
            self.notify(
                f"The prompt alone needs {exc.prompt_tokens:,} tokens and the context holds "
                f"{exc.n_ctx:,}: shorten it or raise the context size in Settings (F4).",
                severity="error",
                timeout=15,
            )
            return False
        drop = [m.id for m in kept[:later]]
        self.history.drop_from_context(drop)
        self.notify(f"Dropped the oldest turn from the context ({len(drop)} messages).")
        await self.open_conversation(conv.id)
        return True

    async def _move_last_prompt_to_new_chat(self, conv: Conversation) -> None:
        msgs = self.history.messages(conv.id)
        last_user = next((m for m in reversed(msgs) if m.role == "user"), None)
        if last_user is None:
            return
        self.history.delete_message(last_user.id)
        new = self.history.create(_title_from(last_user.content), conv.settings)
        self.conv = new
        await self.refresh_sidebar()
        await self.open_conversation(new.id)
        pictures = last_user.attachments
        mid = self.history.add(new.id, "user", last_user.content, attachments=pictures)
        await self.chat.mount(
            ChatMessage("user", last_user.content, message_id=mid, attachments=pictures)
        )
        await self._answer_then_stream(new)

    async def _answer_then_stream(self, conv: Conversation) -> None:
        """Answer, and while the answer ends in tool calls: run them (each approved) and
        answer again, up to the conversation's step limit (tui/agent_turns.py)."""
        steps = 0
        while True:
            calls = await self._answer_once(conv)
            if not calls:
                return
            steps += 1
            limit = self.tool_choices(conv).steps
            if not await self.run_calls(conv, calls, over_limit=steps > limit):
                return
            conv = self.history.get(conv.id) or conv

    async def _answer_once(self, conv: Conversation) -> tuple[ToolCall, ...]:
        """Mount the (empty) answer, then submit the request and stream into it. Mounting
        first keeps its layout work out of the decode: the first chunk arrives with the
        first token, and from then on every millisecond of the UI thread is the model's.
        The tool calls it ended with, when it was not stopped."""
        answer = await self._mount_answer(conv)
        stream = await self._start(conv)
        if stream is None or not answer.is_attached:  # no answer, or the view was rebuilt
            if answer.is_attached:
                await answer.remove()
            if stream is None:
                return ()
            answer = await self._mount_answer(conv)
        return await self._stream_answer(conv, stream, answer)

    async def _mount_answer(self, conv: Conversation) -> ChatMessage:
        answer = ChatMessage("assistant", "")
        if self.conv is not None and self.conv.id == conv.id:  # still on screen
            await self.chat.mount(answer)
            await answer.start_answer()
            if self.conv is not None and self.conv.id == conv.id:
                self.chat.scroll_end(animate=False)
            elif answer.is_attached:  # the view moved to another conversation meanwhile
                await answer.remove()
        return answer

    async def _stream_answer(
        self,
        conv: Conversation,
        stream: ChunkStream,
        answer: ChatMessage,
        *,
        before: str = "",  # what the answer already said (it goes on: action_go_on)
        guard: bool = True,
    ) -> tuple[ToolCall, ...]:
        self._stream = stream
        shown = answer.is_attached and self.conv is not None and self.conv.id == conv.id
        pacer = self.pacer
        pacer.start()
        loops = LoopGuard() if guard else None
        parts: list[str] = [before]  # the answer
        thoughts: list[str] = []  # its reasoning, when the model thinks
        final: Chunk | None = None
        calls: list[ToolCall] = []
        # the answer is in the history from its start, marked interrupted until it ends,
        # and saved as it grows: a crash or kill -9 keeps what was written, marked
        mid = self.history.add(conv.id, "assistant", "", INTERRUPTED)
        answer.message_id = mid
        saved = time.monotonic()
        try:
            async for delta in stream.deltas(pacer.wait):
                final = delta.final or final
                if loops is not None and loops.tripped is not None:
                    pacer.drawn()  # stopped: only its final figures are still read
                    continue
                calls += delta.tool_calls
                thought, text = delta.reasoning, delta.text
                parts.append(text)
                thoughts.append(thought)
                if loops is not None and text and loops.feed(text):
                    stream.cancel()  # it repeats itself: stopped where the loop showed
                    parts = ["".join(parts)[: loops.cut]]
                    pacer.drawn()
                    continue
                if time.monotonic() - saved > SAVE_EVERY_S:
                    self.history.update(mid, _stored(thoughts, parts), INTERRUPTED)
                    saved = time.monotonic()
                if not (shown and answer.is_attached):
                    pacer.drawn()  # nothing to draw: the piece was only collected
                    continue
                if thought:
                    await answer.add_thought(thought)
                if text and await answer.add_text(text):  # it grew: follow it down
                    chat = self.chat
                    if chat.is_vertical_scroll_end or chat.max_scroll_y - chat.scroll_y < 3:
                        chat.scroll_end(animate=False)
                pacer.drawn()
        finally:
            stats = _stats_dict(final)
            if loops is not None and loops.tripped is not None:
                stats = {**(stats or {}), "loop_guard": loops.tripped}
                stats["finish_reason"] = "cancelled"
                self.notify(
                    f"The answer kept repeating “{loops.tripped[:60]}”, so the chat stopped "
                    "it. Ctrl+G lets it go on.",
                    title="Loop stopped",
                    timeout=15,
                )
            if calls:
                stats = {**(stats or {}), "tool_calls": [_call_dict(c) for c in calls]}
            if answer.is_attached:
                await answer.end_answer()
                answer.show_calls((stats or {}).get("tool_calls", []))
            answer.content = _stored(thoughts, parts)
            if loops is not None and loops.tripped is not None and answer.is_attached:
                await answer.body.update("".join(parts))  # what was shown past the cut goes
            self.history.update(mid, answer.content, stats)
            answer.set_stats(stats)
            local = self.remote_model is None
            info = self.engine.status().model_info
            if final is not None and final.stats is not None and info is not None and local:
                used = final.stats.prompt_tokens + final.stats.generated_tokens
                self.status.context = context_text(used, info)
                self.status.speculation = (
                    speculation_text(stats) if stats and stats.get("draft_proposed") else ""
                )
            self.chat.scroll_end(animate=False)
        stopped = final is None or final.finish_reason == "cancelled"
        return () if stopped else tuple(calls)

    def action_stop(self) -> None:
        self.stop_turn()
        if self._stream is not None:
            self._stream.cancel()

    @work(exclusive=True, group="generate", exit_on_error=False)
    async def action_go_on(self) -> None:
        """Ctrl+G: the answer the loop guard stopped goes on where it stopped, unguarded
        (a remote model, which takes no partial answer, writes it again unguarded)."""
        conv = self.conv
        msgs = self.history.messages(conv.id) if conv is not None and not self.generating else []
        last = msgs[-1] if msgs else None
        if conv is None or last is None or not (last.stats or {}).get("loop_guard"):
            self.notify("Ctrl+G lets an answer the loop guard stopped go on; there is none.")
            return
        self.generating = True
        try:
            self.history.delete_message(last.id)
            shown = self.chat.query(ChatMessage)
            if shown and shown.last().message_id == last.id:
                await shown.last().remove()
            request = self._request(conv)
            before = ""
            if self.remote_model is None:
                before = last.content
                tokens = await asyncio.to_thread(self.engine.prompt_tokens, request)
                tokens += await asyncio.to_thread(self.engine.with_model, None, _tokens(before))
                request = dataclasses.replace(
                    request, messages=None, tools=None, prompt_tokens=tokens
                )
            answer = await self._mount_answer(conv)
            if before and answer.is_attached:
                await answer.add_text(before)
            stream = self.engine.submit(request)
            self._stream = stream
            await stream.started()
            await self._stream_answer(conv, stream, answer, before=before, guard=False)
        except LocalLLMError as exc:
            self.notify(exc.message, title="Generation failed", severity="error", timeout=10)
        finally:
            self.generating = False
            self._stream = None

    async def action_regenerate(self) -> None:
        if self.generating or self.conv is None:
            return
        msgs = self.history.messages(self.conv.id)
        if not msgs:
            return
        if msgs[-1].role == "assistant":
            self.history.delete_message(msgs[-1].id)
            answers = self.chat.query(ChatMessage)
            if answers and answers.last().role == "assistant":
                await answers.last().remove()
        self.generate()

    async def action_edit_last(self) -> None:
        if self.generating or self.conv is None:
            return
        msgs = self.history.messages(self.conv.id)
        idx = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i].role == "user"), None)
        if idx is None:
            return
        for m in msgs[idx:]:
            self.history.delete_message(m.id)
        await self.open_conversation(self.conv.id)
        self.prompt_box.load_text(msgs[idx].content)
        self.prompt_box.move_cursor(self.prompt_box.document.end)
        self.prompt_box.focus()


def _stored(thoughts: list[str], parts: list[str]) -> str:
    """An answer as the history keeps it: its reasoning, if any, as the think block the
    model wrote (whether or not the prompt opened it), then the answer."""
    thought, text = "".join(thoughts), "".join(parts)
    if not thought:
        return text
    return f"{reasoning.OPEN}{thought}{reasoning.CLOSE}\n\n{text}"


def _message(m: StoredMessage) -> Message:
    """A stored message as the model reads it: an earlier answer's reasoning is not sent
    again (as templates expect), its tool calls are, and a tool result names its call."""
    stats = m.stats or {}
    if m.role == "assistant":
        calls = tuple(
            ToolCall(c["id"], c["name"], c["arguments"]) for c in stats.get("tool_calls", [])
        )
        return Message("assistant", without_reasoning(m.content), tool_calls=calls)
    if m.role == "tool":
        return Message(
            "tool", m.content, tool_call_id=stats.get("tool_call_id"), name=stats.get("name")
        )
    if m.attachments:  # each image or clip placed before the text, as Ollama places them
        items = tuple(_decoded(a.data) for a in m.attachments)
        return Message("user", with_markers(m.content, items), media=items)
    return Message("user", m.content)


@functools.lru_cache(maxsize=16)
def _decoded(data: bytes) -> Media:
    """An attachment as the engine reads it (decoded once per picture while it is recent)."""
    return from_bytes(data, param="attachment")


def _call_dict(call: ToolCall) -> dict[str, str]:
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def _tokens(text: str) -> Callable[[CoreModel], list[int]]:
    """`text` in a model's tokens (run on the engine's worker)."""

    def tokenize(model: CoreModel) -> list[int]:
        return model.tokenize(text)

    return tokenize


def _counter(text: str) -> Callable[[CoreModel], int]:
    """How many tokens `text` is for a model (run on the engine's worker)."""

    def count(model: CoreModel) -> int:
        return len(model.tokenize(text))

    return count


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else NEW_TITLE
    return line[:40] + ("…" if len(line) > 40 else "")


def _stats_dict(final: Chunk | None) -> dict[str, Any] | None:
    if final is None or final.stats is None:
        return None
    out = asdict(final.stats)
    out["finish_reason"] = final.finish_reason
    return out
