"""The server's own counters (`GET /kvserve/stats`) and config (`GET /kvserve/config`).

The prefix-cache hit rate of a run is read from the engines' cumulative counters
(after - before), never inferred from client-side numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvserve import latency_hist


@dataclass(frozen=True)
class ReplicaCounters:
    replica_id: str
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_requests: int
    kv_usage: float = 0.0
    waiting: int = 0
    running: int = 0
    cache_epoch: str | None = None  # bumped by a redeploy that empties the prefix caches
    posted_at: float | None = None  # the replica's wall clock when it took these counters
    steps: int = 0
    # The engine's side of TTFT (deployments.engine_stats): counts and sums in seconds.
    first_tokens: int = 0
    ttft_sum_s: float = 0.0
    finished: int = 0
    queued_sum_s: float = 0.0
    prefill_sum_s: float = 0.0
    ttft_hist: tuple[int, ...] = ()  # per-request, bucketed in ms over kvserve.latency_hist.EDGES_MS
    queued_hist: tuple[int, ...] = ()
    prefill_hist: tuple[int, ...] = ()


Snapshot = dict[str, ReplicaCounters]


def parse_stats(payload: dict) -> Snapshot:
    out: Snapshot = {}
    for r in payload.get("replicas", []):
        c = ReplicaCounters(
            replica_id=str(r["replica_id"]),
            prefix_cache_queries=int(r.get("prefix_cache_queries", 0)),
            prefix_cache_hits=int(r.get("prefix_cache_hits", 0)),
            num_requests=int(r.get("num_requests", 0)),
            kv_usage=float(r.get("kv_usage", 0.0)),
            waiting=int(r.get("waiting", 0)),
            running=int(r.get("running", 0)),
            cache_epoch=r.get("cache_epoch"),
            posted_at=r.get("posted_at"),
            steps=int(r.get("steps", 0)),
            first_tokens=int(r.get("first_tokens", 0)),
            ttft_sum_s=float(r.get("ttft_sum_s", 0.0)),
            finished=int(r.get("finished", 0)),
            queued_sum_s=float(r.get("queued_sum_s", 0.0)),
            prefill_sum_s=float(r.get("prefill_sum_s", 0.0)),
            ttft_hist=tuple(r.get("ttft_hist", ())),
            queued_hist=tuple(r.get("queued_hist", ())),
            prefill_hist=tuple(r.get("prefill_hist", ())),
        )
        out[c.replica_id] = c
    return out


def _delta(after: float, before: float) -> float:
    # A counter that went backwards belongs to a restarted replica: count it from zero.
    return after - before if after >= before else after


def prefix_hit_rate(before: Snapshot, after: Snapshot) -> float | None:
    """(Σ hits after − before) / (Σ queries after − before) over replicas alive at the end.

    Replicas that appeared during the run count from zero; those that vanished are
    lost (their counters went with them). None when no prompt tokens were queried.
    """
    hits = queries = 0
    for rid, a in after.items():
        b = before.get(rid)
        hits += _delta(a.prefix_cache_hits, b.prefix_cache_hits if b else 0)
        queries += _delta(a.prefix_cache_queries, b.prefix_cache_queries if b else 0)
    return hits / queries if queries > 0 else None


async def fetch_stats(client: httpx.AsyncClient, base_url: str, headers: dict | None = None) -> Snapshot:
    resp = await client.get(f"{base_url}/kvserve/stats", headers=headers, timeout=10.0)
    resp.raise_for_status()
    return parse_stats(resp.json())


async def fetch_settled_stats(client: httpx.AsyncClient, base_url: str, headers: dict | None = None,
                              timeout_s: float = 10.0, poll_s: float = 0.2) -> Snapshot:
    """The counters as of now: replicas post them to the stats board about once a second, so a snapshot
    read right after a run can miss its last requests. Polls until every replica's counters were taken
    after this call began. Past `timeout_s` (a clock skewed between hosts, a replica that stopped
    posting) returns the latest snapshot."""
    since = time.time()
    deadline = time.monotonic() + timeout_s
    while True:
        snap = await fetch_stats(client, base_url, headers)
        # A server that does not say when (a test double, an older kvserve) is taken as it is.
        if all(c.posted_at is None or c.posted_at >= since for c in snap.values()) or time.monotonic() >= deadline:
            return snap
        await asyncio.sleep(poll_s)


LAYERS = (("engine", "first_tokens", "ttft_sum_s", "ttft_hist"),
          ("engine_queue", "finished", "queued_sum_s", "queued_hist"),
          ("engine_prefill", "finished", "prefill_sum_s", "prefill_hist"))


def _summary(mean: float | None, quantile_of: Callable[[float], float | None]) -> dict[str, float | None]:
    return {"mean": mean, "p50": quantile_of(0.5), "p90": quantile_of(0.9)}


def engine_step_ms(before: Snapshot, after: Snapshot, duration_s: float) -> float | None:
    """Mean engine step time over the run (ms): the run's duration over each replica's steps, averaged
    over replicas that stepped. A replica that idled part of the run reads slower than its steps were."""
    per = [1000.0 * duration_s / n for rid, a in after.items()
           if (n := _delta(a.steps, before[rid].steps if rid in before else 0)) > 0]
    return sum(per) / len(per) if per else None


def _engine_layers(before: Snapshot, after: Snapshot) -> dict[str, dict[str, float | None]]:
    """Engine TTFT, scheduler wait and prefill (ms) over the run's requests, from the replicas'
    cumulative counters (after - before; replicas alive at the end, as for the hit rate)."""
    out = {}
    for layer, count, total, hist in LAYERS:
        n = s_sum = 0.0
        counts = [0.0] * (len(latency_hist.EDGES_MS) + 1)
        for rid, a in after.items():
            b = before.get(rid)
            n += _delta(getattr(a, count), getattr(b, count) if b else 0)
            s_sum += _delta(getattr(a, total), getattr(b, total) if b else 0)
            if getattr(a, hist):
                for i, v in enumerate(latency_hist.delta(getattr(a, hist), getattr(b, hist) if b else None)):
                    counts[i] += v
        out[layer] = _summary(1000.0 * s_sum / n if n else None,
                              lambda q: latency_hist.quantile(latency_hist.EDGES_MS, counts, q))
    return out


@dataclass(frozen=True)
class HistogramTotals:
    """A Prometheus histogram from the ingress's /metrics, summed over its label sets: count, sum (s), and
    the cumulative count at each bucket's upper edge (s)."""

    count: float = 0.0
    sum_s: float = 0.0
    buckets: tuple[tuple[float, float], ...] = field(default=(), compare=False)

    def since(self, before: HistogramTotals | None) -> tuple[float, float]:
        """(count, sum) over the run: self - before. A count that went backwards belongs to a restarted
        ingress: count it from zero."""
        if before is None or self.count < before.count:
            return self.count, self.sum_s
        return self.count - before.count, self.sum_s - before.sum_s


