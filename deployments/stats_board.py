"""A tiny named Ray actor where replicas post their engine stats, so the ingress can show all of them.

Serve handles reach one replica per call; `/kvserve/stats`, `kvserve status` and
bench need every replica's counters, so replicas push (fire-and-forget) and the
ingress reads. Entries of replicas that stopped posting age out.
"""

from __future__ import annotations

import time
from typing import Any

import ray

BOARD_NAMESPACE = "kvserve"


@ray.remote(num_cpus=0)
class StatsBoard:
    def __init__(self) -> None:
        self._stats: dict[str, tuple[float, dict[str, Any]]] = {}
        self._hot: list = []

    def put_hot(self, hot: list) -> None:
        """The ingress's hottest prefixes (router.hot_prefixes.HotPrefix), hottest first."""
        self._hot = hot

    def get_hot(self) -> list:
        return self._hot

    def put(self, replica_id: str, stats: dict[str, Any]) -> None:
        self._stats[replica_id] = (time.time(), stats)

    def drop(self, replica_id: str) -> None:
        self._stats.pop(replica_id, None)

    def get(self, max_age_s: float = 5.0) -> list[dict[str, Any]]:
        now = time.time()
        self._stats = {k: v for k, v in self._stats.items() if now - v[0] <= 60.0}
        return [s for ts, s in self._stats.values() if now - ts <= max_age_s]


def board(app_name: str):
    return StatsBoard.options(
        name=f"stats-{app_name}", namespace=BOARD_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
