"""Speculative decoding on the real starter model, on every available backend: the output
is exactly the plain output, in both modes; drafting that never pays switches itself off;
a draft model with another vocabulary is refused."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import pytest

from localllm.backends import all_backends
from localllm.backends.base import Drafter, LoadedModel, LoadOptions, Message, SamplingParams
from localllm.config import Settings
from localllm.engine import single
from localllm.engine.engine import Engine
from localllm.engine.request import Request
from localllm.engine.speculative import (
    PLAIN_SAMPLES,
    TRIAL_STEPS,
    ModelDraft,
    PromptLookup,
    Speculation,
    Tuner,
)
from localllm.errors import InvalidRequest
from localllm.models.store import ModelStore
from tests.conftest import CONTRACT_CTX, THREADS, loads_model
from tests.gguf_fixtures import copy_with_metadata

CODE = """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
"""
EDIT = "Rewrite this function with the name compute_total; change nothing else.\n\n" + CODE
NEVER = lambda: False  # noqa: E731


def tokens_of(
    model: LoadedModel, prompt: list[int], params: SamplingParams, drafter: Drafter | None = None
) -> tuple[list[int], int, int]:
    """Generated tokens, and the proposed / accepted drafts the final chunk reports."""
    out: list[int] = []
    from_draft = 0
    stats = None
    for chunk in single.stream(model, prompt, params, should_stop=NEVER, drafter=drafter):
        out.extend(chunk.tokens)
        from_draft += chunk.from_draft
        stats = chunk.stats or stats
    assert stats is not None
    assert from_draft == stats.draft_accepted or len(out) < stats.draft_accepted
    return out, stats.draft_proposed, stats.draft_accepted


def lookup() -> PromptLookup:
    return PromptLookup(Tuner(n_start=4, n_max=8, label="test"))


@pytest.fixture(scope="module")
@loads_model
def draft(loaded: LoadedModel, request: pytest.FixtureRequest) -> Iterator[LoadedModel]:
    """A second copy of the starter on the same backend, as a draft model."""
    backend = next(b for b in all_backends() if b.name == loaded.info.backend)
    ref = request.getfixturevalue("starter_mlx_ref" if backend.name == "mlx" else "starter_ref")
    model = backend.load(ref, LoadOptions(n_threads=THREADS, n_ctx=CONTRACT_CTX[backend.name]))
    yield model
    model.close()


def test_greedy_output_is_identical_with_prompt_lookup(loaded: LoadedModel):
    prompt = loaded.render_chat([Message("user", EDIT)])
    params = SamplingParams(temperature=0.0, max_tokens=32)
    plain, _, _ = tokens_of(loaded, prompt, params)
    spec, proposed, accepted = tokens_of(loaded, prompt, params, lookup())
    assert spec == plain
    assert proposed > 0 and accepted > 0, "the edit prompt should have been drafted from"


def test_greedy_output_is_identical_with_a_draft_model(loaded: LoadedModel, draft: LoadedModel):
    prompt = loaded.render_chat([Message("user", "Name three colours.")])
    params = SamplingParams(temperature=0.0, max_tokens=20)
    plain, _, _ = tokens_of(loaded, prompt, params)
    drafter = ModelDraft(Tuner(n_start=3, n_max=6, label="test"), draft.draft_greedy)
    spec, proposed, accepted = tokens_of(loaded, prompt, params, drafter)
    assert spec == plain
    # the draft is the same model: it proposes what the target picks
    assert proposed > 0 and accepted == proposed


def test_seeded_sampling_is_identical_with_drafts(loaded: LoadedModel):
    prompt = loaded.render_chat([Message("user", EDIT)])
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=24)
    plain, _, _ = tokens_of(loaded, prompt, params)
    spec, proposed, _ = tokens_of(loaded, prompt, params, lookup())
    assert spec == plain and proposed > 0


def test_drafts_that_never_fit_switch_off_and_the_answer_stays_exact(loaded: LoadedModel):
    prompt = loaded.render_chat([Message("user", "Tell me about the sea.")])
    params = SamplingParams(temperature=0.0, max_tokens=24)
    plain, _, _ = tokens_of(loaded, prompt, params)
    wrong = loaded.tokenize(" zebra")[0]
    assert wrong not in plain
    tuner = Tuner(n_start=3, n_max=6, label="test")
    spec, proposed, accepted = tokens_of(
        loaded, prompt, params, ModelDraft(tuner, lambda _ctx, n: [wrong] * n)
    )
    assert spec == plain
    assert accepted == 0 and not tuner.enabled and 1 <= tuner.stats.steps <= TRIAL_STEPS
    assert "drafting switched off" in tuner.verdict and "0% acceptance" in tuner.verdict
    assert proposed == tuner.stats.proposed  # nothing drafted after it switched off


def test_auto_judges_a_models_requests_together_and_stops_drafting_for_it(
    loaded: LoadedModel, starter_ref, settings: Settings, store: ModelStore
):
    """A chat turn drafts now and then, too rarely to reach a verdict alone: in auto mode
    the turns' drafts add up, and once they show drafting does not pay here, the model
    gets no drafter until it is loaded again. Asked for by name, lookup still drafts."""
    spec = Speculation(replace(settings, speculate="auto"), store)
    turn = Request(SamplingParams(), messages=[Message("user", "Hi")])
    turns, first_lengths = 0, []
    while (drafter := spec.drafter(turn, starter_ref, loaded)) is not None:
        turns += 1
        assert turns < 10, "auto never judged the turns together"
        tuner = drafter.tuner  # type: ignore[attr-defined]
        first_lengths.append(tuner.n)
        for _ in range(PLAIN_SAMPLES):
            drafter.observe(0, 0, 0.010)
        drafter.observe(tuner.n, 0, 0.010 * (1 + 0.6 * tuner.n))  # rejected, as measured here
        spec.finished(starter_ref, drafter)
    assert turns >= 2 and "in all" in tuner.verdict
    if loaded.info.device.startswith("cpu"):
        assert first_lengths[0] == 1  # a rejected draft costs about half a step per token
    asked = spec.drafter(replace(turn, speculate="lookup"), starter_ref, loaded)
    assert asked is not None and asked.tuner.enabled  # type: ignore[attr-defined]
    spec.release(starter_ref)  # loaded again: a fresh chance
    assert spec.drafter(turn, starter_ref, loaded) is not None


def test_engine_refuses_a_draft_with_another_vocabulary(
    settings: Settings, store: ModelStore, starter_ref, tmp_path: Path
):
    tokens = list(gguf.GGUFReader(starter_ref.path).fields["tokenizer.ggml.tokens"].contents())
    tokens[-1] = "<|not-the-same|>"
    other = copy_with_metadata(
        starter_ref.path, tmp_path / "other-vocab.gguf", {"tokenizer.ggml.tokens": tokens}
    )
    engine = Engine(replace(settings, speculate="draft", draft_model=str(other)), store)
    try:
        request = Request(
            SamplingParams(temperature=0.0, max_tokens=4), messages=[Message("user", "Hi")]
        )
        with pytest.raises(InvalidRequest) as err:
            list(engine.generate(request))
        message = err.value.message
        assert "the draft model other-vocab (vocabulary " in message
        assert "cannot draft for starter (vocabulary " in message
        assert err.value.param == "draft_model"
        # without the draft, the same engine answers
        plain = Request(
            SamplingParams(temperature=0.0, max_tokens=4),
            messages=[Message("user", "Hi")],
            speculate="lookup",
        )
        assert sum(len(c.tokens) for c in engine.generate(plain)) == 4
    finally:
        engine.close()


def test_batched_logits_are_exact_for_the_starter(loaded: LoadedModel):
    before = loaded.kv_prefix()
    assert loaded.exact_batches()
    assert loaded.kv_prefix() == before  # the probe leaves the cache as it was


def test_a_llama_cpp_model_answers_the_probe_at_load_and_keeps_nothing_of_it(starter_ref):
    """The warm-up at load is the probe (as llama-server warms up): the answer is there
    before any request asks, and no sequence holds the warm-up's tokens."""
    from localllm.backends.llamacpp import LlamaCppBackend

    model = LlamaCppBackend().load(starter_ref, LoadOptions(n_threads=THREADS, n_ctx=512, n_seq=2))
    try:
        assert model._exact is True  # asked at load: exact_batches() decodes nothing more
        assert model.seq_tokens(0) == [] and model.seq_tokens(1) == []
        greedy = SamplingParams(temperature=0.0, max_tokens=8)
        prompt = model.render_chat([Message("user", "Name a river.")])
        first = [t for c in single.stream(model, prompt, greedy, should_stop=lambda: False)
                 for t in c.tokens]
        model.seq_keep(0, 0)
        again = [t for c in single.stream(model, prompt, greedy, should_stop=lambda: False)
                 for t in c.tokens]
        assert first == again and len(first) == 8
    finally:
        model.close()


