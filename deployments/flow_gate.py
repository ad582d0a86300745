"""The ingress side of flow control: holds requests while every replica is busy, and lets them go
in the order the pure `flow.fair_queue.FairQueue` picks.

Slots: `flow.slots_per_replica` (default the engine's batch width) x the replicas Serve runs. A
request takes a slot at once when one is free and nobody is queued; otherwise it waits in the fair
queue until a finishing request hands its slot on (work-conserving: a slot never stays free while
someone waits). Its cost is charged on the work it gives the cluster: prompt tokens no replica has
cached (the router's own prefix index, `router.index.PrefixIndex`, fed the replicas' block
snapshots from the stats board) + expected decode tokens (`flow.cost`). A full queue, a request
pushed out of it, or a wait past `server.max_queue_wait_s` is a 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.errors import APIError
from deployments.tenant_classes import tenant_classes
from flow.cost import DecodeEstimate, request_cost
from flow.fair_queue import FairQueue, QueueFull, Ticket
from kvserve.config import KVServeConfig
from router.cost import uncached_tokens
from router.index import PrefixIndex

log = logging.getLogger("kvserve.flow")

ReplicaCount = Callable[[], Awaitable[int]]
Snapshots = Callable[[], Awaitable[list[dict]]]


class Overloaded(APIError):
    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, message, code="service_unavailable")
        self.retry_after_s = retry_after_s

    def response(self):  # type: ignore[override]
        from deployments.errors import error_response

        return error_response(503, self.message, code=self.code, headers={"Retry-After": str(self.retry_after_s)})


class Slot:
    """A request's place in the cluster; `release` once it is answered (idempotent)."""

    def __init__(self, gate: FlowGate, tenant: str, waited_s: float) -> None:
        self.gate, self.tenant, self.waited_s, self.t0, self._done = gate, tenant, waited_s, time.monotonic(), False

    def release(self, completion_tokens: int | None = None) -> None:
        if not self._done:
            self._done = True
            self.gate._release(self, completion_tokens)


