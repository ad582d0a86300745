"""An ingress's local share of a tenant's limits (a lease cut by router.tenant_limits.TenantLimiter).

Requests spend the lease without a round trip to the shared limiter; what a lease still holds when
it expires goes back. Headers from a lease read the shared state as of the grant, plus what this
lease still holds, plus the refill since: exact with one ingress, close with several (the others'
leases are at most a tenth of a limit each, and only while the tenant is far from it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from router.tenant_limits import Decision, Limits, Need, Snapshot


def limited(limits: Limits, need: Need) -> Need:
    """`need` on the resources that have a limit (the rest is never counted)."""
    return Need(need.requests if limits.requests_per_min else 0, need.tokens if limits.tokens_per_min else 0,
                need.slots if limits.max_concurrent else 0)


def _remaining(limit: int | None, base: int | None, held: int, refilled_s: float) -> tuple[int | None, float | None]:
    if limit is None or base is None:
        return None, None
    level = min(float(limit), base + held + refilled_s * limit / 60.0)
    return max(0, math.floor(level)), max(limit - level, 0.0) * 60.0 / limit


@dataclass
class LocalLease:
    limits: Limits
    held: Need
    base: Snapshot  # the shared limiter's state right after it cut this lease
    granted_at: float
    ttl_s: float

    def live(self, now: float) -> bool:
        return 0 <= now - self.granted_at < self.ttl_s

    def try_take(self, need: Need, now: float) -> Snapshot | None:
        """Spend `need` from the lease; None when it is expired or does not hold enough."""
        need = limited(self.limits, need)
        if not self.live(now) or not self.held.covers(need):
            return None
        self.held = self.held - need
        return self.snapshot(now)

    def give(self, amount: Need) -> None:
        """Slots of requests that ended and tokens a request reserved but did not use come back here."""
        self.held = self.held + limited(self.limits, amount)

    def merge(self, extra: Need, base: Snapshot, now: float) -> None:
        """A newer grant: its snapshot already excludes what this lease holds."""
        self.held, self.base, self.granted_at = self.held + extra, base, now

    def drain(self) -> Need:
        """Empty the lease (to give it back)."""
        out, self.held = self.held, Need()
        return out

    def snapshot(self, now: float) -> Snapshot:
        since = max(now - self.granted_at, 0.0)
        req, req_reset = _remaining(self.limits.requests_per_min, self.base.remaining_requests, self.held.requests,
                                    since)
        tok, tok_reset = _remaining(self.limits.tokens_per_min, self.base.remaining_tokens, self.held.tokens, since)
        return Snapshot(self.limits.requests_per_min, req, req_reset, self.limits.tokens_per_min, tok, tok_reset)


@dataclass(frozen=True)
class Refusal:
    """The shared limiter refused a tenant for `reason` until `until`: the ingress refuses the same
    requests itself until then, so a tenant flooding past its limit costs no round trip per request.
    Concurrency refusals are not kept: a slot comes back whenever a request ends."""

    reason: str
    need: Need
    until: float
    snapshot: Snapshot
    at: float

    def applies(self, need: Need, now: float) -> bool:
        if not self.at <= now < self.until:
            return False
        return self.reason == "requests" or (self.reason == "tokens" and need.tokens >= self.need.tokens)

    def decision(self, now: float) -> Decision:
        """The refusal as of `now`: the same limits, less time to wait."""
        gone = now - self.at
        s = self.snapshot
        snap = replace(s, reset_requests_s=None if s.reset_requests_s is None else max(s.reset_requests_s - gone, 0.0),
                       reset_tokens_s=None if s.reset_tokens_s is None else max(s.reset_tokens_s - gone, 0.0))
        return Decision(False, snap, self.until - now, self.reason)
