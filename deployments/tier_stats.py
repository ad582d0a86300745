"""Per-tenant SLO tiers, replica side: which tiers sent this replica requests lately, reported with
the autoscaling stats so the autoscaler plans for the tightest tier that has traffic (flow.tiers).

Two extra keys in `record_autoscaling_stats()`: the tightest TTFT and ITL targets among the classes
(with a tier of their own) seen within the look-back window, NO_DATA when none. The controller
side (`tier_targets`) takes the tightest over every replica and the cluster's own targets.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from autoscaling.window import NO_DATA
from deployments.tenant_classes import tenant_classes
from flow.tiers import Tier, TierTraffic, effective_targets
from kvserve.config import KVServeConfig
from kvserve.policy_params import SLOTargets

TIER_TTFT_KEY = "kvserve_tier_ttft_p90_ms"
TIER_ITL_KEY = "kvserve_tier_itl_p90_ms"


def class_tiers(cfg: KVServeConfig) -> dict[str, Tier]:
    """The classes with a target of their own."""
    return {name: Tier(c.ttft_p90_ms, c.itl_p90_ms) for name, c in cfg.tenants.classes.items()
            if c.ttft_p90_ms is not None or c.itl_p90_ms is not None}


class TierStats:
    def __init__(self, cfg: KVServeConfig) -> None:
        self.of = tenant_classes(cfg.tenants)
        self.traffic = TierTraffic(class_tiers(cfg), cfg.autoscaling.look_back_s)

    def saw(self, tenant: str) -> None:
        self.traffic.saw(self.of.get(tenant, "default"), time.monotonic())

    def stats(self) -> dict[str, float]:
        inf = SLOTargets(float("inf"), float("inf"))
        t = self.traffic.targets(inf, time.monotonic())
        return {TIER_TTFT_KEY: t.ttft_p90_ms if t.ttft_p90_ms != float("inf") else NO_DATA,
                TIER_ITL_KEY: t.itl_p90_ms if t.itl_p90_ms != float("inf") else NO_DATA}


def tier_targets(default: SLOTargets, replica_stats: Iterable[Mapping[str, float]]) -> SLOTargets:
    """The cluster's targets, tightened by every tier some replica saw traffic from."""
    tiers = []
    for s in replica_stats:
        ttft, itl = s.get(TIER_TTFT_KEY, NO_DATA), s.get(TIER_ITL_KEY, NO_DATA)
        tiers.append(Tier(ttft if ttft > 0 else None, itl if itl > 0 else None))
    return effective_targets(default, tiers)
