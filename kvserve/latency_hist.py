"""Latency histograms for quantiles of a run: fixed bucket edges, so a histogram is a list of counts that
a hot loop bumps cheaply and a reader subtracts (a run = after - before), like Prometheus's.

`EDGES_MS` grow by 25% a bucket from 1 ms to about a minute, so a quantile read from them is within
one bucket (±12%) of the exact one; the last count holds everything above the last edge.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

RATIO = 1.25
EDGES_MS = tuple(round(RATIO**i, 3) for i in range(50))  # bucket i: (EDGES_MS[i-1], EDGES_MS[i]]


def new_counts() -> list[int]:
    return [0] * (len(EDGES_MS) + 1)


def add(counts: list[int], ms: float) -> None:
    counts[bisect_left(EDGES_MS, ms)] += 1


def delta(after: Sequence[float], before: Sequence[float] | None) -> list[float]:
    """after - before, bucket by bucket; a histogram that shrank (its process restarted) counts from zero."""
    if not before or len(before) != len(after) or any(a < b for a, b in zip(after, before)):
        return list(after)
    return [a - b for a, b in zip(after, before)]


def quantile(edges: Sequence[float], counts: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) of per-bucket `counts` over upper `edges` (one more count than edges: the
    overflow bucket, read as its lower edge), interpolated linearly inside its bucket; None if empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen = q * total, 0.0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(edges):
                return float(edges[-1])
            lo = edges[i - 1] if i else 0.0
            return lo + (edges[i] - lo) * (rank - seen) / n
        seen += n
    return float(edges[-1])
