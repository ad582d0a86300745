"""The simulator's ingress flow control: the same `flow.fair_queue.FairQueue` the live ingress runs
(deployments.flow_gate), in place of Serve's FIFO wait at the router.

A replica takes at most `slots_per_replica` requests (live: the ingress's slots); the rest wait here.
A request's cost: prompt tokens no serving replica holds (the engines' caches, which the router's
index mirrors live) + its expected decode tokens (`flow.cost.DecodeEstimate`, learnt per tenant).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from flow.cost import DecodeEstimate, request_cost
from flow.fair_queue import FairQueue, FlowParams
from simulator.engine import SimRequest

CachedTokens = Callable[[SimRequest], int]  # the longest cached prefix of a request, in tokens, on any replica


@dataclass
class FlowSim:
    params: FlowParams = field(default_factory=FlowParams)
    slots_per_replica: int = 32
    classes: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # tenant -> (priority, weight)


class FlowPending:
    """Drop-in for the cluster's FIFO `pending` deque: push (may push another out), popleft, len, iter."""

    def __init__(self, setup: FlowSim, cached_tokens: CachedTokens) -> None:
        self.setup, self.cached_tokens = setup, cached_tokens
        self.queue = FairQueue(setup.params)
        self.decode = DecodeEstimate()

    def __len__(self) -> int:
        return len(self.queue)

    def __iter__(self) -> Iterator[SimRequest]:
        yield from self.queue.items()

    def _cost(self, req: SimRequest) -> tuple[float, int, float]:
        prio, weight = self.setup.classes.get(req.tenant, (0, 1.0))
        uncached = req.prompt_tokens - self.cached_tokens(req)
        return request_cost(uncached, self.decode.expected(req.tenant, req.output_tokens)), prio, weight

    def charge(self, req: SimRequest) -> None:
        """`req` goes straight to a replica (a slot was free): its tenant's share counts it."""
        cost, prio, weight = self._cost(req)
        self.queue.charge(req.tenant, cost, priority=prio, weight=weight)

    def push(self, req: SimRequest, now: float) -> SimRequest | None:
        """Queue `req`; returns a request pushed out to make room. Raises flow.fair_queue.QueueFull."""
        cost, prio, weight = self._cost(req)
        _, evicted = self.queue.push(req.tenant, cost, now, priority=prio, weight=weight, item=req)
        return evicted.item if evicted is not None else None

    def popleft(self) -> SimRequest:
        t = self.queue.pop()
        if t is None:
            raise IndexError("pop from an empty flow queue")
        return t.item

    def finished(self, req: SimRequest) -> None:
        self.decode.observe(req.tenant, req.generated or req.output_tokens)
