"""Pick a local model: what each is, and whether it fits in free memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Label

from localllm.backends.base import ModelRef
from localllm.backends.remote import RemoteModel
from localllm.errors import LocalLLMError
from localllm.models import fit
from localllm.models.gguf import ModelMeta, read_meta
from localllm.models.store import can_draft_for
from localllm.units import format_bytes, format_params


@dataclass(frozen=True, slots=True)
class ModelRow:
    ref: ModelRef
    params: str
    quant: str
    context: str
    need_bytes: int
    vocab: str | None = None  # the vocabulary fingerprint: models that share one can draft

    def fits(self, free_bytes: int) -> bool:
        return self.need_bytes <= free_bytes


def describe(ref: ModelRef, n_ctx: int | None = None, *, draft: ModelRef | None = None) -> ModelRow:
    """Header facts and the memory a load would need (models.fit: weights + KV + buffers,
    and the configured draft model beside it)."""
    try:
        meta: ModelMeta | None = read_meta(ref.path, ref.format)
    except LocalLLMError:
        meta = None
    need = fit.from_meta(ref.name, meta, ref.size_bytes, n_ctx).with_draft(draft, target=ref).total
    if meta is None:
        return ModelRow(ref, "?", "unreadable", "?", need)
    return ModelRow(
        ref,
        format_params(meta.params),
        meta.quant,
        str(meta.n_ctx_train),
        need,
        meta.vocab_fingerprint,
    )


def remote_row(model: RemoteModel) -> ModelRow:
    """A remote engine's model: nothing to load here, so it always fits."""
    ref = ModelRef(model.name, Path(model.name), "remote", f"remote:{model.remote}")
    return ModelRow(ref, "?", "remote", str(model.n_ctx or "?"), 0)


class ModelPicker(ModalScreen[ModelRef | None]):
    """Enter loads the chosen model; ● marks the current one, ○ others already loaded."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Close"),
        Binding("q", "quantize", "Quantize"),
        Binding("s", "search", "Search the hub"),
    ]

    def __init__(
        self,
        rows: list[ModelRow],
        free_bytes: int,
        current: str | None,
        *,
        show_free: bool = True,
        loaded: frozenset[str] = frozenset(),
        models_dir: Path | None = None,
        draft: ModelRef | None = None,
    ) -> None:
        super().__init__()
        self.models_dir = models_dir  # where quantizations go; None: Q does nothing
        self.draft = draft  # the configured draft model, counted beside each model
        self.rows, self.free_bytes, self.current = rows, free_bytes, current
        self.show_free = show_free
        self.loaded = loaded  # resident beside the current one: switching is instant

    def compose(self) -> ComposeResult:
        free = f" · {format_bytes(self.free_bytes)} memory free" if self.show_free else ""
        with Vertical(classes="dialog wide", id="model-picker"):
            keys = (
                "Enter loads, Q quantizes, S searches the hub, Esc closes"
                if self.models_dir
                else "Enter loads"
            )
            yield Label(f"Models{free} · {keys}")
            yield DataTable(id="models", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(
            "", "name", "format", "params", "quant", "size", "context", "fits", "drafts"
        )
        for row in self.rows:
            self.add_row(table, row)
        table.focus()

    def add_row(self, table: DataTable, row: ModelRow) -> None:
        mark = "●" if row.ref.name == self.current else ""
        fits = "yes" if row.fits(self.free_bytes) else f"no (needs {format_bytes(row.need_bytes)})"
        if row.ref.name in self.loaded and row.ref.name != self.current:
            mark, fits = "○", "loaded"
        table.add_row(
            mark,
            row.ref.name,
            row.ref.format,
            row.params,
            row.quant,
            format_bytes(row.ref.size_bytes) if row.ref.size_bytes else "-",
            row.context,
            fits,
            self.drafts(row),
            key=row.ref.name,
        )

    def drafts(self, row: ModelRow) -> str:
        """The local models that could draft for this one (speculative decoding)."""
        names = [
            r.ref.name
            for r in self.rows
            if r is not row and r.vocab and r.vocab == row.vocab and can_draft_for(r.ref, row.ref)
        ]
        return ", ".join(names[:2]) + (f" +{len(names) - 2}" if len(names) > 2 else "")

    def action_quantize(self) -> None:
        """Open the quantize dialog on the highlighted model; its result joins the list."""
        from localllm.tui.screens.quantize import QuantizeScreen

        table = self.query_one(DataTable)
        if self.models_dir is None or not self.rows:
            return
        name = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        source = next(r.ref for r in self.rows if r.ref.name == name)

        def made(ref: ModelRef | None) -> None:
            if ref is not None and all(r.ref.name != ref.name for r in self.rows):
                row = describe(ref, draft=self.draft)
                self.rows.append(row)
                self.add_row(table, row)
                table.move_cursor(row=table.row_count - 1)

        self.app.push_screen(QuantizeScreen(source, self.models_dir), made)

    def action_search(self) -> None:
        """Find and pull a model from the Hugging Face hub (it joins the list once pulled:
        F3 again)."""
        from localllm.tui.screens.hub_search import HubSearch

        if self.models_dir is not None:
            self.app.push_screen(HubSearch(self.free_bytes))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        name = event.row_key.value
        self.dismiss(next(r.ref for r in self.rows if r.ref.name == name))
