"""Baseline for the simulator: Ray Serve's PrefixCacheAffinityRouter -- OUR RE-IMPLEMENTATION of its logic.

Live, policy `ray_prefix` runs Ray's real class
(ray.llm._internal.serve.routing_policies.prefix_aware); this pure copy of its
decision logic (ray 2.60, re-written, not copied) lets the simulator run it:

1. Fallback candidates: power of two choices on queue length (Serve's default).
2. If max - min queue length > `imbalanced_threshold` (default: infinite, i.e.
   never), return the fallback.
3. Else match the prompt against a prefix tree of routing history only
   (Ray inserts each prompt's *text* under the chosen replica after routing;
   eviction is off by default, and the engines' real evictions are never seen):
   - match rate (matched / prompt length) < `match_rate_threshold` (0.1):
     candidates = the replicas with the smallest trees;
   - else candidates = the replicas holding the longest match.
4. Serve picks the candidate with the shortest queue.

Units are characters when the request carries text, else token ids, else block
hashes (see `approx_tree.request_units`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from kvserve.policy_params import RouterParams
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.policies.approx_tree import HistoryRadixTree, least_loaded, request_units


class RayPrefixSimPolicy(RoutingPolicy):
    name = "ray_prefix"

    @classmethod
    def create(cls, params: RouterParams, seed: int) -> RoutingPolicy:
        return cls(seed)

    def __init__(
        self,
        seed: int = 0,
        match_rate_threshold: float = 0.1,
        imbalanced_threshold: float = math.inf,
    ) -> None:
        self.match_rate_threshold = match_rate_threshold
        self.imbalanced_threshold = imbalanced_threshold
        self.tree = HistoryRadixTree()
        self._rng = random.Random(seed)

    def candidates(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> list[str]:
        """The replica set Ray hands to Serve's shortest-queue pick."""
        ids = sorted(r.replica_id for r in replicas)
        # Ray computes the pow2 fallback first, on every request (it consumes randomness either way).
        fallback = self._rng.sample(ids, min(2, len(ids)))
        counts = [r.ongoing for r in replicas]
        if max(counts) - min(counts) > self.imbalanced_threshold:
            return fallback
        for rid in ids:
            self.tree.add_replica(rid)  # Ray adds tenants when replicas appear (size 0)
        units = request_units(request)
        matched, holders = self.tree.match(units, set(ids))
        rate = matched / len(units) if units else 0.0
        if rate < self.match_rate_threshold or not holders:
            smallest = min(self.tree.size(rid) for rid in ids)
            return [rid for rid in ids if self.tree.size(rid) == smallest]
        return sorted(holders)

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        loads = {r.replica_id: r for r in replicas}
        chosen = least_loaded(self.candidates(request, replicas), loads)
        rest = sorted((r for r in replicas if r.replica_id != chosen), key=lambda r: (r.ongoing, r.replica_id))
        return [chosen] + [r.replica_id for r in rest]

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.tree.insert(request_units(request), replica_id, now)

    def on_replica_gone(self, replica_id: str) -> None:
        self.tree.remove_replica(replica_id)
