"""Per-tenant SLO tiers in the simulator: the autoscaler plans for the tightest tier that has traffic.

As live (deployments.autoscaling_policy), the adapter computes the effective targets and hands them
to the pure policy as its targets, rebuilding it (state carried over) when they change. Arrivals
are read from the workload as the clock passes them (each tenant's class from `tenants.keys`).
"""

from __future__ import annotations

from collections.abc import Callable

from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from flow.tiers import Tier, TierTraffic
from kvserve.config import KVServeConfig
from kvserve.policy_params import SLOTargets
from simulator.engine import SimRequest


class TieredTargets:
    """Wraps a pure autoscaler: before each decision, its targets become the tightest tier with traffic."""

    def __init__(self, make: Callable[[SLOTargets], ScalingPolicy], cfg: KVServeConfig,
                 requests: list[SimRequest]) -> None:
        self.make, self.default = make, cfg.slo.params()
        self.targets, self.policy = self.default, make(self.default)
        self.name = getattr(self.policy, "name", "policy")
        self.of = cfg.tenants.key_classes()
        tiers = {n: Tier(c.ttft_p90_ms, c.itl_p90_ms) for n, c in cfg.tenants.classes.items()
                 if c.ttft_p90_ms is not None or c.itl_p90_ms is not None}  # as deployments.tier_stats
        self.traffic = TierTraffic(tiers, cfg.autoscaling.look_back_s)
        self.requests = sorted(requests, key=lambda r: r.arrival)
        self._next = 0
        self.history: list[tuple[float, SLOTargets]] = []

    def decide(self, inp: ScalingInput) -> Decision:
        while self._next < len(self.requests) and self.requests[self._next].arrival <= inp.now:
            r = self.requests[self._next]
            self.traffic.saw(self.of.get(r.tenant, "default"), r.arrival)
            self._next += 1
        targets = self.traffic.targets(self.default, inp.now)
        if targets != self.targets:
            state = self.policy.get_state()
            self.targets, self.policy = targets, self.make(targets)
            self.policy.set_state(state)
            self.history.append((inp.now, targets))
        return self.policy.decide(inp)

    def get_state(self) -> dict:
        return self.policy.get_state()

    def set_state(self, state: dict) -> None:
        self.policy.set_state(state)
