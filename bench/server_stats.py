"""The server's own counters (`GET /kvserve/stats`) and config (`GET /kvserve/config`).

The prefix-cache hit rate of a run is read from the engines' cumulative counters
(after - before), never inferred from client-side numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


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
        )
        out[c.replica_id] = c
    return out


def _delta(after: int, before: int) -> int:
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


@dataclass(frozen=True)
class ColdStarts:
    """The ingress's cold-start histogram (`kvserve_cold_start_ttft_seconds`): requests that arrived while
    no replica served (scale from zero), and their summed times to first token."""

    count: float = 0.0
    sum_s: float = 0.0


def parse_cold_starts(metrics_text: str) -> ColdStarts:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "kvserve_cold_start_ttft_seconds":
            by = {s.name: s.value for s in family.samples}
            return ColdStarts(by.get(family.name + "_count", 0.0), by.get(family.name + "_sum", 0.0))
    return ColdStarts()


async def fetch_cold_starts(client: httpx.AsyncClient, base_url: str,
                            headers: dict | None = None) -> ColdStarts | None:
    """None from a server without kvserve's metrics (a bare vLLM, a test double)."""
    try:
        resp = await client.get(f"{base_url}/metrics", headers=headers, timeout=10.0)
    except httpx.HTTPError:
        return None
    return parse_cold_starts(resp.text) if resp.status_code == 200 else None


def cold_start_delta(before: ColdStarts | None, after: ColdStarts | None) -> tuple[int | None, float | None]:
    """(requests held for a cold start during the run, their mean time to first token in s). A count that
    went backwards belongs to a restarted ingress: count it from zero."""
    if after is None:
        return None, None
    if before is None or after.count < before.count:
        before = ColdStarts()
    n = after.count - before.count
    return int(n), ((after.sum_s - before.sum_s) / n if n else None)


def fetch_config_sync(base_url: str, headers: dict | None = None) -> dict:
    resp = httpx.get(f"{base_url}/kvserve/config", headers=headers, timeout=10.0)
    resp.raise_for_status()
    return resp.json()
