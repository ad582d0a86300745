"""Ray Serve RequestRouter that runs a pure routing policy (router.registry) on live replicas.

Replicas report their engine state in `record_routing_stats()` (cached block
hashes derived from vLLM KV events, queue sizes, KV usage); Serve's controller
broadcasts those to every router. We translate them into the policy's feeds
(`on_cache_snapshot`, `ReplicaLoad`) and the policy's ranking into Serve's
ranked candidate lists. Any failure inside the policy falls back to load-only
ranking: the router never fails a request.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from ray.serve._private.common import ReplicaID
from ray.serve._private.request_router.common import PendingRequest
from ray.serve._private.request_router.replica_wrapper import RunningReplica
from ray.serve._private.request_router.request_router import LocalityMixin, MultiplexMixin, RequestRouter

from kvserve.config import RouterConfig
from router.base import ReplicaLoad, RouteRequest
from router.bookings import Bookings
from router.liveness import live_ids
from router.registry import make_policy

log = logging.getLogger("kvserve.router")


class KVServeRequestRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(self, policy: str = "kvserve", router_config: dict | None = None, seed: int = 0) -> None:
        self.cfg = RouterConfig.model_validate(router_config or {})
        self.policy = make_policy(policy, self.cfg.params(), seed)
        self._stats_ts: dict[str, float] = {}
        self._stats_version: dict[str, int] = {}
        self.bookings = Bookings(self.policy)  # charges each decision at once (see router.bookings)
        self._last_freeze = 0.0

    # -- feeds ---------------------------------------------------------------------------------

    def _sync(self, replicas: list[RunningReplica], now: float) -> dict[str, dict]:
        """Push fresh replica stats into the policy; returns the usable stats per replica id."""
        usable: dict[str, dict] = {}
        for r in replicas:
            rid = r.replica_id.unique_id
            stats = r.routing_stats or {}
            if not stats.get("ready"):
                continue
            ts = float(stats.get("ts", 0.0))
            if now - ts > self.cfg.stale_after_s:
                continue  # silent replica: no cache credit, load from our own counts only
            usable[rid] = stats
            if ts != self._stats_ts.get(rid):
                self._stats_ts[rid] = ts
                version = int(stats.get("blocks_version", -1))
                if version != self._stats_version.get(rid):
                    self._stats_version[rid] = version
                    self.policy.on_cache_snapshot(rid, stats.get("blocks", ()), now)
                    if now - self._last_freeze > 60.0:
                        # The index is ~1M long-lived small objects at scale; keep them out of full
                        # GC passes, which otherwise stall a routing decision for ~200 ms.
                        gc.freeze()
                        self._last_freeze = now
                else:
                    self.policy.on_cache_events(rid, (), (), now)  # heartbeat: still alive, unchanged
        return usable

    @staticmethod
    def _route_request(pending: PendingRequest | None) -> RouteRequest | None:
        if pending is None or not pending.args:
            return None
        work = pending.args[0]
        hashes = getattr(work, "block_hashes", None)
        if hashes is None:
            return None
        return RouteRequest(
            request_id=pending.metadata.internal_request_id,
            block_hashes=hashes,
            num_prompt_tokens=getattr(work, "num_prompt_tokens", 0),
            tenant=getattr(work, "tenant", "default"),
            expected_output_tokens=int(getattr(work, "expected_output_tokens", 0) or 0),
        )

    def _load(self, r: RunningReplica, stats: dict | None) -> ReplicaLoad:
        rid = r.replica_id.unique_id
        ongoing = self.bookings.ongoing(rid)
        cached_q = self._replica_queue_len_cache.get(r.replica_id)
        if cached_q is not None:
            ongoing = max(ongoing, cached_q)
        stats = stats or {}
        return ReplicaLoad(
            replica_id=rid,
            ongoing=ongoing,
            waiting=int(stats.get("waiting", 0)),
            running=int(stats.get("running", 0)),
            queued_prefill_tokens=int(stats.get("queued_prefill_tokens", 0)),
            kv_usage=float(stats.get("kv_usage", 0.0)),
            kv_capacity_tokens=int(stats.get("kv_capacity_tokens", 0)),
        )

    # -- Serve hooks ---------------------------------------------------------------------------

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        now = time.time()
        request = self._route_request(pending_request)
        if request is None or not candidate_replicas:
            return [candidate_replicas]
        try:
            keep = set(live_ids({r.replica_id.unique_id: r.routing_stats for r in candidate_replicas},
                                getattr(pending_request.args[0], "avoid_replicas", ()), now,
                                self.cfg.silent_after_periods * self.cfg.stats_period_s))
            candidate_replicas = [r for r in candidate_replicas if r.replica_id.unique_id in keep]
            usable = self._sync(candidate_replicas, now)
            by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
            loads = [self._load(r, usable.get(rid)) for rid, r in by_id.items()]
            ranked = self.policy.rank(request, loads, now)
            ranks = [[by_id[rid]] for rid in ranked if rid in by_id]
            if ranks:
                # Book it now: concurrent routing tasks must see this decision before the replica's
                # accept round trip completes (router.bookings explains the herding it prevents).
                self.bookings.decided(request, ranks[0][0].replica_id.unique_id, now)
            return ranks or [candidate_replicas]
        except Exception:
            log.exception("routing policy failed; falling back to least-loaded")
            return [sorted(candidate_replicas, key=lambda r: self.bookings.ongoing(r.replica_id.unique_id))]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        request = self._route_request(pending_request)
        if request is None:
            return
        try:
            self.bookings.accepted(request, replica_id.unique_id, time.time())
        except Exception:
            log.exception("booking a routed request failed")

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        try:
            self.bookings.finished(internal_request_id, replica_id.unique_id, time.time())
        except Exception:
            log.exception("releasing a finished request failed")

    def _forget(self, rid: str) -> None:
        self._stats_ts.pop(rid, None)
        self._stats_version.pop(rid, None)
        self.bookings.forget_replica(rid)
        self.policy.on_replica_gone(rid)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._forget(replica_id.unique_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        old = {rid.unique_id for rid in self._replica_id_set}
        super().update_replicas(replicas)
        new = {rid.unique_id for rid in self._replica_id_set}
        for rid in old - new:
            self._forget(rid)
