"""Run metrics from measured requests: latency percentiles, throughput, goodput, share, errors."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from bench.client import RequestResult


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method); None for no data."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def share_max_over_mean(counts: dict[str, int], replicas: Iterable[str] = ()) -> float | None:
    """Max per-replica request share / mean share; replicas that got nothing still count."""
    names = set(counts) | set(replicas)
    total = sum(counts.values())
    if not names or total == 0:
        return None
    return max(counts.get(n, 0) for n in names) / (total / len(names))


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


@dataclass
class RunMetrics:
    requests: int
    ok: int
    errors: int
    errors_by_kind: dict[str, int]
    duration_s: float
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p90_ms: float | None
    e2e_p99_ms: float | None
    request_per_s: float
    output_tok_per_s: float
    goodput_req_per_s: float
    slo_ttft_ms: float
    slo_itl_ms: float
    replica_requests: dict[str, int]
    share_max_over_mean: float | None
    prefix_hit_rate: float | None = None
    replicas: int | None = None  # replicas serving when the run started, checked against the count asked for
    cached_tokens_fraction: float | None = None  # client-side cross-check from usage, not the headline
    # How late the bench's own event loop ran (`bench.loop_lag`): client-side delay inside every latency.
    client_loop_lag_p99_ms: float | None = None
    client_loop_lag_max_ms: float | None = None
    # Scale from zero: requests the ingress held while no replica served, and their mean time to first token.
    cold_start_requests: int | None = None
    cold_start_ttft_s: float | None = None
    # Mean TTFT by where it is spent, client -> ingress -> engine (bench.server_stats.ttft_breakdown_ms).
    ttft_breakdown_ms: dict[str, dict[str, float | None]] | None = None
    engine_step_ms: float | None = None  # mean engine step over the run (bench.server_stats.engine_step_ms)
    ttft_ms_all: list[float] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("ttft_ms_all")
        return d


def meets_slo(r: RequestResult, slo_ttft_ms: float, slo_itl_ms: float) -> bool:
    """Good = succeeded, TTFT within SLO, and mean inter-token gap (TPOT) within SLO."""
    if not r.ok or r.ttft_s is None or r.ttft_s * 1000.0 > slo_ttft_ms:
        return False
    itl = r.mean_itl_s
    return itl is None or itl * 1000.0 <= slo_itl_ms


def summarize(
    results: Sequence[RequestResult],
    *,
    slo_ttft_ms: float,
    slo_itl_ms: float,
    duration_s: float | None = None,
    replicas: Iterable[str] = (),
) -> RunMetrics:
    """Aggregate a run. Duration defaults to first send -> last completion."""
    ok = [r for r in results if r.ok]
    if duration_s is None:
        ends = [r.done_at for r in results if r.done_at is not None]
        duration_s = (max(ends) - min(r.start for r in results)) if ends else 0.0
    per_s = (lambda n: n / duration_s) if duration_s > 0 else (lambda n: 0.0)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    itl = [g for r in ok for g in r.itl_s]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    kinds = Counter(r.error for r in results if not r.ok)
    counts = Counter(r.replica for r in ok if r.replica)
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return RunMetrics(
        requests=len(results),
        ok=len(ok),
        errors=len(results) - len(ok),
        errors_by_kind={str(k): v for k, v in kinds.items()},
        duration_s=duration_s,
        ttft_p50_ms=_ms(percentile(ttft, 50)),
        ttft_p90_ms=_ms(percentile(ttft, 90)),
        ttft_p99_ms=_ms(percentile(ttft, 99)),
        itl_p50_ms=_ms(percentile(itl, 50)),
        itl_p90_ms=_ms(percentile(itl, 90)),
        itl_p99_ms=_ms(percentile(itl, 99)),
        e2e_p50_ms=_ms(percentile(e2e, 50)),
        e2e_p90_ms=_ms(percentile(e2e, 90)),
        e2e_p99_ms=_ms(percentile(e2e, 99)),
        request_per_s=per_s(len(ok)),
        output_tok_per_s=per_s(sum(r.output_tokens for r in ok)),
        goodput_req_per_s=per_s(sum(meets_slo(r, slo_ttft_ms, slo_itl_ms) for r in results)),
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        replica_requests=dict(counts),
        share_max_over_mean=share_max_over_mean(counts, replicas),
        cached_tokens_fraction=cached / prompt if prompt else None,
        ttft_ms_all=[t * 1000.0 for t in ttft],
    )
