"""Find a model on the Hugging Face hub and pull it, from inside the chat (F3, then S).

Type a search and press Enter: repositories with GGUF files or an MLX model, most
downloaded first. Enter on one lists what it offers (each quantization with its size
and whether it fits in free memory, by the same estimate as `localllm pull`); Enter on
one of those pulls it in the background (the app's `pull_in_background`): the bar here
and the status line show the progress, and the chat stays usable, with or without this
dialog open.
"""

from __future__ import annotations

from typing import Any

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Label, ProgressBar

from localllm.errors import LocalLLMError
from localllm.models import fit, hub
from localllm.units import format_bytes


class HubSearch(ModalScreen[None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Close")]

    def __init__(self, free_bytes: int) -> None:
        super().__init__()
        self.free_bytes = free_bytes
        self.repo: str | None = None  # the repository whose choices are listed
        self.offered: list[hub.Choice] = []

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide", id="hub-search"):
            yield Label("Search the Hugging Face hub · Enter searches, picks, pulls · Esc closes")
            yield Input(placeholder="e.g. qwen gguf, gemma, mlx-community", id="query")
            yield Label("", id="hub-status")
            yield DataTable(id="hub-results", cursor_type="row", zebra_stripes=True)
            yield ProgressBar(id="pull-bar", show_eta=False)

    def on_mount(self) -> None:
        self.query_one("#pull-bar", ProgressBar).display = False
        self.query_one("#query", Input).focus()

    def say(self, text: str) -> None:
        self.query_one("#hub-status", Label).update(text)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self.say(f"Searching for '{event.value.strip()}'…")
            self.run_search(event.value.strip())

    @work(thread=True, exclusive=True, group="hub")
    def run_search(self, query: str) -> None:
        try:
            found = hub.search(query)
        except LocalLLMError as exc:
            self.app.call_from_thread(self.say, exc.message)
            return
        self.app.call_from_thread(self.show_repos, query, found)

    def show_repos(self, query: str, found: list[hub.HubModel]) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        self.repo, self.offered = None, []
        table.add_columns("repository", "kind", "downloads")
        for model in found:
            table.add_row(model.repo, model.kind.upper(), f"{model.downloads:,}", key=model.repo)
        self.say(
            f"{len(found)} repositories for '{query}': Enter lists what one offers"
            if found
            else f"Nothing on the hub matches '{query}' (GGUF or MLX)."
        )
        if found:
            table.focus()

    @work(thread=True, exclusive=True, group="hub")
    def list_choices(self, repo: str) -> None:
        try:
            offered = hub.choices(repo)
        except LocalLLMError as exc:
            self.app.call_from_thread(self.say, exc.message)
            return
        self.app.call_from_thread(self.show_choices, repo, offered)

    def show_choices(self, repo: str, offered: list[hub.Choice]) -> None:
        table = self.query_one(DataTable)
        table.clear(columns=True)
        self.repo, self.offered = repo, offered
        self.fits_column = table.add_columns("pull", "quantization", "size", "fits")[3]
        for choice in offered:
            table.add_row(
                choice.spec, choice.label, format_bytes(choice.size), "checking…", key=choice.spec
            )
        self.say(f"{repo}: Enter pulls the highlighted one · {format_bytes(self.free_bytes)} free")
        table.focus()
        self.estimate(offered)

    @work(thread=True, exclusive=True, group="estimate")
    def estimate(self, offered: list[hub.Choice]) -> None:
        """Whether each fits, by `localllm pull`'s estimate: the smallest one's header is
        read from the hub (its first megabytes) for the KV cache and buffers at the
        model's context, which all its quantizations share; the weights are each file."""
        try:
            probe = hub.estimate_remote(hub.plan_pull(offered[0].spec))
            extra = probe.kv + probe.buffers
        except LocalLLMError:  # the header could not be had: the weights alone
            extra = fit.from_meta("", None, 0, None).total
        fits = {}
        for choice in offered:
            need = choice.size + extra
            fits[choice.spec] = (
                "yes" if need <= self.free_bytes else f"no (needs {format_bytes(need)})"
            )
        self.app.call_from_thread(self.show_fits, fits)

    def show_fits(self, fits: dict[str, str]) -> None:
        table = self.query_one(DataTable)
        for spec, text in fits.items():
            if spec in table.rows:
                table.update_cell(spec, self.fits_column, text)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = str(event.row_key.value)
        if self.repo is None:
            self.say(f"Listing {key}…")
            self.list_choices(key)
            return
        start: Any = getattr(self.app, "pull_in_background", None)
        if start is not None:
            start(key)
            self.say(f"Pulling {key} in the background: the chat stays usable; Esc closes this")

    def pull_progress(self, spec: str, done: int, total: int | None) -> None:
        """The app reports a pull's progress here while this dialog is open."""
        bar = self.query_one("#pull-bar", ProgressBar)
        bar.display = True
        bar.update(total=total or None, progress=done)

    def pull_finished(self, spec: str, message: str) -> None:
        self.say(message)
