"""Power of two choices on queue length: Ray Serve's default router, as a pure policy.

Used by the simulator; live, `pow2` means Serve's own PowerOfTwoChoicesRequestRouter.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from kvserve.policy_params import RouterParams
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy


class PowerOfTwoPolicy(RoutingPolicy):
    name = "pow2"

    @classmethod
    def create(cls, params: RouterParams, seed: int) -> RoutingPolicy:
        return cls(seed)

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        picks = self._rng.sample(list(replicas), min(2, len(replicas)))
        picks.sort(key=lambda r: r.ongoing)
        chosen = {r.replica_id for r in picks}
        rest = sorted((r for r in replicas if r.replica_id not in chosen), key=lambda r: r.ongoing)
        return [r.replica_id for r in picks + rest]
