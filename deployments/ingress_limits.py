"""The ingress side of tenant limits: admit or refuse (429) a request, settle it when it ends.

The shared state is the named LimitBoard actor (why: deployments.limit_board). Each ingress keeps,
per tenant, a small lease it spends without a round trip (router.limit_lease); when the lease
cannot cover a request, the request asks the board, handing the lease's rest back in the same
call, so near a limit the decision is the board's own. Expired leases go back every `ttl_s`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from deployments.errors import APIError, error_body
from deployments.tenant_classes import DEFAULT_CLASS
from kvserve.config import TenantClass
from router.limit_lease import LocalLease, Refusal
from router.tenant_limits import Decision, Limits, Need, rate_limit_headers, retry_after_header

log = logging.getLogger("kvserve.limits")

LEASE_TTL_S = 1.0
_UNITS = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)",
          "concurrency": "requests in flight"}


def class_limits(c: TenantClass) -> Limits:
    return Limits(c.requests_per_min, c.tokens_per_min, c.max_concurrent)


class RateLimited(APIError):
    """429 with Retry-After (whole seconds, >= 1), retry-after-ms and the x-ratelimit-* headers."""

    def __init__(self, tenant: str, limits: Limits, need: Need, d: Decision) -> None:
        limit = {"requests": limits.requests_per_min, "tokens": limits.tokens_per_min,
                 "concurrency": limits.max_concurrent}[d.reason]
        asked = need.tokens if d.reason == "tokens" else 1
        wait = retry_after_header(d.retry_after_s)
        super().__init__(429, f"Rate limit reached for tenant {tenant!r} on {_UNITS[d.reason]}: limit {limit}, "
                              f"requested {asked}. Please try again in {wait}s.", code="rate_limit_exceeded")
        self.headers = {**rate_limit_headers(d.snapshot), "Retry-After": str(wait),
                        "retry-after-ms": str(max(1000, math.ceil(d.retry_after_s * 1000)))}

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.status, self.message, code=self.code), status_code=429,
                            headers=self.headers)


@dataclass
class Admission:
    tenant: str
    limits: Limits
    need: Need
    headers: dict[str, str]


class IngressLimits:
    def __init__(self, classes: dict[str, TenantClass], tenant_class: dict[str, str], board: Callable[[], Any],
                 max_model_len: int, clock: Callable[[], float] = time.monotonic, ttl_s: float = LEASE_TTL_S) -> None:
        self._limits = {name: class_limits(c) for name, c in classes.items()}
        self._class_of = tenant_class
        self._make_board = board  # -> the LimitBoard handle (made on first use: no actor when no tenant has limits)
        self._handle: Any = None
        self._max_model_len = max_model_len
        self._clock = clock
        self._ttl_s = ttl_s
        self._leases: dict[str, LocalLease] = {}
        self._open: dict[str, Admission] = {}  # request id -> its admission, until it ends
        self._refused: dict[str, Refusal] = {}  # tenant -> the board's last refusal, while it lasts
        self._sweeper: asyncio.Task | None = None

    def limits_for(self, tenant: str) -> Limits | None:
        limits = self._limits.get(self._class_of.get(tenant, DEFAULT_CLASS))
        return limits if limits is not None and limits.any else None

    def need(self, prompt_tokens: int, max_output_tokens: int) -> Need:
        """What a request reserves, as OpenAI counts it: its prompt plus max_tokens (or, without one,
        the rest of the context)."""
        out = max_output_tokens or max(self._max_model_len - prompt_tokens, 0)
        return Need(requests=1, tokens=prompt_tokens + out, slots=1)

    async def admit(self, request_id: str, tenant: str, prompt_tokens: int,
                    max_output_tokens: int) -> Admission | None:
        """None: the tenant has no limits. Raises RateLimited (429) over a limit. An admitted
        request must be `finish`ed (the ingress does it where it counts every answer)."""
        limits = self.limits_for(tenant)
        if limits is None:
            return None
        need = self.need(prompt_tokens, max_output_tokens)
        now = self._clock()
        refusal = self._refused.get(tenant)
        if refusal is not None and refusal.applies(need, now):
            raise RateLimited(tenant, limits, need, refusal.decision(now))
        lease = self._leases.get(tenant)
        snap = lease.try_take(need, now) if lease else None
        if snap is None:
            give_back = lease.drain() if lease else Need()
            try:
                d: Decision = await self._board().acquire.remote(tenant, limits, need, give_back)
            except Exception:  # the board is gone: serve rather than refuse all; the next call makes a new one
                log.exception("tenant limits unavailable; admitting %s unchecked", tenant)
                self._handle = None
                return None
            if not d.admitted:
                if d.reason != "concurrency":
                    now = self._clock()
                    self._refused[tenant] = Refusal(d.reason, need, now + d.retry_after_s, d.snapshot, now)
                raise RateLimited(tenant, limits, need, d)
            now = self._clock()
            lease = self._leases.get(tenant)  # another request may have installed one meanwhile
            if lease is not None and lease.live(now):
                lease.merge(d.lease, d.snapshot, now)
            else:
                if lease is not None:
                    self._give_back(tenant, limits, lease.drain())
                lease = self._leases[tenant] = LocalLease(limits, d.lease, d.snapshot, now, self._ttl_s)
            snap = lease.snapshot(now)
            self._ensure_sweeper()
        adm = self._open[request_id] = Admission(tenant, limits, need, rate_limit_headers(snap))
        return adm

    def finish(self, request_id: str, status: int, usage: dict | None) -> None:
        """Settle: its slot comes back, and its tokens are settled with the real usage. Without usage
        a request that failed before an engine served it costs no tokens; otherwise it keeps its
        reservation (a stream cut short: what it used is unknown)."""
        adm = self._open.pop(request_id, None)
        if adm is None:  # not admitted here (no limits, or refused)
            return
        reserved = adm.need.tokens
        if usage:
            used = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        else:
            used = 0 if status >= 400 and status != 499 else reserved
        back = Need(slots=1, tokens=max(reserved - used, 0))
        if back.tokens and getattr(self._refused.get(adm.tenant), "reason", None) == "tokens":
            del self._refused[adm.tenant]  # tokens came back: the next request asks again
        lease = self._leases.get(adm.tenant)
        if lease is not None and lease.live(self._clock()):
            lease.give(back)
        else:
            self._give_back(adm.tenant, adm.limits, back)
        if used > reserved:
            self._board().charge.remote(adm.tenant, adm.limits, used - reserved)

    def _board(self) -> Any:
        if self._handle is None:  # a name lookup in Ray's GCS: once, not per request
            self._handle = self._make_board()
        return self._handle

    def _give_back(self, tenant: str, limits: Limits, amount: Need) -> None:
        if amount != Need():
            self._board().refund.remote(tenant, limits, amount)  # fire and forget

    def sweep(self) -> None:
        """Hand expired leases back, so what they hold is not lost to the other ingresses."""
        now = self._clock()
        for tenant, lease in list(self._leases.items()):
            if not lease.live(now):
                del self._leases[tenant]
                self._give_back(tenant, lease.limits, lease.drain())

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_every())

    async def _sweep_every(self) -> None:
        while self._leases:
            await asyncio.sleep(self._ttl_s)
            try:
                self.sweep()
            except Exception:
                log.exception("returning expired leases failed")
