"""The chat app: conversations on the left, the chat on the right, the model shared.

Generation runs on the engine's thread; this app only reads chunks from the
event loop, so typing, scrolling and switching conversations stay responsive.
When `serve` is on, the OpenAI-compatible endpoint runs in this process on the
same engine: one copy of the weights and one KV cache for the chat and the IDE.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option, OptionDoesNotExist

from localllm.backends import reasoning
from localllm.backends.base import (
    Chunk,
    CoreModel,
    Message,
    ModelInfo,
    ModelRef,
    SamplingParams,
)
from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.client import EngineClient
from localllm.engine.speculative import configured_draft
from localllm.engine.stream import ChunkStream
from localllm.engine.worker import Request
from localllm.errors import ContextOverflow, LocalLLMError
from localllm.hardware import available_memory, process_memory
from localllm.history import Conversation, History
from localllm.tui.pacing import RedrawPacer
from localllm.tui.screens.hub_search import HubSearch
from localllm.units import format_bytes

if TYPE_CHECKING:
    from localllm.server.runner import BackgroundEndpoint
from localllm.backends.reasoning import ReasoningSplitter, without_reasoning
from localllm.tui.attach import Attached, AttachError, attach
from localllm.tui.screens.dialogs import ConfirmScreen, FullContextScreen, RenameScreen
from localllm.tui.screens.model_picker import ModelPicker, describe, remote_row
from localllm.tui.screens.settings import SettingsScreen
from localllm.tui.widgets.chat_input import ChatInput
from localllm.tui.widgets.messages import ChatMessage, speculation_text
from localllm.tui.widgets.status import StatusBar


def activity_label(activity: Mapping[str, Any]) -> str:
    """'3 running, 1 waiting, reading 384/1600': the engine's requests (this chat's and
    every client's), empty when idle."""
    running, waiting = int(activity.get("active", 0)), int(activity.get("queued", 0))
    if not running and not waiting:
        return ""
    parts = [f"{running} running"] + ([f"{waiting} waiting"] if waiting else [])
    for row in activity.get("requests", []):
        if row.get("state") == "prefill":
            parts.append(f"reading {row.get('prefilled', 0)}/{row.get('prompt_tokens', 0)}")
    return ", ".join(parts)


def device_label(info: ModelInfo) -> str:
    """Backend, device and why that backend: 'llamacpp cpu (2 threads), auto: not Apple Silicon'."""
    reason = info.extra.get("backend_reason")
    return f"{info.backend} {info.device}" + (f", {reason}" if reason else "")


CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
NEW_TITLE = "New chat"


class ChatApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "localllm"
    # Footer labels are short so they fit in 110 columns; the palette uses TITLES.
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+l", "edit_last", "Edit"),
        Binding("f5", "copy_answer", "Copy"),
        Binding("f9", "copy_code", "Code"),
        Binding("ctrl+s", "export", "Export"),
        Binding("f2", "rename", "Rename"),
        Binding("f8", "delete_chat", "Delete"),
        Binding("f3", "models", "Models"),
        Binding("f4", "settings", "Settings"),
        Binding("ctrl+q", "quit", "Quit", show=False),  # the usual key; kept out of the footer
    ]
    TITLES = {
        "stop": "Stop",
        "new_chat": "New chat",
        "regenerate": "Regenerate",
        "edit_last": "Edit last",
        "copy_answer": "Copy answer",
        "copy_code": "Copy code",
        "export": "Export",
        "rename": "Rename",
        "delete_chat": "Delete chat",
        "models": "Models",
        "settings": "Settings",
    }
    ACTION_HELP = {
        "stop": "Stop the answer, keeping what it wrote",
        "new_chat": "Start a new conversation",
        "regenerate": "Answer the last prompt again",
        "edit_last": "Put the last prompt back in the input to edit and resend",
        "copy_answer": "Copy the last answer to the clipboard",
        "copy_code": "Copy the last answer's last code block",
        "export": "Write this conversation to a Markdown file in the current folder",
        "rename": "Rename this conversation",
        "delete_chat": "Delete this conversation",
        "models": "Pick and load a local model",
        "settings": "System prompt, sampling, answer length and context for this conversation",
    }

    def __init__(
        self,
        settings: Settings,
        engine: EngineClient,
        *,
        history: History,
        serve: bool = True,
        live_status: bool = True,  # False: no live machine figures (for stable snapshots)
        export_dir: Path | None = None,
        accounting: Accounting | None = None,  # keys and usage; None: the data dir's
        pacer: RedrawPacer | None = None,  # when a streaming answer is redrawn
    ) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine
        self._own_accounting = accounting is None
        self.accounting = accounting or Accounting.for_settings(settings)
        # the chat's and its endpoint's requests are counted
        self._stop_observing = engine.observe(self.accounting.observe)
        self.history = history
        self.serve = serve
        # a remote engine's model the chat talks to (NAME/MODEL); None: the loaded model
        self.remote_model: str | None = None
        self.live_status = live_status
        self.export_dir = export_dir or Path.cwd()
        self.endpoint: BackgroundEndpoint | None = None  # started after the first paint
        self.conv: Conversation | None = None
        self.generating = False
        self._stream: ChunkStream | None = None
        self.pacer = pacer or RedrawPacer()
        self.last_copied: str | None = None

    # -- layout ----------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            with Vertical(id="sidebar"):
                yield Static("Conversations", classes="title")
                # one widget however many conversations there are: a list of widgets per
                # conversation made every layout pass (each redraw of an answer) cost more
                yield OptionList(id="conversations")
            with Vertical(id="main"):
                yield VerticalScroll(id="chat")
                yield ChatInput(id="input", recall=self.history.prompts())
        yield StatusBar(id="status")
        yield Footer(compact=True)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def chat(self) -> VerticalScroll:
        return self.query_one("#chat", VerticalScroll)

    @property
    def prompt_box(self) -> ChatInput:
        return self.query_one(ChatInput)

    async def on_mount(self) -> None:
        sys.setswitchinterval(GIL_SWITCH_S)
        last = self.history.last()
        conv = self.history.get(last) if last else None
        if conv is None:
            existing = self.history.conversations()
            conv = existing[0] if existing else self.history.create(NEW_TITLE)
        await self.refresh_sidebar()
        await self.open_conversation(conv.id)
        self.prompt_box.focus()
        if self.serve:
            self.status.endpoint = "endpoint starting"
            self.start_endpoint()
        else:
            self.status.endpoint = "endpoint off"
        if self.live_status:
            self.set_interval(2.0, self.refresh_memory)
            self.refresh_memory()
        if self.engine.remotes.find(self.settings.model) is not None:
            self.remote_model = self.settings.model  # answered elsewhere: nothing to load
            self.status.model, self.status.device = self.settings.model, "remote"
            return
        self.load_model(self.settings.model, conv.settings.n_ctx, conv.settings.backend)

    @work(thread=True, exclusive=True, group="endpoint", exit_on_error=False)
    def start_endpoint(self) -> None:
        """Start the endpoint off the UI thread (its imports alone take a few hundred ms)."""
        from localllm.server.runner import BackgroundEndpoint

        endpoint = BackgroundEndpoint(self.settings, self.engine, self.accounting)
        self.endpoint = endpoint

        def show() -> None:
            if endpoint.error is None:
                self.status.endpoint = endpoint.url
                return
            in_use = "in use" in endpoint.error or "cannot listen" in endpoint.error
            why = f"port {self.settings.port} in use" if in_use else "no API key"
            self.status.endpoint = f"endpoint off: {why}"
            self.notify(endpoint.error, title="Endpoint not started", severity="warning")

        self.call_from_thread(show)

    def refresh_memory(self) -> None:
        self.status.memory = f"mem {format_bytes(process_memory())}"
        self.status.activity = activity_label(self.engine.status().activity)

    async def on_unmount(self) -> None:
        if self._stream is not None:
            self._stream.cancel()
        if self.endpoint is not None:
            await asyncio.to_thread(self.endpoint.stop)
        self._stop_observing()
        if self._own_accounting:
            self.accounting.close()

    # -- model -----------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def load_model(
        self, model: str | ModelRef | None, n_ctx: int | None = None, backend: str | None = None
    ) -> None:
        label = model.name if isinstance(model, ModelRef) else model or self.settings.model

        def progress(fraction: float) -> None:
            self.call_from_thread(setattr, self.status, "state", f"loading {label} {fraction:.0%}")

        self.call_from_thread(setattr, self.status, "state", f"loading {label}")
        try:
            info = self.engine.load(model, progress=progress, n_ctx=n_ctx, backend=backend)
        except LocalLLMError as exc:
            self.call_from_thread(self._load_failed, exc.message)
            return
        ref = self.engine.status().model_ref

        def done() -> None:
            self.status.state = ""
            self.status.model = ref.name if ref else info.id
            self.status.device = device_label(info)
            self._show_context()
            # What startup built (modules, the screen, the model's bindings) lives as long
            # as the app: later cycle collections need not walk it again each time. Collect
            # first, and take back what an earlier load froze, so that garbage (a replaced
            # model's objects, an earlier screen) is never frozen for good.
            gc.unfreeze()
            gc.collect()
            gc.freeze()

        self.call_from_thread(done)

    @work(thread=True, group="pull")
    def pull_in_background(self, spec: str) -> None:
        """Pull a model from the hub (F3, S) while the chat goes on; the status line, and
        the search dialog while it is open, show the progress."""
        from localllm.models import hub

        done: dict[str, int] = {}
        shown = [0.0]

        def progress(file: str, nbytes: int, _size: int | None) -> None:
            done[file] = nbytes
            if time.monotonic() - shown[0] >= 0.25:  # a few updates a second is plenty
                shown[0] = time.monotonic()
                self.call_from_thread(self._pull_progress, spec, sum(done.values()), total)

        total: int | None = None
        try:
            plan = hub.plan_pull(spec)
            total = plan.total or None
            self.call_from_thread(self._pull_progress, spec, 0, total)
            hub.pull(plan, self.settings.models_dir, progress=progress)
        except LocalLLMError as exc:
            self.call_from_thread(self._pull_done, spec, f"Could not pull {spec}: {exc.message}")
            return
        self.call_from_thread(
            self._pull_done, spec, f"Pulled {spec}: F3 lists it; `{spec}` names it everywhere"
        )

    def _pull_progress(self, spec: str, nbytes: int, total: int | None) -> None:
        share = f" {nbytes / total:.0%}" if total else ""
        self.status.pulling = f"pulling {spec}{share} ({format_bytes(nbytes)})"
        for screen in self.screen_stack:
            if isinstance(screen, HubSearch):
                screen.pull_progress(spec, nbytes, total)

    def _pull_done(self, spec: str, message: str) -> None:
        self.status.pulling = ""
        failed = message.startswith("Could not")
        self.notify(
            message, title="Pull", severity="error" if failed else "information", timeout=15
        )
        for screen in self.screen_stack:
            if isinstance(screen, HubSearch):
                screen.pull_finished(spec, message)

    def _load_failed(self, message: str) -> None:
        self.status.state = "model not loaded"
        self.notify(message, title="Could not load the model", severity="error", timeout=15)

    # -- conversations -------------------------------------------------------------------
    @property
    def sidebar(self) -> OptionList:
        return self.query_one("#conversations", OptionList)

    async def refresh_sidebar(self) -> None:
        view = self.sidebar
        convs = self.history.conversations()
        view.set_options(Option(c.title, id=f"conv-{c.id}") for c in convs)
        if self.conv is not None:
            ids = [c.id for c in convs]
            if self.conv.id in ids:
                view.highlighted = ids.index(self.conv.id)

    async def open_conversation(self, cid: int) -> None:
        conv = self.history.get(cid)
        if conv is None:
            return
        self.conv = conv
        self.history.set_last(cid)
        await self.chat.remove_children()
        stored = self.history.messages(cid)
        widgets = [
            ChatMessage(m.role, m.content, stats=m.stats, in_context=m.in_context, message_id=m.id)
            for m in stored
        ]
        if widgets:
            await self.chat.mount_all(widgets)
        self.chat.scroll_end(animate=False)
        self.sub_title = conv.title
        self._show_context()
        last = stored[-1] if stored else None
        if last is not None and last.role == "assistant" and (last.stats or {}).get("interrupted"):
            self.notify(
                "The last answer was interrupted (the app stopped while writing it); "
                "Ctrl+R writes it again.",
                title="Interrupted answer",
                timeout=10,
            )

    def _show_context(self) -> None:
        """Context used by the conversation's last answer, against the loaded context size."""
        info = self.engine.status().model_info
        if info is None or self.conv is None:
            return
        stats = next(
            (
                m.stats
                for m in reversed(self.history.messages(self.conv.id))
                if m.stats and "prompt_tokens" in m.stats
            ),
            None,
        )
        used = stats["prompt_tokens"] + stats["generated_tokens"] if stats else 0
        self.status.context = f"ctx {used}/{info.n_ctx}"

    def _retitle(self, cid: int, title: str) -> None:
        """Rename a conversation and its sidebar entry, without rebuilding the list."""
        self.history.rename(cid, title)
        self.conv = self.history.get(cid)
        self.sub_title = title
        with contextlib.suppress(OptionDoesNotExist):  # not listed (yet): nothing to rename
            self.sidebar.replace_option_prompt(f"conv-{cid}", title)

    @on(OptionList.OptionSelected, "#conversations")
    async def _switch(self, event: OptionList.OptionSelected) -> None:
        cid = int((event.option_id or "").removeprefix("conv-"))
        if self.conv is None or cid != self.conv.id:
            if self.generating:
                self.action_stop()
            await self.open_conversation(cid)
        self.prompt_box.focus()

    async def action_new_chat(self) -> None:
        settings = self.conv.settings if self.conv else None
        conv = self.history.create(NEW_TITLE, settings)
        self.conv = conv
        await self.refresh_sidebar()
        await self.open_conversation(conv.id)
        self.prompt_box.focus()

    @work(exclusive=True, group="dialog")
    async def action_rename(self) -> None:
        if self.conv is None:
            return
        title = await self.push_screen_wait(RenameScreen(self.conv.title))
        if title:
            self._retitle(self.conv.id, title)

    @work(exclusive=True, group="dialog")
    async def action_delete_chat(self) -> None:
        if self.conv is None:
            return
        if not await self.push_screen_wait(ConfirmScreen(f"Delete '{self.conv.title}'?")):
            return
        if self.generating:
            self.action_stop()
        self.history.delete(self.conv.id)
        remaining = self.history.conversations()
        target = remaining[0] if remaining else self.history.create(NEW_TITLE)
        self.conv = None
        await self.open_conversation(target.id)
        await self.refresh_sidebar()

    # -- sending and generating -------------------------------------------------------
    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        if self.generating:
            self.notify("An answer is still streaming: wait for it or press Esc to stop it.")
            return
        try:
            attached = attach(event.text, Path.cwd())
        except AttachError as exc:  # the prompt stays in the box: nothing is lost
            self.notify(str(exc), title="Not sent", severity="error", timeout=10)
            return
        self.prompt_box.clear()
        self.prompt_box.remember(event.text)
        if attached.files:
            await self._say_attached(attached)
        await self.send(attached.text)

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

    async def send(self, text: str) -> None:
        assert self.conv is not None
        mid = self.history.add(self.conv.id, "user", text)
        if self.conv.title == NEW_TITLE:
            self._retitle(self.conv.id, _title_from(text))
        await self.chat.mount(ChatMessage("user", text, message_id=mid))
        self.chat.scroll_end(animate=False)
        self.generate()

    def _request(self, conv: Conversation) -> Request:
        s = conv.settings
        messages = [Message("system", s.system_prompt)] if s.system_prompt.strip() else []
        messages += [  # an earlier answer's reasoning is not sent again, as templates expect
            Message(m.role, without_reasoning(m.content) if m.role == "assistant" else m.content)  # type: ignore[arg-type]
            for m in self.history.messages(conv.id)
            if m.in_context and m.role in ("user", "assistant")
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
        except LocalLLMError as exc:
            self.notify(exc.message, title="Generation failed", severity="error", timeout=10)
        finally:
            self.generating = False
            self._stream = None

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
            self.status.context = f"ctx 0/{info.n_ctx}"

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
        if len(kept) <= 1:
            self.notify(
                f"The prompt alone needs {exc.prompt_tokens:,} tokens and the context holds "
                f"{exc.n_ctx:,}: shorten it or raise the context size in Settings (F4).",
                severity="error",
                timeout=15,
            )
            return False
        drop = [kept[0].id]
        if len(kept) > 2 and kept[1].role == "assistant":
            drop.append(kept[1].id)
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
        mid = self.history.add(new.id, "user", last_user.content)
        await self.chat.mount(ChatMessage("user", last_user.content, message_id=mid))
        await self._answer_then_stream(new)

    async def _answer_then_stream(self, conv: Conversation) -> None:
        """Mount the (empty) answer, then submit the request and stream into it. Mounting
        first keeps its layout work out of the decode: the first chunk arrives with the
        first token, and from then on every millisecond of the UI thread is the model's."""
        answer = await self._mount_answer(conv)
        stream = await self._start(conv)
        if stream is None or not answer.is_attached:  # no answer, or the view was rebuilt
            if answer.is_attached:
                await answer.remove()
            if stream is None:
                return
            answer = await self._mount_answer(conv)
        await self._stream_answer(conv, stream, answer)

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
        self, conv: Conversation, stream: ChunkStream, answer: ChatMessage
    ) -> None:
        self._stream = stream
        shown = answer.is_attached and self.conv is not None and self.conv.id == conv.id
        pacer = self.pacer
        pacer.start()
        parts: list[str] = []  # the answer
        thoughts: list[str] = []  # its reasoning, when the model thinks
        splitter = ReasoningSplitter(stream.info.reasoning if stream.info else None)
        final: Chunk | None = None
        # the answer is in the history from its start, marked interrupted until it ends,
        # and saved as it grows: a crash or kill -9 keeps what was written, marked
        mid = self.history.add(conv.id, "assistant", "", INTERRUPTED)
        answer.message_id = mid
        saved = time.monotonic()
        try:
            async for piece, last in stream.batches(pacer.wait):
                final = last or final
                thought, text = splitter.feed(piece)
                if last is not None:
                    more_thought, more_text = splitter.close()
                    thought, text = thought + more_thought, text + more_text
                parts.append(text)
                thoughts.append(thought)
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
            if answer.is_attached:
                await answer.end_answer()
            answer.content = _stored(thoughts, parts)
            self.history.update(mid, answer.content, stats)
            answer.set_stats(stats)
            local = self.remote_model is None
            info = self.engine.status().model_info
            if final is not None and final.stats is not None and info is not None and local:
                used = final.stats.prompt_tokens + final.stats.generated_tokens
                self.status.context = f"ctx {used}/{info.n_ctx}"
                self.status.speculation = (
                    speculation_text(stats) if stats and stats.get("draft_proposed") else ""
                )
            self.chat.scroll_end(animate=False)

    def action_stop(self) -> None:
        if self._stream is not None:
            self._stream.cancel()

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

    # -- copy and export ---------------------------------------------------------------
    def _last_answer(self) -> str | None:
        if self.conv is None:
            return None
        msgs = [m for m in self.history.messages(self.conv.id) if m.role == "assistant"]
        return msgs[-1].content if msgs else None

    def _copy(self, text: str, what: str) -> None:
        self.copy_to_clipboard(text)
        self.last_copied = text
        self.notify(f"Copied {what} ({len(text.splitlines()) or 1} lines).")

    def action_copy_answer(self) -> None:
        answer = self._last_answer()
        if answer is None:
            self.notify("There is no answer to copy yet.")
            return
        self._copy(answer, "the last answer")

    def action_copy_code(self) -> None:
        answer = self._last_answer() or ""
        blocks = CODE_BLOCK.findall(answer)
        if not blocks:
            self.notify("The last answer has no code block.")
            return
        self._copy(blocks[-1].rstrip("\n"), "the last code block")

    def action_export(self) -> None:
        if self.conv is None:
            return
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.conv.title).strip("-").lower() or "chat"
        target = self.export_dir / f"{slug}-{self.conv.id}.md"
        tmp = target.with_name(f".{target.name}.tmp")
        try:
            tmp.write_text(self.history.export_markdown(self.conv.id), encoding="utf-8")
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            self.notify(f"Could not export to {target}: {exc.strerror}", severity="error")
            return
        self.notify(f"Exported to {target}")

    # -- models and settings ---------------------------------------------------------
    @work(exclusive=True, group="dialog")
    async def action_models(self) -> None:
        engine = self.engine
        refs = await asyncio.to_thread(engine.models)
        draft = await asyncio.to_thread(configured_draft, self.settings, engine)
        rows = await asyncio.to_thread(lambda: [describe(r, draft=draft) for r in refs])
        rows += [remote_row(m) for m in await engine.remotes.models()]
        status = engine.status()
        current = self.remote_model or (status.model_ref.name if status.model_ref else None)
        loaded = frozenset(row.model for row in status.loaded)
        picker = ModelPicker(
            rows,
            available_memory(),
            current,
            show_free=self.live_status,
            loaded=loaded,
            models_dir=self.settings.models_dir,
            draft=draft,
        )
        choice = await self.push_screen_wait(picker)
        if choice is not None and choice.name != current:
            if self.generating:
                self.action_stop()
            if choice.format == "remote":  # answered elsewhere: nothing to load here
                self.remote_model = choice.name
                self.status.model, self.status.device = choice.name, "remote"
                self.status.context = ""
                return
            self.remote_model = None
            settings = self.conv.settings if self.conv else None
            self.load_model(
                choice,
                settings.n_ctx if settings else None,
                settings.backend if settings else None,
            )

    @work(exclusive=True, group="dialog")
    async def action_settings(self) -> None:
        if self.conv is None:
            return
        rec = None if self.remote_model is not None else self.engine.status().sampling
        new = await self.push_screen_wait(SettingsScreen(self.conv.settings, rec))
        if new is not None:
            self.history.save_settings(self.conv.id, new)
            self.conv = self.history.get(self.conv.id)
            self.notify("Settings saved for this conversation.")

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        keys = {b.action: b.key for b in self.BINDINGS if isinstance(b, Binding)}
        for action, title in self.TITLES.items():
            yield SystemCommand(
                title,
                f"{self.ACTION_HELP[action]} ({keys[action]})",
                lambda action=action: self.run_action(action),
            )


