"""Stage 1 of the kvserve policy: the fleet's declared signals, from the replicas' reports.

Every field read here is declared on `ReplicaMetrics`; a replica that does not report an
optional one (None) falls back to the look-back value it refines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autoscaling.base import ReplicaMetrics
from kvserve.policy_params import SLOTargets


@dataclass(frozen=True)
class FleetSignals:
    rate_rps: float  # arrivals/s summed over replicas (look-back window)
    recent_rate_rps: float  # arrivals/s over the replicas' last few seconds (look-back rate if not reported)
    recent_admitted_rps: float  # requests/s the replicas received over their last few seconds
    uncached_prompt_tokens: float  # rate-weighted mean prompt tokens not served from cache
    prompt_tokens: float  # rate-weighted mean prompt tokens, cached or not (the decode context)
    output_tokens: float  # rate-weighted mean output tokens
    waiting: int  # requests queued in the engines
    running: int


def _weighted(pairs: Sequence[tuple[float, float]]) -> float:
    """Weighted mean of (value, weight); equal weights when all weights are zero; 0 when empty."""
    if not pairs:
        return 0.0
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    lo, hi = min(v for v, _ in pairs), max(v for v, _ in pairs)
    return min(max(sum(v * w for v, w in pairs) / total, lo), hi)  # rounding stays within the values


def _recent(m: ReplicaMetrics) -> float:
    return m.requests_per_s if m.recent_requests_per_s is None else m.recent_requests_per_s


def fleet_signals(metrics: Sequence[ReplicaMetrics]) -> FleetSignals:
    hit = [min(max(m.cache_hit_rate, 0.0), 1.0) for m in metrics]
    return FleetSignals(
        rate_rps=sum(max(m.requests_per_s, 0.0) for m in metrics),
        recent_rate_rps=sum(max(_recent(m), 0.0) for m in metrics),
        recent_admitted_rps=sum(max(m.recent_admitted_per_s or 0.0, 0.0) for m in metrics),
        uncached_prompt_tokens=_weighted([(m.mean_prompt_tokens * (1.0 - h), m.requests_per_s) for m, h in zip(metrics, hit)]),
        prompt_tokens=_weighted([(m.mean_prompt_tokens, m.requests_per_s) for m in metrics]),
        output_tokens=_weighted([(m.mean_output_tokens, m.requests_per_s) for m in metrics]),
        waiting=sum(m.waiting for m in metrics),
        running=sum(m.running for m in metrics),
    )


def replica_slo_ratio(m: ReplicaMetrics, slo: SLOTargets, low: bool = False) -> float | None:
    """max(p90 / target) over TTFT and ITL; `low`: of the p90s' lower confidence bounds (the point
    p90s where the replica reports no bound). None: no latency samples."""
    ttft, itl = m.ttft_p90_ms, m.itl_p90_ms
    if low:
        ttft = ttft if ttft is None or m.ttft_p90_low_ms is None else m.ttft_p90_low_ms
        itl = itl if itl is None or m.itl_p90_low_ms is None else m.itl_p90_low_ms
    ratios = [v / t for v, t in ((ttft, slo.ttft_p90_ms), (itl, slo.itl_p90_ms)) if v is not None]
    return max(ratios) if ratios else None


def fleet_slo_ratio(metrics: Sequence[ReplicaMetrics], slo: SLOTargets, quantile: float,
                    low: bool = False) -> float | None:
    """The `quantile` of per-replica SLO ratios, weighted by each replica's recent rate. A backlog
    queued on one replica while others started (more replicas cannot drain it) then does not read
    as a fleet-wide violation; an overload of most of the fleet does."""
    pairs = [(r, max(_recent(m), 0.0)) for m in metrics if (r := replica_slo_ratio(m, slo, low)) is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0:
        pairs, total = [(r, 1.0) for r, _ in pairs], float(len(pairs))
    acc = 0.0
    for r, w in sorted(pairs):
        acc += w
        if acc >= quantile * total - 1e-12:
            return r
    return max(r for r, _ in pairs)
