"""Charge a request to a replica the moment the policy picks it, not when the replica says yes.

Ray Serve's router runs several routing tasks at once and only reports a
placement (`on_request_routed`) after a round trip to the replica that accepts
it. Decisions taken inside that window cannot see each other: four requests
arriving together all see idle replicas and, with random tie-breaking, land on
the same one one time in eight; a burst of one tenant's cold prefix herds the
same way. So the adapter books each request on the replica the policy ranked
first as soon as it ranks, and moves the booking if the request lands elsewhere
(first choice full, rejected, retried).

Pure Python: the Serve adapter calls it, the unit tests drive it directly.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.base import RouteRequest, RoutingPolicy


@dataclass
class _Booking:
    request: RouteRequest
    replica_id: str
    at: float
    confirmed: bool


class Bookings:
    def __init__(self, policy: RoutingPolicy, unconfirmed_ttl_s: float = 30.0) -> None:
        self.policy = policy
        # An unconfirmed booking is re-made at every routing attempt; one this old belongs to a
        # request cancelled while it waited for a replica.
        self.unconfirmed_ttl_s = unconfirmed_ttl_s
        self._by_id: dict[str, _Booking] = {}
        self._ongoing: dict[str, int] = {}
        self._last_sweep = 0.0

    def ongoing(self, replica_id: str) -> int:
        """Requests booked on `replica_id` (decided or accepted, not yet finished)."""
        return self._ongoing.get(replica_id, 0)

    def __len__(self) -> int:
        return len(self._by_id)

    def decided(self, request: RouteRequest, replica_id: str, now: float) -> None:
        """The policy ranked `replica_id` first for `request` (a retry replaces the earlier booking)."""
        self._release(request.request_id, now)
        self._add(request, replica_id, now, confirmed=False)
        self._sweep(now)

    def accepted(self, request: RouteRequest, replica_id: str, now: float) -> None:
        """The replica accepted the request: confirm the booking, or move it there."""
        booking = self._by_id.get(request.request_id)
        if booking is not None and booking.replica_id == replica_id:
            booking.confirmed = True
            return
        self._release(request.request_id, now)
        self._add(request, replica_id, now, confirmed=True)

    def finished(self, request_id: str, replica_id: str, now: float) -> bool:
        """An attempt on `replica_id` ended; releases the booking if it is there. True if released."""
        booking = self._by_id.get(request_id)
        if booking is None or booking.replica_id != replica_id:
            return False  # e.g. a rejected attempt whose retry is already booked elsewhere
        self._release(request_id, now)
        return True

    def forget_replica(self, replica_id: str) -> None:
        """The replica is gone: drop its bookings without telling the policy (it forgets it too)."""
        for rid in [k for k, b in self._by_id.items() if b.replica_id == replica_id]:
            del self._by_id[rid]
        self._ongoing.pop(replica_id, None)

    # -- internals -----------------------------------------------------------------------------

    def _add(self, request: RouteRequest, replica_id: str, now: float, confirmed: bool) -> None:
        self._by_id[request.request_id] = _Booking(request, replica_id, now, confirmed)
        self._ongoing[replica_id] = self._ongoing.get(replica_id, 0) + 1
        self.policy.on_routed(request, replica_id, now)

    def _release(self, request_id: str, now: float) -> None:
        booking = self._by_id.pop(request_id, None)
        if booking is None:
            return
        rid = booking.replica_id
        self._ongoing[rid] = max(self._ongoing.get(rid, 1) - 1, 0)
        self.policy.on_finished(booking.request, rid, now)

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < self.unconfirmed_ttl_s / 4:
            return
        self._last_sweep = now
        stale = [k for k, b in self._by_id.items() if not b.confirmed and now - b.at > self.unconfirmed_ttl_s]
        for k in stale:
            self._release(k, now)
