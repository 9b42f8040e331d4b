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
import logging
import re
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on, work
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option, OptionDoesNotExist

from localllm.backends.base import (
    ModelRef,
)
from localllm.config import Settings
from localllm.engine.accounting import Accounting
from localllm.engine.client import EngineClient
from localllm.engine.speculative import configured_draft
from localllm.engine.stream import ChunkStream
from localllm.errors import LocalLLMError
from localllm.fsguard import PathRefused, write_user_file
from localllm.hardware import available_memory, process_memory
from localllm.history import Conversation, ConversationSettings, History
from localllm.tui.logview import Notifier
from localllm.tui.pacing import RedrawPacer
from localllm.tui.screens.hub_search import HubSearch
from localllm.units import format_bytes

if TYPE_CHECKING:
    from localllm.server.runner import BackgroundEndpoint
from localllm.tui.answering import NEW_TITLE, Answering, device_label
from localllm.tui.screens.dialogs import ConfirmScreen, RenameScreen
from localllm.tui.screens.model_picker import ModelPicker, describe, remote_row
from localllm.tui.screens.settings import SettingsScreen
from localllm.tui.widgets.chat_input import ChatInput
from localllm.tui.widgets.messages import ChatMessage
from localllm.tui.widgets.status import StatusBar, context_text


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


CODE_BLOCK = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)


class ChatApp(Answering):
    CSS_PATH = "app.tcss"
    TITLE = "localllm"
    # Footer labels are short so they fit in 110 columns; the palette uses TITLES.
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+l", "edit_last", "Edit"),
        Binding("ctrl+g", "go_on", "Go on", show=False),
        Binding("f5", "copy_answer", "Copy"),
        Binding("f9", "copy_code", "Code"),
        Binding("ctrl+s", "export", "Export"),
        Binding("f2", "rename", "Rename"),
        Binding("f8", "delete_chat", "Delete"),
        Binding("f3", "models", "Models"),
        Binding("f4", "settings", "Settings"),
        Binding("ctrl+t", "tools", "Tools"),
        Binding("ctrl+q", "quit", "Quit", show=False),  # the usual key; kept out of the footer
    ]
    TITLES = {
        "stop": "Stop",
        "new_chat": "New chat",
        "regenerate": "Regenerate",
        "edit_last": "Edit last",
        "go_on": "Let a stopped loop go on",
        "copy_answer": "Copy answer",
        "copy_code": "Copy code",
        "export": "Export",
        "rename": "Rename",
        "delete_chat": "Delete chat",
        "models": "Models",
        "settings": "Settings",
        "tools": "Tools",
    }
    ACTION_HELP = {
        "stop": "Stop the answer, keeping what it wrote",
        "new_chat": "Start a new conversation",
        "regenerate": "Answer the last prompt again",
        "edit_last": "Put the last prompt back in the input to edit and resend",
        "go_on": "Let the answer the loop guard stopped go on where it stopped",
        "copy_answer": "Copy the last answer to the clipboard",
        "copy_code": "Copy the last answer's last code block",
        "export": "Write this conversation to a Markdown file in the current folder",
        "rename": "Rename this conversation",
        "delete_chat": "Delete this conversation",
        "models": "Pick and load a local model",
        "settings": "System prompt, sampling, answer length and context for this conversation",
        "tools": "The tools this conversation's model may call (files, commands, MCP servers)",
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
        engine.limit_by(self.accounting)  # the keys' daily token quotas
        self.history = history
        self.serve = serve
        self.inline_images = False  # the terminal draws pictures (tui/pictures.py probe)
        # a remote engine's model the chat talks to (NAME/MODEL); None: the loaded model
        self.remote_model: str | None = None
        self.live_status = live_status
        self.export_dir = export_dir or Path.cwd()
        self.endpoint: BackgroundEndpoint | None = None  # started after the first paint
        self.conv: Conversation | None = None
        self.generating = False
        self._stream: ChunkStream | None = None
        self._notifier: Notifier | None = None  # warnings logged meanwhile, as notifications
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
        self.start_tools()
        self._notifier = Notifier(self._log_record)
        logging.getLogger().addHandler(self._notifier)
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

    def show_tools_state(self) -> None:
        """MCP servers starting or down, in the status bar (the ready ones say nothing)."""
        states = self.mcp.states() if self.mcp is not None else {}
        self.status.tools = " · ".join(
            f"mcp {name} {state}" for name, state in states.items() if not state.startswith("ready")
        )

    def _log_record(self, message: str, severity: str) -> None:
        """A warning or error some part logged: a notification (the record is in the
        chat's log file too; tui/logview.py)."""
        self.notify(message, title="localllm", severity=severity, timeout=8)  # type: ignore[arg-type]

    async def on_unmount(self) -> None:
        await asyncio.to_thread(self.stop_tools)
        if self._notifier is not None:
            logging.getLogger().removeHandler(self._notifier)
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
            ChatMessage(
                m.role,
                m.content,
                stats=m.stats,
                in_context=m.in_context,
                message_id=m.id,
                attachments=m.attachments,
            )
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
        self.status.context = context_text(used, info)

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
        try:  # one rename, from a temporary name no one else made (fsguard)
            write_user_file(target, self.history.export_markdown(self.conv.id), backup=False)
        except PathRefused as exc:
            self.notify(f"Could not export: {exc}", severity="error")
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
            self.switch_model(choice, remote=choice.format == "remote")

    def switch_model(self, model: ModelRef | str, *, remote: bool) -> None:
        """Answer with `model` from now on: a remote engine's (nothing to load here), or
        a local one loaded with this conversation's context and backend."""
        if self.generating:
            self.action_stop()
        name = model.name if isinstance(model, ModelRef) else model
        if remote:
            self.remote_model = name
            self.status.model, self.status.device = name, "remote"
            self.status.context = ""
            return
        self.remote_model = None
        settings = self.conv.settings if self.conv else None
        self.load_model(
            model,
            settings.n_ctx if settings else None,
            settings.backend if settings else None,
        )

    @work(exclusive=True, group="dialog")
    async def action_settings(self) -> None:
        if self.conv is None:
            return
        rec = None if self.remote_model is not None else self.engine.status().sampling
        new = await self.push_screen_wait(SettingsScreen(self.conv.settings, rec))
        if new == "tools":
            await self.choose_tools()
        elif isinstance(new, ConversationSettings):
            self.history.save_settings(self.conv.id, new)
            self.conv = self.history.get(self.conv.id)
            self.notify("Settings saved for this conversation.")

    @work(exclusive=True, group="dialog")
    async def action_tools(self) -> None:
        await self.choose_tools()

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        keys = {b.action: b.key for b in self.BINDINGS if isinstance(b, Binding)}
        for action, title in self.TITLES.items():
            yield SystemCommand(
                title,
                f"{self.ACTION_HELP[action]} ({keys[action]})",
                lambda action=action: self.run_action(action),
            )


# How long a thread may hold the GIL while another waits for it (Python's default is
# 5 ms). The UI thread draws while the engine's thread decodes, and the engine needs the
# GIL between tokens: with the default, a frame being drawn can hold up the next token
# for up to 5 ms. bench_tui, 10 rounds each: decode ratio 0.966 with 0.5 ms, 0.935
# without (at the edge of this machine's noise; the reasoning is why it stays).
GIL_SWITCH_S = 0.0005