def test_a_model_whose_batches_round_differently_gets_no_drafts(
    settings: Settings, store: ModelStore, starter_ref, tmp_path: Path
):
    """llama.cpp's batched F16 matrix product rounds differently from its one-token one on
    this CPU build: drafting would change an F16 model's output, so it does not draft."""
    from localllm.models import quantize as q

    f16 = q.quantize(
        q.plan_quantize(starter_ref, "f16", models_dir=settings.models_dir), settings.models_dir
    )
    engine = Engine(replace(settings, speculate="lookup"), store)
    try:
        request = Request(
            SamplingParams(temperature=0.0, max_tokens=24),
            messages=[Message("user", EDIT)],
            model=f16.ref.name,
        )
        chunks = list(engine.generate(request))
        stats = chunks[-1].stats
        assert stats is not None and stats.generated_tokens == 24
        model = engine.residency.resident[f16.ref.path].model
        if model.exact_batches():
            pytest.skip("this llama.cpp build computes F16 batches exactly")
        assert stats.draft_proposed == 0
    finally:
        engine.close()


def test_a_draft_model_that_does_not_fit_is_refused(
    settings: Settings, store: ModelStore, starter_ref
):
    from localllm.errors import ModelTooLarge
    from localllm.models import quantize as q

    models = settings.models_dir
    f16 = q.quantize(q.plan_quantize(starter_ref, "f16", models_dir=models), models)
    # the starter (about 253 MiB with its KV cache) fits in 300 MiB; its F16 copy does not
    engine = Engine(replace(settings, memory_budget_mb=300), store)
    try:
        # named in the request: checked when it is about to load, beside the loaded target
        request = Request(
            SamplingParams(temperature=0.0, max_tokens=4),
            messages=[Message("user", "Hi")],
            speculate="draft",
            draft_model=f16.ref.name,
        )
        with pytest.raises(ModelTooLarge) as err:
            list(engine.generate(request))
        assert "Model 'starter-f16' needs" in err.value.message
        ref = engine.status().model_ref
        assert ref is not None and ref.name == "starter"
    finally:
        engine.close()
    # configured: counted in the target's own fit, so the target is refused up front
    tight = replace(settings, memory_budget_mb=300, speculate="draft", draft_model=f16.ref.name)
    engine = Engine(tight, store)
    try:
        with pytest.raises(ModelTooLarge) as err:
            list(engine.generate(replace(request, speculate=None, draft_model=None)))
        assert "Model 'starter' needs" in err.value.message
        assert "+ draft starter-f16 " in err.value.message
    finally:
        engine.close()