def _stored(thoughts: list[str], parts: list[str]) -> str:
    """An answer as the history keeps it: its reasoning, if any, as the think block the
    model wrote (whether or not the prompt opened it), then the answer."""
    thought, text = "".join(thoughts), "".join(parts)
    if not thought:
        return text
    return f"{reasoning.OPEN}{thought}{reasoning.CLOSE}\n\n{text}"


def _counter(text: str) -> Callable[[CoreModel], int]:
    """How many tokens `text` is for a model (run on the engine's worker)."""

    def count(model: CoreModel) -> int:
        return len(model.tokenize(text))

    return count


def _title_from(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else NEW_TITLE
    return line[:40] + ("…" if len(line) > 40 else "")


# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). The UI thread draws while the engine's thread decodes, and the engine needs the
# GIL between tokens: with the default, a frame being drawn can hold up the next token
# for up to 5 ms. bench_tui, 10 rounds each: decode ratio 0.966 with 0.5 ms, 0.935
# without (at the edge of this machine's noise; the reasoning is why it stays).
GIL_SWITCH_S = 0.0005
INTERRUPTED = {"interrupted": True}  # an answer's stats until it ends
SAVE_EVERY_S = 1.0  # a streaming answer is saved this often


def _stats_dict(final: Chunk | None) -> dict[str, Any] | None:
    if final is None or final.stats is None:
        return None
    out = asdict(final.stats)
    out["finish_reason"] = final.finish_reason
    return out
