"""Per-tenant SLO tiers: the autoscaler plans for the tightest tier that has traffic.

Each class may set its own TTFT/ITL p90 target (None: the cluster's). The fleet is shared, so
it must be sized for the most demanding class that is sending requests now; a class with a
tight tier and no traffic must not keep replicas up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kvserve.policy_params import SLOTargets


@dataclass(frozen=True)
class Tier:
    ttft_p90_ms: float | None = None
    itl_p90_ms: float | None = None


def effective_targets(default: SLOTargets, tiers: Iterable[Tier]) -> SLOTargets:
    """The tightest of the cluster's targets and every given tier's, each target on its own."""
    ttft, itl = default.ttft_p90_ms, default.itl_p90_ms
    for t in tiers:
        if t.ttft_p90_ms is not None:
            ttft = min(ttft, t.ttft_p90_ms)
        if t.itl_p90_ms is not None:
            itl = min(itl, t.itl_p90_ms)
    return SLOTargets(ttft, itl)


class TierTraffic:
    """Which classes sent requests within the last `window_s` (pure: the caller passes `now`)."""

    def __init__(self, tiers: Mapping[str, Tier], window_s: float) -> None:
        self.tiers, self.window_s = dict(tiers), window_s
        self._last: dict[str, float] = {}

    def saw(self, cls: str, now: float) -> None:
        if cls in self.tiers:
            self._last[cls] = now

    def active(self, now: float) -> list[str]:
        return sorted(c for c, t in self._last.items() if now - t <= self.window_s)

    def targets(self, default: SLOTargets, now: float) -> SLOTargets:
        return effective_targets(default, (self.tiers[c] for c in self.active(now)))