def test_a_draft_model_loads_through_the_engine_and_goes_with_its_target(
    settings: Settings, store: ModelStore
):
    engine = Engine(replace(settings, speculate="draft", draft_model="starter"), store)
    try:
        request = Request(
            SamplingParams(temperature=0.0, max_tokens=24),
            messages=[Message("user", "Repeat after me: one two three four five six.")],
        )
        chunks = list(engine.generate(request))
        assert chunks[-1].finish_reason in ("stop", "length") and len(chunks) > 1
        rows = engine.resident()
        drafts = [r for r in rows if r["draft_for"] == "starter"]
        assert len(rows) == 2 and len(drafts) == 1  # listed, as /health and `ps` show it
        assert drafts[0]["parallel"] == 1 and drafts[0]["memory_bytes"] > 0
        assert engine.totals["loads"] == 2
        engine.load("starter", n_ctx=512)  # the target reloads: its draft goes with it
        assert [r["draft_for"] for r in engine.resident()] == [None]
    finally:
        engine.close()


def _samplers(loaded: LoadedModel) -> dict[str, SamplingParams]:
    """Every sampler speculation must keep exact (#53): penalties (over the prompt too,
    and over the answer only, the starter's default), logit bias, the truncations with a
    seeded draw."""
    bias = ((loaded.tokenize(" compute")[0], -5.0), (loaded.tokenize(" total")[0], 3.0))
    return {
        "the starter's defaults, greedy": SamplingParams(
            temperature=0.0, top_p=0.9, repeat_penalty=1.1, penalize_prompt=False
        ),
        "repeat 1.3 over the prompt too": SamplingParams(temperature=0.0, repeat_penalty=1.3),
        "frequency and presence": SamplingParams(
            temperature=0.0, frequency_penalty=0.4, presence_penalty=0.3
        ),
        "logit bias": SamplingParams(temperature=0.0, logit_bias=bias),
        "seeded top-k, top-p, min-p, penalty": SamplingParams(
            temperature=0.8, top_k=20, top_p=0.8, min_p=0.1, repeat_penalty=1.1, seed=5
        ),
    }


