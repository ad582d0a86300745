"""Stage 4 of the kvserve policy: named guards on a scale-down. Each returns a `Hold` (with the
reason the decision logs) or None.

A floor guard raises the scale-down's target; a clock guard keeps the scale-down wish (its
delay keeps running) but stops it acting at this decision: it acts at the first later decision
without the hold, at once if its delay has passed by then.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hold:
    guard: str  # the guard's name (what the adapter logs when a hold starts)
    floor: int  # the scale-down goes no lower than this
    reason: str
    keeps_clock: bool = False  # True: hold the whole scale-down for now, the delay keeps running


def overload_memory(current: int, memory_floor: int) -> Hold | None:
    """No shrink back to a per-replica load that once broke the SLO."""
    if memory_floor <= 0:
        return None
    return Hold("overload_memory", min(memory_floor, current), f"overload memory: {memory_floor} replicas")


def engine_backlog(current: int, waiting: int, queued: float, backlog_n: int) -> Hold | None:
    """Queued requests are demand: keep the replicas that drain them within a look-back window
    (shrinking onto a backlogged replica would route new requests behind its queue)."""
    if waiting + queued <= 0:
        return None
    return Hold("engine_backlog", min(backlog_n, current), f"backlog of {waiting + queued:.0f}: {backlog_n} replicas")


def recent_rate(settled_n: int, recent_n: int, current: int) -> Hold | None:
    """The shrink is planned on the look-back rate (the recent rate's noise would keep restarting
    its delay) but does not act while the recent rate alone asks for more (a step's first seconds)."""
    if settled_n < recent_n and settled_n < current:
        return Hold("recent_rate", current, "held: the recent rate needs more", keeps_clock=True)
    return None


def slo_unproven(hold: bool, why: str) -> Hold | None:
    """An SLO error that is not evidence yet (feedback.slo_correction): no shrink acts until it is
    judged, but the wish keeps its delay (one over-target read must not restart it)."""
    if hold:
        return Hold("slo_feedback", 10**9, f"held: {why}", keeps_clock=True)
    return None


def routers_queue(queued: float) -> Hold | None:
    """Requests waiting at the routers mean every replica is full: no shrink acts."""
    if queued > 0:
        return Hold("routers_queue", 10**9, "held: requests wait at the routers", keeps_clock=True)
    return None
