"""Upscale/downscale delays shared by the policies.

Same rule as Ray Serve's `_apply_delay_logic`: a wish to scale in one
direction must persist, uninterrupted, for that direction's delay before it
is acted on; a wish in the other direction (or none) restarts the clock.
So two consecutive changes are always at least the relevant delay apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DelayGate:
    upscale_delay_s: float
    downscale_delay_s: float
    direction: int = 0  # +1 wanting up, -1 wanting down, 0 content
    since: float | None = None  # when the current wish started

    def apply(self, desired: int, current: int, now: float, hold_down: bool = False) -> int:
        """`hold_down`: a scale-down wish keeps its clock but must not act at this decision
        (it acts at the first later one without the hold, if its delay has passed by then)."""
        want = (desired > current) - (desired < current)
        if want == 0:
            self.direction, self.since = 0, None
            return current
        if want != self.direction or self.since is None:
            self.direction, self.since = want, now
        delay = self.upscale_delay_s if want > 0 else self.downscale_delay_s
        if now - self.since + 1e-9 >= delay and not (want < 0 and hold_down):
            self.direction, self.since = 0, None
            return desired
        return current

    def get_state(self) -> dict[str, Any]:
        return {"direction": self.direction, "since": self.since}

    def set_state(self, state: dict[str, Any]) -> None:
        self.direction = int(state.get("direction", 0))
        since = state.get("since")
        self.since = None if since is None else float(since)


def clamp(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, n))


def limit_step(desired: int, current: int, max_step: int) -> int:
    return clamp(desired, current - max_step, current + max_step)
