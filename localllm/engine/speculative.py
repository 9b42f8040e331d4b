"""Speculative decoding policy: where drafts come from, how long they are, when to stop.

A backend's generation loop asks its `Drafter` for up to n tokens that may follow
the tokens so far, evaluates the current token and the draft in one batch, keeps
the draft's longest prefix that the target model itself samples, and reports back
how long that step took and how much it kept. The policy here turns those reports
into a draft length and into the decision to stop drafting when it does not pay.

Exactness does not depend on the policy: the target samples every position with
its own sampler and a draft token is kept only where it equals that sample, so the
output is what the target alone would produce (token for token when greedy; with
sampling, drafts that are a single deterministic guess per position make
"sample and compare" the standard accept/reject rule).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localllm.backends.base import Chunk, Drafter, LoadedModel, ModelRef
from localllm.errors import InvalidRequest, LocalLLMError

log = logging.getLogger(__name__)

NGRAM_MAX = 4
NGRAM_MIN = 2
SLOWER_LIMIT = 0.97  # drafting must keep at least this share of plain speed to go on
TRIAL_STEPS = 6  # drafting steps judged before the first verdict
PLAIN_SAMPLES = 4  # plain steps measured before drafting is judged against them


@dataclass
class SpecStats:
    proposed: int = 0
    accepted: int = 0
    steps: int = 0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


@dataclass
class Evidence:
    """What drafting has shown: accepted drafts, rejecting steps, and the measured cost of
    verified positions. A request's own, or in auto mode shared by one model's requests,
    so that chat turns that each draft a little still add up to a verdict."""

    proposed: int = 0
    accepted: int = 0
    rejections: int = 0
    steps: int = 0
    extra: float = 0.0  # measured sum of (t / c1 - 1) over drafted steps
    extra_positions: int = 0


class Tuner:
    """Measures one request's plain and drafted steps, picks each step's draft length, and
    switches drafting off when it does not pay.

    A step that verifies k drafts costs about c1 * (1 + alpha * k), where c1 is a plain
    step and alpha the share of c1 each extra position adds (near 0 on a GPU, about 0.5
    on a small CPU); it emits 1 + p + ... + p^k tokens on average, p being the chance
    that a draft token is accepted. Both are measured as decoding goes; the draft length
    with the best expected tokens per unit of time is used, and none at all when no
    length beats plain decoding.
    """

    def __init__(
        self,
        *,
        n_start: int,
        n_max: int,
        label: str,
        p_prior: float = 0.8,
        alpha_prior: float = 0.5,
        draft_cost: float = 0.0,
        evidence: Evidence | None = None,
    ) -> None:
        self.n_max = n_max
        self.label = label
        self.stats = SpecStats()
        self.enabled = True
        self.plain_time = 0.0
        self.plain_tokens = 0
        self.spec_time = 0.0
        self.spec_tokens = 0
        self.verdict = ""
        self._p_prior = p_prior
        self._alpha_prior = alpha_prior
        self.evidence = evidence or Evidence()
        # a draft model's cost per drafted token, in plain steps of the target (prior:
        # the models' size ratio); 0 for prompt lookup
        self.draft_cost = draft_cost
        best = self._best_length()
        # the first draft is only as long as what is known says pays: a rejected draft
        # costs alpha plain steps per token
        self.n = max(1, min(n_start, best))
        if best == 0:
            self.switch_off(
                f"a draft token costs {draft_cost:.2f} of a target step"
                if draft_cost and not self.evidence.steps
                else self._no_length()
            )

    def plain_step(self, seconds: float) -> None:
        self.plain_time += seconds
        self.plain_tokens += 1

    def drafted_step(self, proposed: int, accepted: int, seconds: float) -> None:
        s, e = self.stats, self.evidence
        s.proposed += proposed
        s.accepted += accepted
        s.steps += 1
        e.proposed += proposed
        e.accepted += accepted
        e.steps += 1
        self.spec_time += seconds
        self.spec_tokens += accepted + 1
        e.rejections += accepted < proposed
        if self.plain_tokens:
            e.extra += seconds / (self.plain_time / self.plain_tokens) - 1.0
            e.extra_positions += proposed
        self._choose()
        self._judge()

    def want_plain(self) -> bool:
        """Measure plain speed first, so there is something to compare drafting with."""
        return self.plain_tokens < PLAIN_SAMPLES

    @property
    def acceptance_chance(self) -> float:
        """p: accepted / (accepted + rejections), starting from a prior worth 2 steps."""
        e = self.evidence
        return (e.accepted + 2 * self._p_prior) / (e.accepted + e.rejections + 2)

    @property
    def alpha(self) -> float:
        """The measured cost of one more verified position, in plain steps (before four
        are measured: the prior, about 0.5 on a small CPU)."""
        e = self.evidence
        if e.extra_positions < 4:
            return self._alpha_prior
        return max(0.0, e.extra / e.extra_positions)

    def _best_length(self) -> int:
        """The draft length with the best expected tokens per unit of time; 0: none beats
        plain decoding by 2%."""
        p, alpha = self.acceptance_chance, self.alpha
        best, best_gain, expected = 0, 1.0, 1.0
        for k in range(1, self.n_max + 1):
            expected += p**k
            gain = expected / (1 + (alpha + self.draft_cost) * k)
            if gain > best_gain * 1.02:
                best, best_gain = k, gain
        return best

    def _choose(self) -> None:
        best = self._best_length()
        if best == 0:
            self.switch_off(self._no_length())
        self.n = max(best, 1)

    def _no_length(self) -> str:
        return (
            f"no draft length pays at p={self.acceptance_chance:.2f}, "
            f"alpha={self.alpha:.2f}, draft cost {self.draft_cost:.2f}"
        )

    def _judge(self) -> None:
        if not self.enabled or self.evidence.steps < TRIAL_STEPS:
            return
        if self.evidence.accepted == 0:  # one token per step, as plain, at a higher cost
            self.switch_off("no draft token was accepted")
            return
        if self.plain_tokens < PLAIN_SAMPLES:
            return
        plain = self.plain_time / self.plain_tokens
        spec = self.spec_time / self.spec_tokens
        if plain / spec < SLOWER_LIMIT:
            self.switch_off(f"{plain / spec:.2f}x of plain speed")

    def switch_off(self, why: str) -> None:
        if not self.enabled:
            return
        self.enabled = False
        s, e = self.stats, self.evidence
        self.verdict = (
            f"{self.label}: drafting switched off ({why}; {self.stats.acceptance:.0%} "
            f"acceptance over {self.stats.steps} steps"
            + (f", {e.accepted}/{e.proposed} over {e.steps} in all" if e.steps > s.steps else "")
            + ")"
        )
        log.info(self.verdict)


class PromptLookup:
    """Drafts by n-gram lookup: the tokens that followed the latest earlier occurrence of
    the last few tokens, in the prompt or the answer so far. Costs no model call."""

    def __init__(self, tuner: Tuner) -> None:
        self.tuner = tuner
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        if not self.tuner.enabled or limit < 1:
            return []
        end = len(context)
        for stop in range(max(self._indexed, 1), end):  # n-grams ending at stop-1
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if stop - n >= 0:
                    self._index[tuple(context[stop - n : stop])] = stop
        self._indexed = max(self._indexed, end)
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if end < n:
                continue
            at = self._index.get(tuple(context[end - n :]))
            if at is not None and at < end:
                return list(context[at : at + min(self.tuner.n, limit)])
        return []

    def observe(self, proposed: int, accepted: int, seconds: float) -> None:
        if proposed:
            self.tuner.drafted_step(proposed, accepted, seconds)
        else:
            self.tuner.plain_step(seconds)


class ModelDraft:
    """Drafts with a smaller model of the same vocabulary: its greedy continuation."""

    def __init__(self, tuner: Tuner, greedy: Callable[[Sequence[int], int], list[int]]) -> None:
        self.tuner = tuner
        self._greedy = greedy
        self._draft_time = 0.0

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        if not self.tuner.enabled or limit < 1 or self.tuner.want_plain():
            return []
        t0 = time.perf_counter()
        out = self._greedy(context, min(self.tuner.n, limit))
        self._draft_time = time.perf_counter() - t0
        return out

    def observe(self, proposed: int, accepted: int, seconds: float) -> None:
        if not proposed:
            self.tuner.plain_step(seconds)
            return
        tuner = self.tuner
        if tuner.plain_tokens:  # the draft's measured cost per token replaces the prior
            plain = tuner.plain_time / tuner.plain_tokens
            tuner.draft_cost = 0.5 * tuner.draft_cost + 0.5 * self._draft_time / (proposed * plain)
        tuner.drafted_step(proposed, accepted, seconds + self._draft_time)


class ExactOnly:
    """A drafter that asks the model, at its first draft, whether verifying drafts leaves
    the output unchanged (`exact_batches`), and drafts nothing if not. Asking only then
    spares the probe to every request that never drafts."""

    def __init__(self, inner: PromptLookup | ModelDraft, model: LoadedModel) -> None:
        self.inner = inner
        self.tuner = inner.tuner
        self.model = model
        self.inexact = False
        self._checked = False

    def propose(self, context: Sequence[int], limit: int) -> list[int]:
        draft = self.inner.propose(context, limit)
        if draft and not self._checked:
            self._checked = True
            if not self.model.exact_batches():
                self.inexact = True
                self.tuner.switch_off("batched logits differ from one-token logits here")
                return []
        return draft

    def observe(self, proposed: int, accepted: int, seconds: float) -> None:
        self.inner.observe(proposed, accepted, seconds)


def configured_draft(settings: Any, store: Any) -> ModelRef | None:
    """The draft model the settings load beside every model (None: none, or not found;
    a missing one is reported when a request first drafts)."""
    if not settings.draft_model or settings.speculate not in ("auto", "draft"):
        return None
    try:
        ref: ModelRef = store.resolve(settings.draft_model)
    except LocalLLMError:
        return None
    return ref


def _no_draft_models(target_ref: ModelRef, ref: ModelRef, target: LoadedModel) -> LoadedModel:
    raise LocalLLMError(f"no engine here loads draft models (asked for {ref.name})")


class Speculation:
    """The engine's speculative decoding: which drafter a request gets, the draft models
    it uses, and the models it has switched drafting off for. Draft models are loaded and
    unloaded by the engine (`load_draft(target ref, draft ref, target)` and
    `unload_draft(model)`), so that they count among its loaded models."""

    def __init__(
        self,
        settings: Any,
        store: Any,
        *,
        load_draft: Callable[[ModelRef, ModelRef, LoadedModel], LoadedModel] | None = None,
        unload_draft: Callable[[LoadedModel], None] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self._load_draft = load_draft or _no_draft_models
        self._unload_draft = unload_draft or (lambda model: model.close())
        self._drafts: dict[tuple[str, str], Any] = {}  # (target path, draft path) -> model
        self._off: set[tuple[str, str]] = set()  # (target path, kind) that did not pay
        # auto mode: what drafting has shown for each (target path, kind) so far
        self._evidence: dict[tuple[str, str], Evidence] = {}
        self.totals = {"proposed": 0, "accepted": 0, "switched_off": 0}

    def mode(self, request: Any) -> str:
        """off | lookup | draft | auto: the request's, else the setting's."""
        return str(request.speculate or self.settings.speculate)

    def drafter(self, request: Any, ref: ModelRef, model: LoadedModel) -> Drafter | None:
        mode = self.mode(request)
        draft_name = request.draft_model or self.settings.draft_model
        if mode == "off":
            return None
        if mode == "draft" and not draft_name:
            raise InvalidRequest(
                "speculate 'draft' needs a draft model (--draft MODEL, draft_model, "
                "or 'draft_model' in the request)",
                param="speculate",
            )
        if (str(ref.path), "inexact") in self._off:
            return None
        kind = "draft" if mode == "draft" or (mode == "auto" and draft_name) else "lookup"
        if (str(ref.path), kind) in self._off and mode == "auto":
            return None
        label = f"{ref.name} ({kind})"
        # in auto mode a model's requests pool what drafting has shown (a chat turn drafts
        # only now and then), so it is judged over them; asked for, it is judged per request
        key = (str(ref.path), kind)
        evidence = self._evidence.setdefault(key, Evidence()) if mode == "auto" else None
        # a verified position costs about half a step on a CPU, a few percent elsewhere
        alpha = 0.5 if model.info.device.startswith("cpu") else 0.1
        if kind == "lookup":
            tuner = Tuner(n_start=4, n_max=8, label=label, alpha_prior=alpha, evidence=evidence)
            return ExactOnly(PromptLookup(tuner), model)
        # a request's own draft_model is held to the server's rule on paths; the
        # server's configured one is its owner's choice
        allow_paths = request.draft_model is None or bool(request.allow_paths)
        draft, draft_ref = self._draft_model(ref, model, str(draft_name), allow_paths)
        ratio = draft_ref.size_bytes / ref.size_bytes if ref.size_bytes else 0.5
        tuner = Tuner(
            n_start=3, n_max=6, label=label, draft_cost=ratio, alpha_prior=alpha, evidence=evidence
        )
        return ExactOnly(ModelDraft(tuner, draft.draft_greedy), model)

    def _draft_model(
        self, ref: ModelRef, target: LoadedModel, name: str, allow_paths: bool
    ) -> tuple[LoadedModel, ModelRef]:
        draft_ref = self.store.resolve_for_request(
            name, allow_paths=allow_paths, param="draft_model"
        )
        key = (str(ref.path), str(draft_ref.path))
        if key in self._drafts:
            return self._drafts[key], draft_ref
        draft = self._load_draft(ref, draft_ref, target)
        mine, theirs = target.info.vocab_fingerprint, draft.info.vocab_fingerprint
        if mine != theirs:
            self._unload_draft(draft)
            raise InvalidRequest(
                f"the draft model {draft_ref.name} (vocabulary {theirs}) cannot draft for "
                f"{ref.name} (vocabulary {mine}): their vocabularies differ",
                param="draft_model",
            )
        self._drafts[key] = draft
        return draft, draft_ref

    def finished(self, ref: ModelRef, drafter: Drafter | None) -> None:
        if not isinstance(drafter, ExactOnly):
            return
        tuner = drafter.tuner
        if drafter.inexact:
            self._off.add((str(ref.path), "inexact"))
            log.warning(
                "%s: no speculative decoding: %s computes a token's logits differently in a "
                "batch than alone for this model (%s), so drafts would change the output",
                ref.name,
                drafter.model.info.backend,
                drafter.model.info.quant,
            )
            return
        self.totals["proposed"] += tuner.stats.proposed
        self.totals["accepted"] += tuner.stats.accepted
        if not tuner.enabled:
            kind = "draft" if isinstance(drafter.inner, ModelDraft) else "lookup"
            self._off.add((str(ref.path), kind))
            self.totals["switched_off"] += 1
            log.warning("%s; off for this model until it is loaded again", tuner.verdict)

    def with_speedup(self, chunk: Chunk, drafter: Drafter | None) -> Chunk:
        """The final chunk, its stats completed with the measured speed-up."""
        tuner = getattr(drafter, "tuner", None)
        if tuner is None or chunk.stats is None or not tuner.plain_tokens or not tuner.spec_tokens:
            return chunk
        plain = tuner.plain_time / tuner.plain_tokens
        overall = (tuner.plain_time + tuner.spec_time) / (tuner.plain_tokens + tuner.spec_tokens)
        stats = dataclasses.replace(chunk.stats, speedup=plain / overall if overall else 0.0)
        return dataclasses.replace(chunk, stats=stats)

    def release(self, ref: ModelRef) -> None:
        """The target unloads: its draft models go, and it gets a fresh chance."""
        for key in [k for k in self._drafts if k[0] == str(ref.path)]:
            self._unload_draft(self._drafts.pop(key))
        self._off = {k for k in self._off if k[0] != str(ref.path)}
        self._evidence = {k: v for k, v in self._evidence.items() if k[0] != str(ref.path)}

    def close(self) -> None:
        for model in self._drafts.values():
            self._unload_draft(model)
        self._drafts.clear()
