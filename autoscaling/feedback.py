"""Stage 3 of the kvserve policy: SLO feedback, which corrects what the capacity model misses.

r = the fleet's SLO ratio (`signals.fleet_slo_ratio`: p90 / target, the worse of TTFT and ITL).
r <= 1 adds nothing (the model sizes the fleet). r > 1 adds replicas -- ceil(current x min(r, cap)),
at least one more -- only when it is evidence: enough requests in the window (or some queued),
nothing starting, the fleet settled since its last scale-up (a backlog queued on old replicas
does not move to new ones, and stays in the window for `look_back_s`), and the p90s' lower
confidence bounds over the target too. Otherwise it holds: no scale-down acts while it lasts,
but a scale-down wish's delay keeps running (a hold that restarted it would keep a burst's
replicas a whole delay past the moment its backlog leaves the latency window).
The cap is `max_slo_factor`, or `max_slo_factor_within_capacity` when the model says the fleet
carries the load (r then measures what the model does not see, such as long prompts queued on a
few replicas, not a rate).

`OverloadMemory` remembers the modelled load per replica that broke the SLO and forbids a
scale-down back to it (the 1 -> 2 -> 1 flap when latency is steep in load, or the profile
optimistic). It expires after `overload_memory_s`; re-learnt soon after an expiry, its lifetime
doubles (up to `overload_memory_max_s`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvserve.policy_params import AutoscalerParams


@dataclass(frozen=True)
class Correction:
    replicas: int  # replicas the SLO error asks for: 0 none, else more than `current`
    why: str
    # An error that is not evidence yet: no scale-down acts now (guards.slo_unproven), but the
    # scale-down wish keeps its delay running, to act once the error is evidence or gone.
    hold: bool = False


def slo_correction(cfg: AutoscalerParams, r: float | None, r_low: float | None, current: int, running: int,
                   samples: float, queued: bool, settled: bool, model_n: int, idle: bool) -> Correction:
    """`samples`: requests in the look-back window; `model_n`: the capacity model's replicas."""
    if r is None:
        return Correction(0, "idle") if idle else Correction(0, "no latency samples yet: hold", hold=True)
    if r <= 1:
        return Correction(0, f"slo r={r:.2f} <= 1")
    if samples < cfg.min_p90_samples and not queued:
        # A p90 over a handful of requests is their maximum: one cold prompt, which more replicas
        # would not make faster (nothing is queued).
        return Correction(0, f"slo r={r:.2f} from fewer than {cfg.min_p90_samples} requests, none queued: hold", hold=True)
    if running < current:
        return Correction(0, f"slo r={r:.2f} but scale-up in progress", hold=True)
    if r_low is not None and r_low <= 1:
        return Correction(0, f"slo r={r:.2f} (lower bound {r_low:.2f}, not significant): hold", hold=True)
    if not settled:
        return Correction(0, f"slo r={r:.2f}: fleet not settled since its last scale-up", hold=True)
    why, factor = f"slo r={r:.2f} > 1", cfg.max_slo_factor
    if current > 0 and model_n <= current:
        factor = cfg.max_slo_factor_within_capacity
        if r > factor:
            why += f" (capacity model: {model_n} suffice; x{factor:g} at most)"
    return Correction(max(current + 1, math.ceil(max(current, 1) * min(r, factor) - 1e-9)), why)


class OverloadMemory:
    def __init__(self, cfg: AutoscalerParams) -> None:
        self.cfg = cfg
        self.per_replica: float | None = None  # modelled busy s/s per replica that broke the SLO
        self.until: float | None = None
        self.ttl_s = cfg.overload_memory_s
        self.expired_at: float | None = None

    def floor(self, busy: float) -> int:
        """Fewest replicas that keep each one below the remembered overload (0: no memory)."""
        if not self.per_replica or busy <= 0:
            return 0
        return math.floor(min(busy / self.per_replica, 1e6) * (1 + 1e-9)) + 1

    def learn(self, busy_per_replica: float, now: float) -> None:
        if self.expired_at is not None and now - self.expired_at < self.ttl_s:
            self.ttl_s = min(2.0 * self.ttl_s, self.cfg.overload_memory_max_s)  # the expiry was premature
        self.per_replica, self.until = busy_per_replica, now + self.ttl_s

    def raise_to(self, busy_per_replica: float) -> None:
        """A comfortable fleet at a higher load than remembered proves the memory stale."""
        if self.per_replica:
            self.per_replica = max(self.per_replica, busy_per_replica)

    def expire(self, now: float) -> None:
        if self.per_replica is not None and self.until is not None and now >= self.until:
            self.per_replica, self.until, self.expired_at = None, None, now

    def get_state(self) -> dict[str, Any]:
        return {"overload_per_replica": self.per_replica, "memory_until": self.until,
                "memory_ttl_s": self.ttl_s, "memory_expired_at": self.expired_at}

    def set_state(self, st: dict[str, Any]) -> None:
        opt = lambda v: None if v is None else float(v)  # noqa: E731
        self.per_replica, self.until = opt(st.get("overload_per_replica")), opt(st.get("memory_until"))
        self.expired_at = opt(st.get("memory_expired_at"))
        self.ttl_s = float(st.get("memory_ttl_s", self.cfg.overload_memory_s))
