"""Per-tenant SLO attainment of a simulated run (`flow.attainment` on simulated requests).

A tenant's class comes from `tenants.keys` (as the live ingress has it); its targets are the
class's, or the cluster's `slo` where the class sets none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flow.attainment import Outcome, per_tenant, tenant_targets
from flow.tiers import Tier
from kvserve.config import KVServeConfig
from kvserve.policy_params import SLOTargets
from simulator.engine import SimRequest


def targets_of(cfg: KVServeConfig) -> Callable[[str], SLOTargets]:
    tiers = {n: Tier(c.ttft_p90_ms, c.itl_p90_ms) for n, c in cfg.tenants.classes.items()}
    return tenant_targets(cfg.slo.params(), tiers, cfg.tenants.key_classes())


def outcome(r: SimRequest) -> Outcome:
    """TTFT from arrival (router wait included, as a client sees it); mean ITL over the decode steps after the first."""
    if r.failed or r.first_token is None:
        return Outcome(r.tenant, None, error=r.failed)  # unfinished at the end: a miss, not an error
    itl = None
    if r.finished is not None and r.generated > 1:
        itl = (r.finished - r.first_token) * 1000.0 / (r.generated - 1)
    return Outcome(r.tenant, (r.first_token - r.arrival) * 1000.0, itl)


def tenants_json(requests: Sequence[SimRequest], cfg: KVServeConfig) -> dict[str, Any]:
    """TENANT -> {requests, ttft_p50_ms, ttft_p90_ms, slo_attainment, errors}."""
    return per_tenant((outcome(r) for r in requests), targets_of(cfg))
