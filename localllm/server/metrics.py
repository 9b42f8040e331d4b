"""What the endpoint tells operators: Prometheus metrics and the access log's token figures.

`Telemetry` watches the engine (each finished request: its tokens, first-token time,
time per output token, drafts) and the guard (each response: route and status). The
figures that describe the engine now rather than events (queue depth, active
sequences, the prompt cache, loaded models) are read when /metrics is scraped, by a
collector, so nothing is counted twice and nothing goes stale.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from localllm.backends.base import Chunk
from localllm.engine.client import EngineClient
from localllm.engine.request import Request as EngineRequest

_PENDING_MAX = 4096  # requests whose response has not ended yet


class EngineCollector(Collector):
    """Gauges read from the engine at scrape time."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        status = engine.status()
        activity = status.activity
        queued = GaugeMetricFamily("localllm_queue_depth", "Requests waiting to start")
        queued.add_metric([], activity["queued"])
        yield queued
        active = GaugeMetricFamily(
            "localllm_active_sequences",
            "Requests decoding or reading their prompt",
            labels=["model"],
        )
        loaded = GaugeMetricFamily(
            "localllm_model_memory_bytes",
            "Memory a loaded model takes (weights and KV)",
            labels=["model", "backend"],
        )
        for row in status.loaded:
            active.add_metric([row.model], row.active)
            loaded.add_metric([row.model, row.backend], row.memory_bytes)
        yield active
        yield loaded
        count = GaugeMetricFamily("localllm_loaded_models", "Models loaded now")
        count.add_metric([], len(status.loaded))
        yield count
        cache = status.prompt_cache
        lookups = CounterMetricFamily("localllm_prompt_cache_lookups", "Prompt-cache lookups")
        lookups.add_metric([], float(cache.get("requests", 0)))
        yield lookups
        hits = CounterMetricFamily("localllm_prompt_cache_hits", "Lookups that reused a prefix")
        hits.add_metric([], float(cache.get("hits", 0)))
        yield hits
        size = GaugeMetricFamily(
            "localllm_prompt_cache_bytes", "Bytes the prompt cache holds", labels=["tier"]
        )
        size.add_metric(["ram"], float(cache.get("ram_bytes", 0)))
        size.add_metric(["disk"], float(cache.get("disk_bytes", 0)))
        yield size
        remotes = engine.remotes.status()
        if remotes:
            up = GaugeMetricFamily(
                "localllm_remote_up",
                "1 while a remote engine is served, 0 while marked down",
                labels=["remote"],
            )
            for remote in remotes:
                up.add_metric([remote["name"]], 1.0 if remote["state"] == "up" else 0.0)
            yield up


class Telemetry:
    """The metrics registry of one endpoint, and the engine's figures for its access log."""

    def __init__(self, engine: EngineClient, routes: set[str] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.routes = routes or set()  # label values for `route`; any other path is "other"
        r = self.registry
        self.requests = Counter(
            "localllm_requests", "HTTP requests", ["route", "model", "status"], registry=r
        )
        self.ttft = Histogram(
            "localllm_time_to_first_token_seconds",
            "Request start to its first token",
            ["model"],
            registry=r,
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.tpot = Histogram(
            "localllm_time_per_output_token_seconds",
            "Decode time per generated token",
            ["model"],
            registry=r,
            buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1),
        )
        self.tokens = Counter(
            "localllm_tokens",
            "Tokens by kind (prompt, cached, completion) and the backend that answered",
            ["model", "backend", "kind"],
            registry=r,
        )
        self.drafts = Counter(
            "localllm_speculative_tokens",
            "Draft tokens proposed and accepted",
            ["model", "kind"],
            registry=r,
        )
        self.engine = engine
        r.register(EngineCollector(engine))
        self._pending: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        engine.observe(self.observe)

    def observe(self, request: EngineRequest, model: str, final: Chunk, seconds: float) -> None:
        """One finished request (on the engine's thread)."""
        stats = final.stats
        if stats is None:
            return
        backend = self.engine.backend_of(model)
        self.tokens.labels(model, backend, "prompt").inc(stats.prompt_tokens)
        self.tokens.labels(model, backend, "cached").inc(stats.cached_tokens)
        self.tokens.labels(model, backend, "completion").inc(stats.generated_tokens)
        if stats.generated_tokens:
            self.ttft.labels(model).observe(stats.ttft_s)
        if stats.generated_tokens > 1 and stats.decode_tps > 0:
            self.tpot.labels(model).observe(1.0 / stats.decode_tps)
        if stats.draft_proposed:
            self.drafts.labels(model, "proposed").inc(stats.draft_proposed)
            self.drafts.labels(model, "accepted").inc(stats.draft_accepted)
        if request.request_id is not None:
            with self._lock:
                if len(self._pending) < _PENDING_MAX:
                    self._pending[request.request_id] = {
                        "model": model,
                        "prompt_tokens": stats.prompt_tokens,
                        "cached_tokens": stats.cached_tokens,
                        "completion_tokens": stats.generated_tokens,
                        # none for a request that ended before its first token
                        "ttft_s": round(stats.ttft_s, 4) if stats.generated_tokens else None,
                        "finish_reason": final.finish_reason,
                    }

    def finish(self, line: dict[str, Any]) -> None:
        """A response ended: add the engine's figures to its access-log line, count it."""
        with self._lock:
            figures = self._pending.pop(line["request_id"], None)
        if figures is not None:
            line.update(figures)
        route = line["route"] if line["route"] in self.routes else "other"
        self.requests.labels(route, line.get("model") or "", str(line["status"])).inc()
