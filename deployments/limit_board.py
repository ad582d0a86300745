"""Where tenant limits live: one named Ray actor per app, shared by every ingress replica.

Why a Ray actor: limits must hold across ingress replicas, so their state cannot live in one; a
Ray actor is already in every kvserve cluster (no Redis or other service to run, embedded or on
Kubernetes), it is found by name like the stats board, and a detached one outlives an ingress
restart, so a restart does not hand every tenant a fresh minute. Its methods are synchronous,
so the actor applies them one at a time: no locks. The cost of reaching it (one actor call,
~1 ms) is paid rarely: an ingress takes a lease with a request while the tenant is far from its
limits and spends it locally (deployments.ingress_limits); near a limit every request asks here,
so the decision there is exact. The math is router.tenant_limits, pure and tested on its own.
"""

from __future__ import annotations

import time

import ray

from router.tenant_limits import Decision, Limits, Need, TenantLimiter

BOARD_NAMESPACE = "kvserve"


class Limiters:
    """Every tenant's TenantLimiter (the actor's body; a plain class, so tests can drive it)."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantLimiter] = {}

    def _limiter(self, tenant: str, limits: Limits, now: float) -> TenantLimiter:
        lim = self._tenants.get(tenant)
        if lim is None:
            lim = self._tenants[tenant] = TenantLimiter(limits, now)
        elif lim.limits != limits:  # the config changed: new limits, same usage
            lim.update_limits(limits, now)
        return lim

    def acquire(self, tenant: str, limits: Limits, need: Need, give_back: Need) -> Decision:
        now = time.monotonic()  # this process's monotonic clock: a wall-clock jump unlocks nothing
        return self._limiter(tenant, limits, now).acquire(need, now, give_back)

    def refund(self, tenant: str, limits: Limits, amount: Need) -> None:
        now = time.monotonic()
        self._limiter(tenant, limits, now).refund(amount, now)

    def charge(self, tenant: str, limits: Limits, tokens: int) -> None:
        now = time.monotonic()
        self._limiter(tenant, limits, now).charge(tokens, now)


LimitBoard = ray.remote(num_cpus=0)(Limiters)


def limit_board(app_name: str):
    return LimitBoard.options(
        name=f"limits-{app_name}", namespace=BOARD_NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()
