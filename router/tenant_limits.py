"""Per-tenant limits: requests/min, tokens/min (token buckets) and requests in flight.

Pure: times are whatever monotonic clock the caller passes (seconds); nothing here reads a clock,
so a wall-clock jump cannot refill a bucket, and a `now` that goes backwards refills nothing.

Tokens are counted as OpenAI does: a request reserves `prompt + max_tokens` when it is admitted
and settles with its real usage when it ends (`refund` what it did not use, `charge` any excess).
A request asking more than a whole minute's tokens is admitted only into a full bucket and leaves
it in debt: the limit holds on average instead of refusing that request for ever.

`acquire` can hand out a *lease* beside what the request needs: a batch of requests, tokens and
slots the caller spends locally without asking again. Leases are cut only from the top half of
each bucket, so near a limit every request is decided here, exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

LEASE_SHARE = 0.1  # a lease takes at most this share of a limit ...
LEASE_KEEP = 0.5  # ... and only from what is above this share of it
EPSILON = 1e-6


@dataclass(frozen=True)
class Limits:
    """None: no limit on that resource."""

    requests_per_min: int | None = None
    tokens_per_min: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_min", "tokens_per_min", "max_concurrent"):
            val = getattr(self, name)
            if val is not None and val <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {val}")

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.requests_per_min, self.tokens_per_min, self.max_concurrent))


@dataclass(frozen=True)
class Need:
    """Amounts of each resource: what a request takes, or what a lease holds."""

    requests: int = 0
    tokens: int = 0
    slots: int = 0

    def __add__(self, other: Need) -> Need:
        return Need(self.requests + other.requests, self.tokens + other.tokens, self.slots + other.slots)

    def __sub__(self, other: Need) -> Need:
        return Need(self.requests - other.requests, self.tokens - other.tokens, self.slots - other.slots)

    def covers(self, other: Need) -> bool:
        return self.requests >= other.requests and self.tokens >= other.tokens and self.slots >= other.slots


@dataclass
class TokenBucket:
    """`capacity` a minute, refilled continuously; `level` may go below 0 (debt)."""

    capacity: float
    level: float
    at: float  # the time `level` is as of

    @classmethod
    def full(cls, capacity: float, now: float) -> TokenBucket:
        return cls(capacity, capacity, now)

    @property
    def per_s(self) -> float:
        return self.capacity / 60.0

    def refill(self, now: float) -> None:
        if now > self.at:  # never backwards: a clock that goes back does not refill (nor rewind `at`)
            self.level = min(self.capacity, self.level + (now - self.at) * self.per_s)
            self.at = now

    def wait_s(self, amount: float) -> float:
        """Seconds until `level` reaches `amount` (capped at capacity: a full bucket always admits)."""
        short = min(amount, self.capacity) - self.level
        return short / self.per_s if short > EPSILON else 0.0  # float dust is not a wait

    def reset_s(self) -> float:
        """Seconds until the bucket is full again (OpenAI's `x-ratelimit-reset-*`)."""
        return max(self.capacity - self.level, 0.0) / self.per_s

    def resize(self, capacity: float) -> None:
        """A new limit keeps the share already used."""
        if capacity != self.capacity:
            self.level = self.level * capacity / self.capacity
            self.capacity = capacity


@dataclass(frozen=True)
class Snapshot:
    """What OpenAI's `x-ratelimit-*` headers say; None where that resource has no limit."""

    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_s: float | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_s: float | None = None


@dataclass(frozen=True)
class Decision:
    admitted: bool
    snapshot: Snapshot
    retry_after_s: float = 0.0  # exact wait when refused (0 when admitted)
    reason: str = ""  # which limit refused: "requests", "tokens" or "concurrency"
    lease: Need = Need()  # granted beyond the request's own need (admitted only)


def retry_after_header(seconds: float) -> int:
    """Whole seconds for `Retry-After`: never under the real wait (less than 1 s over it), never 0."""
    return max(1, math.ceil(seconds - 1e-9))


def go_duration(seconds: float) -> str:
    """OpenAI's reset format (Go's time.Duration): `20ms`, `1.5s`, `6m0s`."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{math.ceil(seconds * 1000) / 1000:g}s"
    whole = math.ceil(seconds)
    return f"{whole // 60}m{whole % 60}s"


def _lease_amount(bucket: TokenBucket | None, free: float | None, capacity: float | None) -> int:
    if capacity is None:
        return 0
    avail = free if bucket is None else bucket.level
    return max(0, int(min(capacity * LEASE_SHARE, (avail or 0.0) - capacity * LEASE_KEEP)))


@dataclass
class TenantLimiter:
    """One tenant's limits and usage (lives where the limits are shared: deployments.limit_board)."""

    limits: Limits
    now: float
    requests: TokenBucket | None = field(init=False)
    tokens: TokenBucket | None = field(init=False)
    in_flight: int = 0  # slots held: by requests running, or by leases

    def __post_init__(self) -> None:
        rpm, tpm = self.limits.requests_per_min, self.limits.tokens_per_min
        self.requests = TokenBucket.full(rpm, self.now) if rpm else None
        self.tokens = TokenBucket.full(tpm, self.now) if tpm else None

    def update_limits(self, limits: Limits, now: float) -> None:
        self._refill(now)
        for name, cap in (("requests", limits.requests_per_min), ("tokens", limits.tokens_per_min)):
            bucket = getattr(self, name)
            if cap is None:
                setattr(self, name, None)
            elif bucket is None:
                setattr(self, name, TokenBucket.full(cap, now))
            else:
                bucket.resize(cap)
        self.limits = limits

    def _refill(self, now: float) -> None:
        for b in (self.requests, self.tokens):
            if b is not None:
                b.refill(now)

    def snapshot(self, now: float) -> Snapshot:
        self._refill(now)
        r, t = self.requests, self.tokens
        return Snapshot(
            limit_requests=self.limits.requests_per_min,
            remaining_requests=None if r is None else max(0, math.floor(r.level)),
            reset_requests_s=None if r is None else r.reset_s(),
            limit_tokens=self.limits.tokens_per_min,
            remaining_tokens=None if t is None else max(0, math.floor(t.level)),
            reset_tokens_s=None if t is None else t.reset_s(),
        )

    def acquire(self, need: Need, now: float, give_back: Need = Need(), lease: bool = True) -> Decision:
        """Admit `need` (all of it or nothing), after taking back `give_back` (an unused lease).
        Refused: `retry_after_s` is the exact wait for the limits that refused, if nothing else
        happens meanwhile (for concurrency, which ends when a request ends, 1 s)."""
        self.refund(give_back, now)
        waits = {}
        if self.requests is not None and need.requests:
            waits["requests"] = self.requests.wait_s(need.requests)
        if self.tokens is not None and need.tokens:
            waits["tokens"] = self.tokens.wait_s(need.tokens)
        cap = self.limits.max_concurrent
        if cap is not None and need.slots and self.in_flight + need.slots > cap:
            waits["concurrency"] = 1.0
        refused = {k: w for k, w in waits.items() if w > 0}
        if refused:
            reason = max(refused, key=refused.__getitem__)
            return Decision(False, self.snapshot(now), refused[reason], reason)
        self._take(need)
        extra = Need()
        if lease:  # from what is left after the request's own need
            extra = Need(_lease_amount(self.requests, None, self.limits.requests_per_min) if need.requests else 0,
                         _lease_amount(self.tokens, None, self.limits.tokens_per_min) if need.tokens else 0,
                         _lease_amount(None, (cap or 0) - self.in_flight, cap) if need.slots else 0)
            self._take(extra)
        return Decision(True, self.snapshot(now), lease=extra)

    def _take(self, amount: Need) -> None:
        if self.requests is not None:
            self.requests.level -= amount.requests
        if self.tokens is not None:
            self.tokens.level -= amount.tokens
        if self.limits.max_concurrent is not None:
            self.in_flight += amount.slots

    def refund(self, amount: Need, now: float) -> None:
        """Give back: a lease's unused part, a reservation's unused tokens, slots of requests that ended."""
        self._refill(now)
        for bucket, n in ((self.requests, amount.requests), (self.tokens, amount.tokens)):
            if bucket is not None and n:
                bucket.level = min(bucket.capacity, bucket.level + n)
        if self.limits.max_concurrent is not None:
            self.in_flight = max(0, self.in_flight - amount.slots)

    def charge(self, tokens: int, now: float) -> None:
        """A request used more tokens than it reserved: the bucket goes into debt for them."""
        self._refill(now)
        if self.tokens is not None and tokens > 0:
            self.tokens.level -= tokens


def rate_limit_headers(snap: Snapshot) -> dict[str, str]:
    """OpenAI's `x-ratelimit-*` headers for the limits a tenant has (none for a resource without one)."""
    out: dict[str, str] = {}
    for what, limit, remaining, reset in (
            ("requests", snap.limit_requests, snap.remaining_requests, snap.reset_requests_s),
            ("tokens", snap.limit_tokens, snap.remaining_tokens, snap.reset_tokens_s)):
        if limit is not None and remaining is not None and reset is not None:
            out[f"x-ratelimit-limit-{what}"] = str(limit)
            out[f"x-ratelimit-remaining-{what}"] = str(remaining)
            out[f"x-ratelimit-reset-{what}"] = go_duration(reset)
    return out
