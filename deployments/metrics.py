"""Prometheus metrics of the ingress (per tenant) plus engine gauges and counters gathered from the replicas."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# Cumulative engine counts each replica reports: exported as counters (`<name>_total`), so rate()
# applies and a replica's restart reads as a counter reset. name -> (stats key, help).
ENGINE_COUNTERS = {
    "kvserve_engine_prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "kvserve_engine_prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
}


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


class IngressMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvserve_requests", "Requests by tenant, endpoint kind and status.",
                                ["tenant", "kind", "status"], registry=r)
        self.latency = Histogram("kvserve_request_seconds", "Ingress-side request latency (to the last byte for "
                                 "streams).", ["tenant", "kind"], registry=r,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
        self.prompt_tokens = Counter("kvserve_prompt_tokens", "Prompt tokens of requests whose response has usage "
                                     "(non-streamed, or streamed with stream_options.include_usage).",
                                     ["tenant"], registry=r)
        self.cached_tokens = Counter("kvserve_cached_prompt_tokens", "Prompt tokens served from the prefix cache.",
                                     ["tenant"], registry=r)
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

    def request_done(self, tenant: str, kind: str, status: int, seconds: float, usage: dict | None = None) -> None:
        self.requests.labels(tenant, kind, str(status)).inc()
        self.latency.labels(tenant, kind).observe(seconds)
        if usage:
            self.prompt_tokens.labels(tenant).inc(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens.labels(tenant).inc(details.get("cached_tokens") or 0)

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
