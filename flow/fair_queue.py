"""Who goes next when every replica is busy: priority classes, then weighted fair queuing.

Pure (no clocks, no I/O): the ingress (deployments.flow_gate) and the simulator call the same object.

- **Fair share on real work.** A request's cost is the work it gives the cluster: its uncached
  prefill tokens + its expected decode tokens (`flow.cost`). Within a priority level, queued
  requests are served in order of virtual finish time, self-clocked fair queuing (Golestani 1994):
  start = max(V - burst / weight, the tenant's last finish), finish = start + cost / weight, V = the
  finish tag of the request last dispatched. A tenant that was idle or below its share may be served
  up to `burst_tokens` of work ahead of the backlogged ones (so a light tenant's bursts do not queue
  behind a flood), and banks no more credit than that. While two tenants i, j stay backlogged the
  work they are served, divided by their weights, differs by at most (max cost_i + burst) / w_i +
  (max cost_j + burst) / w_j (the bound `tests/unit/test_flow_fair_queue.py` checks).
- **Priority with bounded starvation.** The highest non-empty level goes first, except that a
  non-empty level passed over `starvation_limit` times in a row is served next (the most-passed
  first). So a waiting level is served at least once every `starvation_limit + levels - 1`
  dispatches: lower classes get a bounded share, never zero.
- **Bounded.** At most `max_per_tenant` queued per tenant and `max_total` in all. Past the total,
  the newest request of the tenant with the most queued is pushed out (longest-queue drop), so
  the flooding tenant, not its neighbours, gets the 503s.
- **Work-conserving.** `pop` returns a request whenever any is queued; the caller pops whenever a
  slot frees (the queue never holds work back from an idle replica).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kvserve.policy_params import FlowParams

__all__ = ["FairQueue", "FlowParams", "QueueFull", "Ticket"]


@dataclass(eq=False)
class Ticket:
    tenant: str
    priority: int
    weight: float
    cost: float
    arrival: float
    item: Any = None
    start: float = 0.0
    finish: float = 0.0
    seq: int = 0
    live: bool = True  # False once popped, removed or pushed out


class QueueFull(Exception):
    """The tenant's queue (or the whole queue, with nobody longer to push out) is full."""

    def __init__(self, tenant: str, reason: str) -> None:
        super().__init__(f"tenant {tenant!r}: {reason}")
        self.tenant, self.reason = tenant, reason


@dataclass
class _Level:
    heap: list[tuple[float, int, Ticket]] = field(default_factory=list)
    vtime: float = 0.0  # finish tag of the last request dispatched from this level
    last_finish: dict[str, float] = field(default_factory=dict)  # tenant -> finish tag of its newest request
    size: int = 0
    passed: int = 0  # dispatches that went to other levels while this one waited


