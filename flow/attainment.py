"""Per-tenant SLO attainment: the share of a tenant's requests that met its class's targets.

Reported per tenant by `kvserve bench`, `kvserve sim` and the noisy-neighbour runs. It is a fraction
of requests rather than the tenant's p90 itself because it is defined for any number of requests
(a p90 over three requests says little), adds up across runs and tenants, and reads directly against
the target: a tier of `ttft_p90_ms` is met when at least 0.9 of the requests are within it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flow.tiers import Tier
from kvserve.policy_params import SLOTargets


@dataclass(frozen=True)
class Outcome:
    """One request as measured: its tenant, TTFT (None: it failed or never streamed) and mean ITL (None: not measured)."""

    tenant: str
    ttft_ms: float | None
    itl_ms: float | None = None
    error: bool = False


def met(o: Outcome, targets: SLOTargets) -> bool:
    """Within both targets; a failed request, or one without a first token, misses."""
    if o.error or o.ttft_ms is None or o.ttft_ms > targets.ttft_p90_ms:
        return False
    return o.itl_ms is None or o.itl_ms <= targets.itl_p90_ms


def slo_attainment(outcomes: Sequence[Outcome], targets: SLOTargets) -> float | None:
    """Fraction of `outcomes` that met `targets`, in [0, 1]; None for no requests."""
    return sum(met(o, targets) for o in outcomes) / len(outcomes) if outcomes else None


def ttft_attainment(ttft_ms: Sequence[float | None], target_ms: float) -> float | None:
    """TTFT alone (the noisy-neighbour runs): fraction of requests (None: failed) with TTFT <= target_ms."""
    return slo_attainment([Outcome("", x) for x in ttft_ms], SLOTargets(target_ms, math.inf))


def tenant_targets(default: SLOTargets, tiers: Mapping[str, Tier], class_of: Mapping[str, str]) -> Callable[[str], SLOTargets]:
    """tenant -> its class's targets (a target the class leaves None is the cluster's; unknown tenant: class default)."""

    def of(tenant: str) -> SLOTargets:
        tier = tiers.get(class_of.get(tenant, "default"), Tier())
        return SLOTargets(tier.ttft_p90_ms if tier.ttft_p90_ms is not None else default.ttft_p90_ms,
                          tier.itl_p90_ms if tier.itl_p90_ms is not None else default.itl_p90_ms)

    return of


def _p(xs: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default, as bench.metrics and simulator.metrics)."""
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def per_tenant(outcomes: Iterable[Outcome], targets_of: Callable[[str], SLOTargets]) -> dict[str, dict[str, float | int | None]]:
    """TENANT -> {requests, ttft_p50_ms, ttft_p90_ms, slo_attainment, errors}, tenants sorted by name."""
    by: dict[str, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(o.tenant, []).append(o)
    out: dict[str, dict[str, float | int | None]] = {}
    for t, os_ in sorted(by.items()):
        ttft = sorted(o.ttft_ms for o in os_ if not o.error and o.ttft_ms is not None)
        out[t] = {"requests": len(os_), "ttft_p50_ms": _p(ttft, 50), "ttft_p90_ms": _p(ttft, 90),
                  "slo_attainment": slo_attainment(os_, targets_of(t)), "errors": sum(o.error for o in os_)}
    return out