class FlowGate:
    def __init__(self, cfg: KVServeConfig, replica_count: ReplicaCount, snapshots: Snapshots) -> None:
        self.cfg = cfg
        self.per_replica = cfg.flow.slots_per_replica or cfg.engine.max_num_seqs
        self.queue = FairQueue(cfg.flow.params())
        self.classes = cfg.tenants.classes
        self.tenant_class = tenant_classes(cfg.tenants)
        self.batch_priority = min(c.priority for c in self.classes.values()) - 1  # below every class
        self.replicas = max(cfg.num_replicas if not cfg.autoscaling.enabled else cfg.autoscaling.min_replicas, 1)
        self.held: dict[int, Slot] = {}  # slots taken and not yet released
        # A stream whose client left before it started never reports its end: its slot lapses then.
        self.max_hold_s = cfg.server.request_timeout_s
        self.decode = DecodeEstimate()
        self.index = PrefixIndex(stale_after_s=60.0)
        self.block_size = cfg.engine.block_size
        self.service_s = 1.0  # moving average of a slot's hold time, for Retry-After
        self._replica_count, self._snapshots = replica_count, snapshots
        self._task: asyncio.Task | None = None

    @property
    def inflight(self) -> int:
        return len(self.held)

    def _take(self, tenant: str, waited_s: float) -> Slot:
        slot = Slot(self, tenant, waited_s)
        self.held[id(slot)] = slot
        return slot

    def _prune(self) -> None:
        old = time.monotonic() - self.max_hold_s
        for slot in [s for s in self.held.values() if s.t0 < old]:
            slot.release()

    @property
    def slots(self) -> int:
        return self.replicas * self.per_replica

    def start(self, period_s: float = 2.0) -> None:
        self._task = asyncio.get_running_loop().create_task(self._refresh_every(period_s))

    async def _refresh_every(self, period_s: float) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:
                log.exception("flow control: refreshing replicas and cache state failed")
            await asyncio.sleep(period_s)

    async def refresh(self) -> None:
        """Serving replicas (slots) and their cached blocks (what a request would not pay for)."""
        self.replicas = max(await self._replica_count(), 1)  # none serving: Serve's own queue holds them
        now = time.monotonic()
        for s in await self._snapshots():
            if s.get("replica_id") and "blocks" in s:
                self.index.on_cache_snapshot(s["replica_id"], s.get("blocks") or (), now)
        self._hand_on()

    # -- requests ---------------------------------------------------------------------------

    def cost(self, work: Any) -> float:
        matched = max(self.index.match(work.block_hashes, time.monotonic()).values(), default=0)
        uncached = uncached_tokens(work.num_prompt_tokens, matched, self.block_size)
        expected = self.decode.expected(work.tenant, work.expected_output_tokens or None)
        return request_cost(uncached, expected)

    def _class_of(self, tenant: str) -> tuple[int, float]:
        c = self.classes.get(self.tenant_class.get(tenant, "default")) or self.classes["default"]
        return c.priority, c.weight

    def retry_after_s(self) -> int:
        return max(1, math.ceil(len(self.queue) * self.service_s / max(self.slots, 1)))

    async def acquire(self, work: Any, interactive: bool, deadline: float | None) -> Slot:
        """Wait for a slot (monotonic `deadline`, None: no bound); raises Overloaded (503)."""
        start = time.monotonic()
        self._prune()
        priority, weight = self._class_of(work.tenant) if interactive else (self.batch_priority, 1.0)
        cost = self.cost(work)
        if self.inflight < self.slots and not self.queue:
            self.queue.charge(work.tenant, cost, priority=priority, weight=weight)
            return self._take(work.tenant, 0.0)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            ticket, evicted = self.queue.push(work.tenant, cost, start, priority=priority,
                                              weight=weight, item=fut)
        except QueueFull as e:
            raise Overloaded(f"server overloaded: {e.reason}; retry later", self.retry_after_s()) from None
        if evicted is not None and not evicted.item.done():
            evicted.item.set_exception(Overloaded(
                "server overloaded: this tenant has the most requests queued and the queue is full; retry later",
                self.retry_after_s()))
        self._hand_on()
        try:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            await asyncio.wait_for(asyncio.shield(fut), left)
        except asyncio.TimeoutError:
            if self.queue.remove(ticket):
                raise Overloaded(f"server overloaded: no replica had room within "
                                 f"{self.cfg.server.max_queue_wait_s:g} s; retry later", self.retry_after_s()) from None
            if fut.exception() is not None:  # pushed out just as the wait ended
                raise fut.exception() from None
            # granted a slot just as the wait ended: keep it
        except asyncio.CancelledError:  # the client left while waiting
            if not self.queue.remove(ticket) and fut.done() and fut.exception() is None:
                fut.result().release()  # its slot goes to the next in line
            raise
        slot = fut.result()
        slot.waited_s = time.monotonic() - start
        return slot

    def _release(self, slot: Slot, completion_tokens: int | None) -> None:
        self.held.pop(id(slot), None)
        self.service_s += 0.05 * ((time.monotonic() - slot.t0) - self.service_s)
        if completion_tokens is not None:
            self.decode.observe(slot.tenant, completion_tokens)
        self._hand_on()

    def _hand_on(self) -> None:
        while self.inflight < self.slots:
            t = self.queue.pop()
            if t is None:
                return
            if t.item.done():  # already failed (pushed out)
                continue
            t.item.set_result(self._take(t.tenant, 0.0))


def flow_gate_for(cfg: KVServeConfig, stats_board: Callable[[], Any]) -> FlowGate | None:
    """The ingress's gate (started), or None when flow control is off."""
    if not cfg.flow.enabled:
        return None
    from deployments import serve_state

    async def running() -> int:
        return (await serve_state.deployment_state(cfg.app_name)).running_replicas

    async def snapshots() -> list[dict]:
        return await stats_board().get.remote(max_age_s=max(3.0, 4 * cfg.router.stats_period_s))

    gate = FlowGate(cfg, running, snapshots)
    gate.start()
    return gate
