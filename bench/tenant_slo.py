"""Per-tenant SLO attainment of a bench run (`flow.attainment` on measured requests).

A request's tenant is the workload's tenant name, or the API key's tenant when the bench sends one
key that the cluster's config names (the server then attributes every request to that tenant).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from bench.client import RequestResult
from flow.attainment import Outcome, per_tenant, tenant_targets
from flow.tiers import Tier
from kvserve.config import KVServeConfig, TenantsConfig
from kvserve.policy_params import SLOTargets

TargetsOf = Callable[[str], SLOTargets]


def targets_of(tenants: TenantsConfig | None, default: SLOTargets) -> TargetsOf:
    """tenant -> its class's targets; without the tenants section every tenant has the cluster's."""
    if tenants is None:
        return lambda _t: default
    tiers = {n: Tier(c.ttft_p90_ms, c.itl_p90_ms) for n, c in tenants.classes.items()}
    return tenant_targets(default, tiers, tenants.key_classes())


def key_tenant(cfg: KVServeConfig | None, api_key: str | None) -> str | None:
    """The tenant the config gives `api_key` (matched on its sha256), or None."""
    if cfg is None or not api_key:
        return None
    digest = hashlib.sha256(api_key.encode()).hexdigest()
    return next((k.tenant for k in cfg.tenants.keys if k.key_sha256 == digest), None)


def outcomes(results: Sequence[RequestResult], tenant: str | None = None) -> list[Outcome]:
    def ms(s: float | None) -> float | None:
        return None if s is None else s * 1000.0

    return [Outcome(tenant or r.tenant or "default", ms(r.ttft_s), ms(r.mean_itl_s), error=not r.ok) for r in results]


def tenants_json(results: Sequence[RequestResult], targets: TargetsOf, tenant: str | None = None) -> dict[str, Any]:
    """TENANT -> {requests, ttft_p50_ms, ttft_p90_ms, slo_attainment, errors}."""
    return per_tenant(outcomes(results, tenant), targets)
