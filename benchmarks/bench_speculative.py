"""Speculative decoding against plain decoding, side by side on the same loaded model.

Greedy, llama.cpp, two threads, context 2048. Each prompt is answered plain and with
the drafter the engine would build (engine/speculative.py), alternating which goes
first, ROUNDS times; the figure is decode tokens/s (after the first token) with drafts
over plain, median over prompts and rounds, with the acceptance of the drafted runs.
Every drafted answer is checked to be token for token the plain one.

(a) code editing (rewrite a given function with one small change), prompt lookup,
    on the starter model;
(b) draft model: the starter dequantized to F16 as the target, its Q4_0 as the draft
    (both made with `localllm quantize`), on open-ended and code prompts;
(c) open-ended chat in `auto` (no draft model set: prompt lookup) on the starter, the
    drafters coming from the engine's own `Speculation`, so that what one request shows
    carries to the next as in the app (auto pools a model's requests and switches
    drafting off for the model when it does not pay).

    python -m benchmarks.bench_speculative [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import machine
from localllm.backends.base import Drafter, LoadedModel, LoadOptions, Message, SamplingParams
from localllm.backends.llamacpp import LlamaCppModel
from localllm.config import Settings
from localllm.engine import single
from localllm.engine.speculative import ModelDraft, PromptLookup, Speculation, Tuner
from localllm.models import quantize as q
from localllm.models.store import ModelStore

MAX_TOKENS = 160
FUNCS = [
    (
        "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
        "        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n"
        "    return subtotal + tax\n",
        "rename it to compute_total",
    ),
    (
        "def read_config(path):\n    with open(path) as fh:\n        lines = fh.readlines()\n"
        "    config = {}\n    for line in lines:\n        key, value = line.split('=')\n"
        "        config[key.strip()] = value.strip()\n    return config\n",
        "skip lines that start with '#'",
    ),
    (
        "class Counter:\n    def __init__(self):\n        self.count = 0\n\n"
        "    def increment(self):\n        self.count += 1\n        return self.count\n\n"
        "    def reset(self):\n        self.count = 0\n",
        "add a decrement method",
    ),
    (
        "function greet(name) {\n  if (!name) {\n    return 'Hello, stranger!';\n  }\n"
        "  return 'Hello, ' + name + '!';\n}\n",
        "use a template string",
    ),
]
CODE = [f"Rewrite this code and {change}; change nothing else.\n\n{code}" for code, change in FUNCS]
CHAT = [
    "Tell me about the history of the bicycle.",
    "What should I pack for a week of hiking?",
    "Explain how a rainbow forms.",
    "Write a short poem about autumn.",
]


def decode(
    model: LoadedModel, prompt: list[int], drafter: Drafter | None
) -> tuple[list[int], float, int, int]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    out: list[int] = []
    tps, proposed, accepted = 0.0, 0, 0
    for chunk in single.stream(model, prompt, params, should_stop=lambda: False, drafter=drafter):
        out.extend(chunk.tokens)
        if chunk.stats is not None:
            tps, proposed, accepted = (
                chunk.stats.decode_tps,
                chunk.stats.draft_proposed,
                chunk.stats.draft_accepted,
            )
    return out, tps, proposed, accepted


def compare(
    label: str,
    model: LoadedModel,
    prompts: list[str],
    make: Callable[[], Drafter | None],
    rounds: int,
    done: Callable[[Drafter | None], None] = lambda _: None,
) -> None:
    ratios, proposed, accepted, plain_tps, spec_tps = [], 0, 0, [], []
    for r in range(rounds):
        for i, text in enumerate(prompts):
            prompt = model.render_chat([Message("user", text)])
            runs: dict[str, tuple[list[int], float, int, int]] = {}
            order = ("plain", "spec") if (r + i) % 2 == 0 else ("spec", "plain")
            for kind in order:
                drafter = make() if kind == "spec" else None
                runs[kind] = decode(model, prompt, drafter)
                if kind == "spec":
                    done(drafter)
            assert runs["spec"][0] == runs["plain"][0], f"{label}: output differs on {text!r}"
            ratios.append(runs["spec"][1] / runs["plain"][1])
            plain_tps.append(runs["plain"][1])
            spec_tps.append(runs["spec"][1])
            proposed += runs["spec"][2]
            accepted += runs["spec"][3]
    share = accepted / proposed if proposed else 0.0
    print(
        f"| {label} | {len(prompts)} x {rounds} | {statistics.median(plain_tps):.1f} | "
        f"{statistics.median(spec_tps):.1f} | {statistics.median(ratios):.3f} "
        f"({min(ratios):.2f}-{max(ratios):.2f}) | {share:.0%} ({accepted}/{proposed}) |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine())
    print("\n| workload | prompts x rounds | plain tok/s | drafted tok/s | ratio median (range) "
          "| acceptance |")
    print("|---|---|---|---|---|---|")
    options = LoadOptions(n_ctx=2048, n_threads=2)
    store = ModelStore(Path("/nonexistent"))
    starter = store.resolve("starter")
    model = LlamaCppModel(starter, options)

    def lookup() -> Drafter:
        return PromptLookup(Tuner(n_start=4, n_max=8, label="lookup"))

    engine_side = Speculation(Settings(speculate="auto"), store)
    auto = SimpleNamespace(speculate="auto", draft_model=None)

    try:
        compare("(a) code edits, lookup, starter", model, CODE, lookup, args.rounds)
        compare(
            "(c) open-ended chat, auto (lookup), starter",
            model,
            CHAT,
            lambda: engine_side.drafter(auto, starter, model),
            args.rounds,
            lambda drafter: engine_side.finished(starter, drafter),
        )
    finally:
        model.close()
    with tempfile.TemporaryDirectory(prefix="bench-spec-") as tmp:
        models = Path(tmp)
        f16 = q.quantize(q.plan_quantize(starter, "f16", models_dir=models), models).ref
        q4 = q.quantize(q.plan_quantize(f16, "q4_0", models_dir=models), models).ref
        draft = LlamaCppModel(q4, options)

        try:
            for name, ref in (("F16", f16), ("Q4_1 starter", starter)):
                size = ref.path.stat().st_size

                def drafted(size: int = size) -> Drafter:
                    # as the engine builds it: the draft's cost prior is the size ratio
                    ratio = q4.size_bytes / size
                    tuner = Tuner(n_start=3, n_max=6, label="draft", draft_cost=ratio)
                    return ModelDraft(tuner, draft.draft_greedy)

                target = LlamaCppModel(ref, options)
                try:
                    label = f"(b) draft model: {name} target, Q4_0 draft"
                    if not target.exact_batches():
                        print(f"| {label} | - | - | - | not drafted: batched logits differ "
                              "from one-token logits for this model here | - |", flush=True)
                        continue
                    compare(label, target, CHAT + CODE, drafted, args.rounds)
                finally:
                    target.close()
        finally:
            draft.close()


if __name__ == "__main__":
    main()