ColdStarts = HistogramTotals  # `kvserve_cold_start_ttft_seconds`: requests held while no replica served
INGRESS_TTFT = "kvserve_ttft_seconds"
COLD_START_TTFT = "kvserve_cold_start_ttft_seconds"


def parse_histogram(metrics_text: str, name: str) -> HistogramTotals:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == name:
            count = total = 0.0
            cum: dict[float, float] = {}
            for s in family.samples:  # one series per label set (tenant, class): add them up
                if s.name == name + "_count":
                    count += s.value
                elif s.name == name + "_sum":
                    total += s.value
                elif s.name == name + "_bucket":
                    le = float(s.labels["le"])
                    cum[le] = cum.get(le, 0.0) + s.value
            return HistogramTotals(count, total, tuple(sorted(cum.items())))
    return HistogramTotals()


def parse_cold_starts(metrics_text: str) -> ColdStarts:
    return parse_histogram(metrics_text, COLD_START_TTFT)


async def fetch_histograms(client: httpx.AsyncClient, base_url: str,
                           headers: dict | None = None) -> dict[str, HistogramTotals] | None:
    """The ingress's cold-start and TTFT histograms; None from a server without kvserve's metrics (a bare
    vLLM, a test double)."""
    try:
        resp = await client.get(f"{base_url}/metrics", headers=headers, timeout=10.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    return {name: parse_histogram(resp.text, name) for name in (COLD_START_TTFT, INGRESS_TTFT)}


def _ingress_layer(before: HistogramTotals | None, after: HistogramTotals | None) -> dict[str, float | None]:
    if after is None:
        return _summary(None, lambda q: None)
    if before is None or after.count < before.count:
        before = HistogramTotals()
    n, total = after.since(before)
    was = dict(before.buckets)
    edges = [le for le, _ in after.buckets if le != float("inf")]
    cum = [c - was.get(le, 0.0) for le, c in after.buckets]
    counts = [c - (cum[i - 1] if i else 0.0) for i, c in enumerate(cum)]  # +Inf last: the overflow bucket

    def quantile_ms(q: float) -> float | None:
        x = latency_hist.quantile(edges, counts, q) if edges else None
        return None if x is None else 1000.0 * x

    return _summary(1000.0 * total / n if n else None, quantile_ms)


def ttft_breakdown_ms(client_ttfts_ms: Sequence[float], before: Snapshot, after: Snapshot,
                      ingress_before: HistogramTotals | None,
                      ingress_after: HistogramTotals | None) -> dict[str, dict[str, float | None]]:
    """Where the time to first token goes, outermost first: per layer its mean, p50 and p90 (ms).
    client: the bench's own clock; ingress: the kvserve ingress, arrival -> first chunk out (client -
    ingress is the HTTP proxy and the client); engine: vLLM's frontend in the replica, arrival -> first
    token (ingress - engine is routing, the Serve handle hop and the relay); engine_queue and
    engine_prefill: the scheduler's wait and the steps the prefill rode in (engine - those is the
    engine's own input and output processing). Quantiles of the server's layers are read from
    histograms, within a bucket of the exact ones."""
    ts = sorted(client_ttfts_ms)
    client = _summary(sum(ts) / len(ts) if ts else None,
                      lambda q: ts[min(int(q * len(ts)), len(ts) - 1)] if ts else None)
    return {"client": client, "ingress": _ingress_layer(ingress_before, ingress_after),
            **_engine_layers(before, after)}


def cold_start_delta(before: ColdStarts | None, after: ColdStarts | None) -> tuple[int | None, float | None]:
    """(requests held for a cold start during the run, their mean time to first token in s). A count that
    went backwards belongs to a restarted ingress: count it from zero."""
    if after is None:
        return None, None
    n, total = after.since(before)
    return int(n), (total / n if n else None)


def fetch_config_sync(base_url: str, headers: dict | None = None) -> dict:
    resp = httpx.get(f"{base_url}/kvserve/config", headers=headers, timeout=10.0)
    resp.raise_for_status()
    return resp.json()
