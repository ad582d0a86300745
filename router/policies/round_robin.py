"""Round robin: the cache-blind, load-blind baseline."""

from __future__ import annotations

from collections.abc import Sequence

from router.base import ReplicaLoad, RouteRequest, RoutingPolicy


class RoundRobinPolicy(RoutingPolicy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        ids = sorted(r.replica_id for r in replicas)
        k = self._next % len(ids)
        self._next += 1
        return ids[k:] + ids[:k]
