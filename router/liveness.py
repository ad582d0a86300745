"""Which replicas may take a new request: not one whose engine died, not one gone silent, and not
one this request already failed on. Pure (the Serve adapter feeds it each replica's routing stats).

Serve itself removes a replica only when its health check fails (`server.health_check_period_s`)
or a call to it fails; between the death and that, the router must stop choosing it on its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

ENGINE_DEAD, SILENT, FAILED_HERE = "engine_dead", "silent", "failed_here"


class DropLog:
    """When this process's router first dropped each replica, and why: /kvserve/stats shows it,
    so a fault test can time the drop. Bounded: oldest entries go first."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self.first: dict[str, dict] = {}

    def note(self, replica_id: str, reason: str, now: float) -> None:
        if reason == FAILED_HERE or replica_id in self.first:
            return  # a per-request avoid is not a verdict on the replica
        self.first[replica_id] = {"at": now, "reason": reason}
        while len(self.first) > self.max_entries:
            self.first.pop(next(iter(self.first)))


DROPS = DropLog()  # one router per ingress process


def exclusions(stats: Mapping[str, Mapping | None], avoid: Collection[str], now: float,
               silent_after_s: float) -> dict[str, str]:
    """replica id -> why it gets no new request now. A replica that never reported is starting, not silent."""
    out: dict[str, str] = {}
    for rid, st in stats.items():
        st = st or {}
        if rid in avoid:
            out[rid] = FAILED_HERE
        elif st.get("engine_dead"):
            out[rid] = ENGINE_DEAD
        elif st.get("ts") is not None and now - float(st["ts"]) > silent_after_s:
            out[rid] = SILENT
    return out


def live_ids(stats: Mapping[str, Mapping | None], avoid: Collection[str], now: float, silent_after_s: float,
             log: DropLog | None = DROPS) -> list[str]:
    """The replicas to rank, in the given order. Silence is the weaker verdict (a live replica on a
    saturated host reports late too): when only silent ones are left, they are kept; when every
    replica is dead or failed this request, all are (Serve's queueing and the retries decide)."""
    out = exclusions(stats, avoid, now, silent_after_s)
    if log is not None:
        for rid, reason in out.items():
            log.note(rid, reason, now)
    keep = [rid for rid in stats if rid not in out]
    return keep or [rid for rid in stats if out.get(rid) == SILENT] or list(stats)