@pytest.mark.parametrize("which", [
    "the starter's defaults, greedy",
    "repeat 1.3 over the prompt too",
    "frequency and presence",
    "logit bias",
    "seeded top-k, top-p, min-p, penalty",
])
def test_prompt_lookup_is_exact_under_every_sampler(loaded: LoadedModel, which: str):
    if loaded.info.backend == "mlx" and which != "frequency and presence":
        pytest.skip("MLX on a CPU decodes at a few tokens/s: one penalty stands for the rest")
    tokens = 32 if loaded.info.backend == "mlx" else 48
    params = replace(_samplers(loaded)[which], max_tokens=tokens)
    prompt = loaded.render_chat([Message("user", EDIT)])
    plain, _, _ = tokens_of(loaded, prompt, params)
    spec, proposed, accepted = tokens_of(loaded, prompt, params, lookup())
    assert spec == plain
    # drafts were verified and some kept: the penalties' history went through them
    assert proposed > 0 and accepted > 0, (proposed, accepted)


def test_a_grammar_turns_drafting_off_for_its_request_and_the_stats_say_why(
    loaded: LoadedModel,
):
    """Drafts verified outside a grammar could leave it: the request runs plain (the same
    tokens as without a drafter), and its final stats say why nothing was drafted."""
    from localllm.engine.grammar import any_json_object

    if loaded.info.backend == "mlx":
        pytest.skip("the scheduler decides this for every backend alike: llama.cpp stands in")
    params = SamplingParams(temperature=0.0, max_tokens=24, grammar=any_json_object())
    prompt = loaded.render_chat([Message("user", "Give me a JSON object about " + CODE)])
    plain, _, _ = tokens_of(loaded, prompt, params)
    stats = None
    spec: list[int] = []
    for chunk in single.stream(loaded, prompt, params, should_stop=NEVER, drafter=lookup()):
        spec.extend(chunk.tokens)
        stats = chunk.stats or stats
    assert spec == plain
    assert stats is not None and stats.draft_proposed == 0
    assert stats.draft_off == "a grammar constrains the answer"


def test_usage_says_when_and_why_a_request_was_not_drafted_for():
    from localllm.backends.base import GenerationStats
    from localllm.server.openai.shapes import usage

    off = GenerationStats(40, 0, 8, 0.1, 50.0, draft_off="a grammar constrains the answer")
    assert usage(off, 40)["speculative"] == {
        "proposed_tokens": 0,
        "off": "a grammar constrains the answer",
    }
    assert "speculative" not in usage(GenerationStats(40, 0, 8, 0.1, 50.0), 40)