class FairQueue:
    def __init__(self, params: FlowParams | None = None) -> None:
        self.p = params or FlowParams()
        self._levels: dict[int, _Level] = {}
        self._per_tenant: Counter[str] = Counter()
        self._newest: dict[str, list[Ticket]] = {}  # tenant -> its queued tickets, oldest first
        self._seq = itertools.count()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def queued(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    def items(self) -> list[Any]:
        """Every queued request's item, tenant by tenant (oldest first within a tenant)."""
        return [t.item for tickets in self._newest.values() for t in tickets]

    def push(self, tenant: str, cost: float, now: float, *, priority: int = 0, weight: float = 1.0,
             item: Any = None) -> tuple[Ticket, Ticket | None]:
        """Queue a request. Returns (its ticket, a ticket pushed out to make room or None).
        Raises QueueFull when it cannot be queued."""
        if weight <= 0:
            raise ValueError("weight must be > 0")
        if self._per_tenant[tenant] >= self.p.max_per_tenant:
            raise QueueFull(tenant, f"{self.p.max_per_tenant} requests already queued for this tenant")
        evicted = None
        if self.size >= self.p.max_total:
            longest, n = max(self._per_tenant.items(), key=lambda kv: (kv[1], kv[0]), default=(None, 0))
            # Push out only from a queue longer than this tenant's would be: no ping-pong between equals.
            if longest is None or longest == tenant or n <= self._per_tenant[tenant] + 1:
                raise QueueFull(tenant, f"{self.p.max_total} requests queued in all")
            evicted = self._newest[longest][-1]
            self.remove(evicted)
        lvl = self._levels.setdefault(priority, _Level())
        start = max(lvl.vtime - self.p.burst_tokens / weight, lvl.last_finish.get(tenant, -float("inf")))
        t = Ticket(tenant, priority, weight, max(cost, 0.0), now, item, start, start + max(cost, 0.0) / weight,
                   next(self._seq))
        lvl.last_finish[tenant] = t.finish
        heapq.heappush(lvl.heap, (t.finish, t.seq, t))
        lvl.size += 1
        self.size += 1
        self._per_tenant[tenant] += 1
        self._newest.setdefault(tenant, []).append(t)
        return t, evicted

    def charge(self, tenant: str, cost: float, *, priority: int = 0, weight: float = 1.0) -> None:
        """A request dispatched without queueing (a slot was free): its tenant's share counts it too,
        so a flood's first requests, which never waited, still put it behind the queue's newcomers."""
        lvl = self._levels.setdefault(priority, _Level())
        start = max(lvl.vtime - self.p.burst_tokens / weight, lvl.last_finish.get(tenant, -float("inf")))
        lvl.last_finish[tenant] = start + max(cost, 0.0) / weight
        lvl.vtime = max(lvl.vtime, lvl.last_finish[tenant])

    def remove(self, t: Ticket) -> bool:
        """Take a queued request out (its client left, it waited too long). False if not queued."""
        if not t.live:
            return False
        t.live = False
        self._forget(t)
        lvl = self._levels[t.priority]
        lvl.size -= 1
        if lvl.size == 0:
            lvl.passed = 0
        if lvl.last_finish.get(t.tenant) == t.finish:
            # Its newest request left unserved: the tenant is not charged for work it did not get.
            rest = [x for x in self._newest.get(t.tenant, ()) if x.priority == t.priority]
            if rest:
                lvl.last_finish[t.tenant] = rest[-1].finish
            else:
                lvl.last_finish.pop(t.tenant, None)
        return True

    def pop(self) -> Ticket | None:
        """The next request to dispatch; None only when nothing is queued."""
        waiting = [(p, lvl) for p, lvl in self._levels.items() if lvl.size > 0]
        if not waiting:
            return None
        starved = [(lvl.passed, p, lvl) for p, lvl in waiting if lvl.passed >= self.p.starvation_limit]
        if starved:
            _, prio, lvl = max(starved, key=lambda x: (x[0], x[1]))
        else:
            prio, lvl = max(waiting, key=lambda x: x[0])
        for p, other in waiting:
            other.passed = 0 if p == prio else other.passed + 1
        while True:
            _, _, t = heapq.heappop(lvl.heap)
            if t.live:
                break
        t.live = False
        lvl.size -= 1
        lvl.vtime = max(lvl.vtime, t.finish)  # SCFQ: the virtual time is the tag last put in service
        self._forget(t)
        if lvl.size == 0:
            lvl.passed = 0
            lvl.heap.clear()
        return t

    def _forget(self, t: Ticket) -> None:
        self.size -= 1
        self._per_tenant[t.tenant] -= 1
        if self._per_tenant[t.tenant] <= 0:
            del self._per_tenant[t.tenant]
        mine = self._newest.get(t.tenant)
        if mine is not None:
            mine.remove(t)
            if not mine:
                del self._newest[t.tenant]

    def starvation_bound(self) -> int:
        """Most dispatches a non-empty level can wait between two of its own."""
        return self.p.starvation_limit + max(len(self._levels), 1) - 1
