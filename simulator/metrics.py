"""Latency percentiles, rolling windows and per-minute SLO attainment of a simulation run."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvserve.config import SLOConfig
from simulator.engine import SimRequest

MINUTE_S = 60.0
UNSERVED_TTFT_MS = 1e12  # a request never served (a 503) in per-minute SLO checks: a miss


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else None


def weighted_percentile(values: Sequence[float], weights: Sequence[float], q: float) -> float | None:
    """Percentile of `values` where value i occurs `weights[i]` times (ITL: a step's time, once per token)."""
    if not len(values):
        return None
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    if cum[-1] <= 0:
        return None
    i = int(np.searchsorted(cum, q / 100.0 * cum[-1], side="left"))
    return float(v[order][min(i, len(v) - 1)])


class TrailingPeak:
    """Peak of a step function over a trailing span: Serve's `total_queued_requests` under
    `aggregation_function: max` (the peak of the handles' summed queue over the look-back)."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, float]] = deque([(0.0, 0.0)])  # (since, value)

    def set(self, value: float, now: float) -> None:
        last_t, last_v = self.points[-1]
        if value == last_v:
            return
        if now <= last_t:
            self.points[-1] = (last_t, value)
        else:
            self.points.append((now, value))

    def peak(self, now: float, span_s: float) -> float:
        pts = self.points
        while len(pts) > 1 and pts[1][0] <= now - span_s:
            pts.popleft()  # the first point left is the value in effect at the span's start
        return max(v for _, v in pts)


@dataclass
class ItlLog:
    """Every engine step with decoders: (end time, step ms, tokens it produced for decoders)."""

    t: list[float] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, t: float, ms: float, tokens: int) -> None:
        self.t.append(t)
        self.ms.append(ms)
        self.tokens.append(tokens)


class Window:
    """One replica's rolling window of events for the autoscaler's ReplicaMetrics."""

    __slots__ = ("ttft", "itl", "arrivals", "hits")

    def __init__(self) -> None:
        self.ttft: deque[tuple[float, float]] = deque()  # (t, ttft ms)
        self.itl: deque[tuple[float, float, int]] = deque()  # (t, step ms, tokens)
        self.arrivals: deque[tuple[float, int, int]] = deque()  # (t, prompt tokens, output tokens)
        self.hits: deque[tuple[float, int, int]] = deque()  # (t, hit blocks, prompt blocks)

    def trim(self, since: float) -> None:
        for d in (self.ttft, self.itl, self.arrivals, self.hits):
            while d and d[0][0] < since:
                d.popleft()


def minute_buckets(requests: Sequence[SimRequest], itl: ItlLog) -> dict[int, tuple[list[float], list[float], list[int]]]:
    """minute -> (TTFTs of requests arriving in it, step ms, step tokens of steps ending in it).
    A request that never got a first token (a 503, or never served) counts as `UNSERVED_TTFT_MS`."""
    out: dict[int, tuple[list[float], list[float], list[int]]] = {}
    for r in requests:
        if r.first_token is not None:
            out.setdefault(int(r.arrival // MINUTE_S), ([], [], []))[0].append((r.first_token - r.arrival) * 1000.0)
        elif r.failed:
            out.setdefault(int(r.arrival // MINUTE_S), ([], [], []))[0].append(UNSERVED_TTFT_MS)
    for t, ms, n in zip(itl.t, itl.ms, itl.tokens):
        b = out.setdefault(int(t // MINUTE_S), ([], [], []))
        b[1].append(ms)
        b[2].append(n)
    return out


def seconds_per_minute(spans: Sequence[tuple[float, float]], end: float) -> list[float]:
    """Replica-seconds per minute of [0, end): each (start, stop) span split at minute boundaries.
    Sums to the spans' total length within [0, end] (what `RunResult.replica_seconds` counts)."""
    out = [0.0] * max(1, math.ceil(end / MINUTE_S))
    for start, stop in spans:
        a, b = max(start, 0.0), min(stop, end)
        while a < b:
            m = min(int(a // MINUTE_S), len(out) - 1)
            nxt = min(b, (m + 1) * MINUTE_S) if m < len(out) - 1 else b
            out[m] += nxt - a
            a = nxt
    return out


def minute_ok(bucket: tuple[list[float], list[float], list[int]], slo: SLOConfig) -> bool:
    ttft, ms, n = bucket
    p_ttft = percentile(ttft, 90)
    p_itl = weighted_percentile(ms, n, 90)
    return (p_ttft is None or p_ttft <= slo.ttft_p90_ms) and (p_itl is None or p_itl <= slo.itl_p90_ms)


def slo_attainment(requests: Sequence[SimRequest], itl: ItlLog, slo: SLOConfig) -> float:
    """Fraction of minutes (with any traffic) whose TTFT p90 and ITL p90 are within the SLO."""
    buckets = minute_buckets(requests, itl)
    if not buckets:
        return 1.0
    return sum(minute_ok(b, slo) for b in buckets.values()) / len(buckets)


def latency_summary(requests: Sequence[SimRequest], itl: ItlLog) -> dict[str, float | None]:
    done = [r for r in requests if r.finished is not None and not r.failed]
    ttft = [(r.first_token - r.arrival) * 1000.0 for r in done if r.first_token is not None]
    e2e = [(r.finished - r.arrival) * 1000.0 for r in done]  # type: ignore[operator]
    return {
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p90_ms": percentile(ttft, 90),
        "ttft_p99_ms": percentile(ttft, 99),
        "itl_p50_ms": weighted_percentile(itl.ms, itl.tokens, 50),
        "itl_p90_ms": weighted_percentile(itl.ms, itl.tokens, 90),
        "e2e_p50_ms": percentile(e2e, 50),
        "e2e_p90_ms": percentile(e2e, 90),
    }


def scale_up_window(
    requests: Sequence[SimRequest], serving_since: dict[str, float], window_s: float = 30.0
) -> dict[str, float | int | None]:
    """TTFT and hit rate of the requests each scaled-up replica took in its first `window_s` of serving.

    The scale-up spike of issue 5 item 4: a new replica's first requests pay cold prefills unless it was
    warmed. Replicas serving from t=0 are not scale-ups and are left out.
    """
    new = {rid: t for rid, t in serving_since.items() if t > 0.0}
    win = [r for r in requests if r.replica in new and r.routed is not None and r.first_token is not None
           and not r.failed and r.routed - new[r.replica] <= window_s]
    ttft = [(r.first_token - r.arrival) * 1000.0 for r in win]  # type: ignore[operator]
    blocks = sum(len(r.block_hashes) for r in win)
    return {
        "scaleup_requests": len(win),
        "scaleup_ttft_p50_ms": percentile(ttft, 50),
        "scaleup_ttft_p90_ms": percentile(ttft, 90),
        "scaleup_hit_rate": sum(r.hit_blocks for r in win) / blocks if blocks else None,
    }


def prefix_hit_rate(requests: Sequence[SimRequest]) -> float:
    """Prompt blocks found cached on the chosen replica / all prompt blocks (block-weighted)."""
    hit = sum(r.hit_blocks for r in requests if r.admitted is not None)
    total = sum(len(r.block_hashes) for r in requests if r.admitted is not None)
    return hit / total if total else 0.0


def share_max_over_mean(counts: Sequence[int]) -> float | None:
    """Busiest replica's request count over the mean (1.0 = perfectly even)."""
    if not counts or sum(counts) == 0:
        return None
    return max(counts) / (sum(counts) / len(counts))


def request_rows(policy: str, requests: Sequence[SimRequest]) -> list[dict]:
    """One record per simulated request, in arrival order, with `kvserve bench --requests-jsonl`'s fields."""

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * 1000.0, 3)

    t0 = min((r.arrival for r in requests), default=0.0)
    return [
        {
            "policy": policy, "idx": r.idx, "tenant": r.tenant, "replica": r.replica,
            "sent_s": round(r.arrival - t0, 6), "ttft_ms": ms(r.arrival, r.first_token),
            "e2e_ms": ms(r.arrival, r.finished), "prompt_tokens": r.prompt_tokens, "cached_tokens": r.hit_tokens,
            "output_tokens": r.generated, "ok": not r.failed and r.finished is not None,
            "error": "failed" if r.failed else None,
            "status": None, "elapsed_ms": ms(r.arrival, r.finished), "error_detail": None,
        }
        for r in sorted(requests, key=lambda r: (r.arrival, r.idx))
    ]
