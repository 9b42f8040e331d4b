"""Quantize a model from the model picker: choose a type, see the plan, watch the progress.

The quantizer (and the optional report) run in a child process through
`models.quantize`, driven from a thread worker, so the chat stays responsive and
a crash in native code only ends the child.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, ProgressBar, Select, Static

from localllm.backends.base import ModelRef
from localllm.errors import LocalLLMError
from localllm.models import quantize as q
from localllm.units import format_bytes


def default_type(ref: ModelRef) -> str:
    """q4_0 for a GGUF, mlx-4bit for an MLX folder."""
    return "q4_0" if ref.format == "gguf" else "mlx-4bit"


class QuantizeScreen(ModalScreen[ModelRef | None]):
    """Dismisses with the new model's ref once one was made (Esc cancels a running job)."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, source: ModelRef, models_dir: Path) -> None:
        super().__init__()
        self.source, self.models_dir = source, models_dir
        self.cancel = threading.Event()
        self.result: ModelRef | None = None
        self.running = False
        self._latest = 0.0  # the job's progress, set on its thread

    def compose(self) -> ComposeResult:
        choices = [(t, t) for t in q.TYPES if (t in q.MLX_TYPES) == (self.source.format == "mlx")]
        if self.source.format == "gguf":
            choices += [(t, t) for t in q.MLX_TYPES]
        with Vertical(classes="dialog wide", id="quantize"):
            yield Label(
                f"Quantize {self.source.name} ({format_bytes(self.source.size_bytes)})",
                classes="heading",
            )
            yield Select(choices, value=default_type(self.source), allow_blank=False, id="type")
            yield Input(placeholder="name (default: MODEL-TYPE)", id="name")
            yield Checkbox("allow requantizing a quantized model", id="requantize")
            yield Checkbox("report size, speed and perplexity afterwards (slow)", id="report")
            yield Static("", id="plan")
            yield ProgressBar(total=100, show_eta=False, id="bar")
            yield Static("", id="outcome")
            with Horizontal(classes="buttons"):
                yield Button("Start", variant="primary", id="start")
                yield Button("Close", id="close")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.start()
        else:
            self.action_close()

    def action_close(self) -> None:
        self.cancel.set()  # a running child is killed; its staging folder is removed
        self.dismiss(self.result)

    def start(self) -> None:
        if self.running:
            return
        target = str(self.query_one("#type", Select).value)
        name = self.query_one("#name", Input).value.strip() or None
        try:
            plan = q.plan_quantize(
                self.source,
                target,
                models_dir=self.models_dir,
                name=name,
                allow_requantize=self.query_one("#requantize", Checkbox).value,
            )
        except LocalLLMError as exc:
            self.show("#plan", exc.message, error=True)
            return
        lines = [
            f"{plan.source.name} ({plan.source_quant}) -> {plan.name} ({plan.target}), "
            f"about {format_bytes(plan.estimate)}; {format_bytes(plan.free)} free",
            *(f"warning: {w}" for w in plan.warnings),
        ]
        self.show("#plan", "\n".join(lines))
        self.show("#outcome", "Quantizing…")
        self.running = True
        self.query_one("#start", Button).disabled = True
        report = self.query_one("#report", Checkbox).value
        self.run_worker(
            lambda: self.work(plan, report), thread=True, exclusive=True, exit_on_error=False
        )

    def work(self, plan: q.QuantizePlan, report: bool) -> None:
        """The thread worker: quantize, then (if asked) measure both models."""
        call = self.app.call_from_thread
        try:
            result = q.quantize(plan, self.models_dir, progress=self.progress, cancel=self.cancel)
            self._latest = 1.0
            call(self._show_latest)  # full before the outcome shows
            self.result = result.ref
            done = (
                f"Made {result.ref.name} ({format_bytes(result.ref.size_bytes)}) "
                f"in {result.seconds:.1f} s"
            )
            if result.fallback:
                gs = plan.group_size or 64
                done += f"; {q.fallback_note(plan.target, result.fallback, result.tensors, gs)}"
            call(self.show, "#outcome", done + ("\nMeasuring…" if report else ""))
            if report:
                self.progress(0.0)
                rows = q.measure_in_child(
                    [plan.source, result.ref],
                    models_dir=self.models_dir,
                    progress=self.progress,
                    cancel=self.cancel,
                )
                table = q.report_table(rows)
                widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
                text = "\n".join(
                    "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in table
                )
                call(self.show, "#outcome", f"{done}\n{text}\n{q.report_footer(rows)}")
        except LocalLLMError as exc:
            call(self.show, "#outcome", exc.message, error=True)
        finally:
            self.running = False

    def progress(self, fraction: float) -> None:
        # posted, not awaited: the job's thread reads the worker's events and must never
        # wait on the screen (a busy UI would hold up the quantization with it). Each post
        # shows the latest fraction, so the order they are handled in does not matter.
        self._latest = fraction
        self.call_later(self._show_latest)

    def _show_latest(self) -> None:
        self.set_progress(self._latest)

    def set_progress(self, fraction: float) -> None:
        if self.is_mounted:  # the dialog may have been closed while the job ended
            self.query_one("#bar", ProgressBar).update(progress=fraction * 100)

    def show(self, widget: str, text: str, *, error: bool = False) -> None:
        if not self.is_mounted:
            return
        static = self.query_one(widget, Static)
        static.update(text)
        static.set_class(error, "error")
