"""Prometheus metrics of the ingress (per tenant) plus engine gauges and counters gathered from the replicas."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

UNKNOWN_CLASS = "unknown"  # a tenant with no class: requests without a valid key

# Cumulative engine counts each replica reports: exported as counters (`<name>_total`), so rate()
# applies and a replica's restart reads as a counter reset. name -> (stats key, help).
ENGINE_COUNTERS = {
    "kvserve_engine_prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "kvserve_engine_prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
}


class StreamTimer:
    """One stream's TTFT (its first chunk) and ITL (each gap between chunks), on the monotonic clock."""

    def __init__(self, ttft: Histogram, itl: Histogram, start: float) -> None:
        self._ttft, self._itl, self._last = ttft, itl, None
        self._start = start

    def chunk(self) -> None:
        now = time.monotonic()
        if self._last is None:
            self._ttft.observe(now - self._start)
        else:
            self._itl.observe(now - self._last)
        self._last = now


class _EngineCounters(Collector):
    """The replicas' own counts as of the last snapshot (they count; we only relay)."""

    def __init__(self) -> None:
        self.stats: list[dict] = []

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, (key, doc) in ENGINE_COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=["replica"])
            for s in self.stats:
                family.add_metric([s["replica_id"]], float(s.get(key) or 0))
            yield family


# Per-request latency buckets (seconds): TTFT and end-to-end from 10 ms to minutes, ITL finer.
# Fine below 2 s, where TTFT targets live: a quantile read from them is within a bucket of the real one.
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 4, 8, 16, 32, 64, 128)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)
TENANT_LABELS = ["tenant", "class"]


class IngressMetrics:
    """Every per-request series is labelled by tenant and its class (tenants.classes)."""

    def __init__(self, tenant_class: Mapping[str, str] | None = None) -> None:
        self.tenant_class = dict(tenant_class or {})
        self.registry = CollectorRegistry()
        r = self.registry
        t = TENANT_LABELS
        self.requests = Counter("kvserve_requests", "Requests by tenant, class, endpoint kind and status (429: over "
                                "a tenant limit; 503: overload).", [*t, "kind", "status"], registry=r)
        self.latency = Histogram("kvserve_request_seconds", "Ingress-side request latency, end to end (to the last "
                                 "byte for streams).", [*t, "kind"], registry=r, buckets=LATENCY_BUCKETS)
        self.queue_wait = Histogram("kvserve_queue_wait_seconds", "From the request's arrival at the ingress until "
                                    "a replica took it.", t, registry=r, buckets=LATENCY_BUCKETS)
        self.ttft = Histogram("kvserve_ttft_seconds", "Time to first token, at the ingress (streamed requests).", t,
                              registry=r, buckets=LATENCY_BUCKETS)
        self.itl = Histogram("kvserve_itl_seconds", "Inter-token latency: the gap between a stream's chunks, at the "
                             "ingress.", t, registry=r, buckets=ITL_BUCKETS)
        self.prompt_tokens = Counter("kvserve_prompt_tokens", "Prompt tokens of requests answered with usage "
                                     "(every stream asks the engine for it).", t, registry=r)
        self.cached_tokens = Counter("kvserve_cached_prompt_tokens", "Prompt tokens served from the prefix cache.",
                                     t, registry=r)
        self.completion_tokens = Counter("kvserve_completion_tokens", "Completion tokens generated.", t, registry=r)
        labels = ["replica"]
        self.engine = {
            "waiting": Gauge("kvserve_engine_waiting", "Requests queued in the engine.", labels, registry=r),
            "running": Gauge("kvserve_engine_running", "Sequences in the running batch.", labels, registry=r),
            "kv_usage": Gauge("kvserve_engine_kv_usage", "Fraction of KV blocks in use.", labels, registry=r),
            "cached_blocks": Gauge("kvserve_engine_cached_blocks", "Prefix blocks known cached (from KV events).",
                                   labels, registry=r),
        }
        self.engine_counters = _EngineCounters()
        r.register(self.engine_counters)
        self.window = {
            "kvserve_ttft_p90_ms": Gauge("kvserve_replica_ttft_p90_ms", "Rolling p90 time to first token.", labels, registry=r),
            "kvserve_itl_p90_ms": Gauge("kvserve_replica_itl_p90_ms", "Rolling p90 inter-token latency.", labels, registry=r),
            # What the autoscaler adds replicas on: the p90s' one-sided 95% lower confidence bounds.
            "kvserve_ttft_p90_low_ms": Gauge("kvserve_replica_ttft_p90_low_ms", "Lower confidence bound of the rolling "
                                             "TTFT p90.", labels, registry=r),
            "kvserve_itl_p90_low_ms": Gauge("kvserve_replica_itl_p90_low_ms", "Lower confidence bound of the rolling "
                                            "ITL p90.", labels, registry=r),
        }

    def _labels(self, tenant: str) -> tuple[str, str]:
        return tenant, self.tenant_class.get(tenant, UNKNOWN_CLASS)

    def request_done(self, tenant: str, kind: str, status: int, seconds: float, usage: dict | None = None) -> None:
        t = self._labels(tenant)
        self.requests.labels(*t, kind, str(status)).inc()
        self.latency.labels(*t, kind).observe(seconds)
        if usage:
            self.prompt_tokens.labels(*t).inc(usage.get("prompt_tokens") or 0)
            self.completion_tokens.labels(*t).inc(usage.get("completion_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens.labels(*t).inc(details.get("cached_tokens") or 0)

    def taken(self, tenant: str, waited_s: float) -> None:
        """A replica took the request after `waited_s` at the ingress and the routers."""
        self.queue_wait.labels(*self._labels(tenant)).observe(waited_s)

    def stream_timer(self, tenant: str, start: float) -> StreamTimer:
        return StreamTimer(self.ttft.labels(*self._labels(tenant)), self.itl.labels(*self._labels(tenant)), start)

    def render(self, replica_stats: list[dict]) -> tuple[bytes, str]:
        for gauges in (self.engine, self.window):
            for g in gauges.values():
                g.clear()
        for s in replica_stats:
            rid = s["replica_id"]
            for key, g in self.engine.items():
                g.labels(rid).set(float(s.get(key) or 0))
            for key, g in self.window.items():
                val = (s.get("window") or {}).get(key)
                if val is not None and val >= 0:  # negative = no samples in the window
                    g.labels(rid).set(float(val))
        self.engine_counters.stats = replica_stats
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
