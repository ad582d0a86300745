"""Scale to zero: requests that arrive while no replica serves are held for the first one to start.

Ray Serve does the holding and the scaling: a handle call to a deployment with no running replica
waits in the handle's router queue (bounded by `server.max_queued_requests`: beyond it, 503), and
the router pushes its queue length to the controller at once, whose cold-start path sets the
target to one replica without any delay (`ray.serve.autoscaling_policy`,
`_get_cold_start_scale_up_replicas`). What the ingress adds: such a request may wait
`server.cold_start_wait_s` (an engine start takes a minute or more), not the overload bound
`server.max_queue_wait_s`, and the time it waited for its first token is exported.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Gauge, Histogram

from kvserve.config import KVServeConfig


class ColdStart:
    def __init__(self, cfg: KVServeConfig, running_replicas: Callable[[], Awaitable[int]],
                 registry: CollectorRegistry, max_age_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        a = cfg.autoscaling
        self.enabled = a.enabled and a.min_replicas == 0  # otherwise a replica always serves
        self.server = cfg.server
        self._running = running_replicas
        self._clock = clock
        self._max_age_s = max_age_s
        self._known: tuple[float, bool] | None = None  # (when, no replica serving)
        self.held = Gauge("kvserve_cold_start_held_requests", "Requests that arrived while no engine replica "
                          "served, waiting for the first to start.", registry=registry)
        self.ttft = Histogram("kvserve_cold_start_ttft_seconds", "Time to first token of requests that arrived "
                              "while no engine replica served (scale from zero), from their arrival.",
                              registry=registry, buckets=(1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600))
        self.last = Gauge("kvserve_cold_start_last_ttft_seconds", "The latest such request's time to first token.",
                          registry=registry)

    async def no_replica_serving(self) -> bool:
        """Whether a request arriving now waits for a cold start (asks the controller at most once per
        `max_age_s`; a failed ask counts as warm: the request keeps the ordinary bound)."""
        if not self.enabled:
            return False
        now = self._clock()
        if self._known is None or now - self._known[0] >= self._max_age_s:
            try:
                cold = await self._running() == 0
            except Exception:
                cold = False
            self._known = (now, cold)
        return self._known[1]

    def wait_s(self, cold: bool) -> float | None:
        """How long the request may wait for a replica to take it, from its arrival."""
        s = self.server
        if not cold:
            return s.max_queue_wait_s
        if s.max_queue_wait_s is None or s.cold_start_wait_s is None:
            return None
        return max(s.cold_start_wait_s, s.max_queue_wait_s)

    def first_token(self, start: float) -> None:
        """A held request got its first output (`start`: its arrival, on the same clock)."""
        seconds = self._clock() - start
        self.ttft.observe(seconds)
        self.last.set(seconds)
