"""Scripted autoscaling bounds that pay what a real policy pays, and the pre-warm bound.

The suite's oracle (fewest replicas per minute, in hindsight) pays no start-up and reacts to nothing;
its causal bound (`simulator.suite.ZeroLagScript`) drops replicas the instant a minute starts. These
scripts follow the same per-minute counts but pay more of what a policy pays:

- `HindsightStartup` ("hindsight_startup_bound"): knows the future. Each replica is asked for
  `start_s` before the minute that needs it, so the oracle's count is serving at every minute, and
  every start-up is paid as replica-seconds. No schedule that serves the oracle's counts with that
  start-up costs less (`hindsight_replica_seconds`).
- `LaggedScript` ("lagged_causal_bound"): sees only the past. It learns minute m's count `lag_s` after
  the minute starts and passes it through the policies' own delay gate (`autoscaling.delay.DelayGate`:
  a wish acts once it has lasted `upscale_delay_s` / `downscale_delay_s`), paying real start-up.

`fleet_prefix` and `newreplica_hit_bound` bound the pre-warm target: the hit rate a new replica's own
requests would have had if it held every block cached anywhere in the fleet when each reached it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from autoscaling.delay import DelayGate
from simulator.engine import SimRequest
from simulator.kv_blocks import KVCache
from simulator.metrics import MINUTE_S


def _need(per_minute: Sequence[int], t: float) -> int:
    return per_minute[min(max(int(t // MINUTE_S), 0), len(per_minute) - 1)]


def hindsight_target(per_minute: Sequence[int], t: float, lead_s: float) -> int:
    """Replicas (serving + starting) at `t`: the most any minute in [t, t + lead_s] needs. A replica
    needed at u must exist from u - lead_s on; keeping one through a dip shorter than lead_s costs less
    than restarting it, so this is also the cheapest count."""
    last = min(int((t + lead_s) // MINUTE_S), len(per_minute) - 1)
    return max(per_minute[min(max(int(t // MINUTE_S), 0), last): last + 1])


def hindsight_replica_seconds(per_minute: Sequence[int], start_s: float, horizon_s: float, initial: int = 0) -> float:
    """Replica-seconds of `hindsight_target` over [-start_s, horizon_s): the oracle's counts served at
    every minute of [0, horizon_s), each replica paid from when it was asked for (minute 0's before
    t=0), except `initial` ones already up at t=0 (every run's first replicas, free before it)."""
    cuts = {b for m in range(1, len(per_minute)) for b in (m * MINUTE_S, m * MINUTE_S - start_s)}
    edges = sorted(e for e in cuts | {-start_s, 0.0, horizon_s} if -start_s <= e <= horizon_s)
    total = 0.0
    for a, b in zip(edges, edges[1:]):  # the target is constant between consecutive cuts
        mid = (a + b) / 2
        if mid < 0:
            n = max(hindsight_target(per_minute, 0.0, mid + start_s) - initial, 0)
        else:
            n = hindsight_target(per_minute, mid, start_s)
        total += n * (b - a)
    return total


class HindsightStartup(ScalingPolicy):
    """The hindsight start-up bound: asks at `t` for `hindsight_target(per_minute, t, lead_s)`, where
    lead_s is the start-up plus one decision interval (a decision lands on the interval's grid)."""

    name: ClassVar[str] = "hindsight_startup_bound"

    def __init__(self, per_minute: Sequence[int], lead_s: float) -> None:
        self.per_minute, self.lead_s = list(per_minute), lead_s

    def decide(self, inp: ScalingInput) -> Decision:
        return Decision(hindsight_target(self.per_minute, inp.now, self.lead_s), "oracle, started ahead")


class LaggedScript(ScalingPolicy):
    """The lagged causal bound: at `t` it wants minute(t - lag_s)'s count (before `lag_s`: what it has),
    through the delay gate a real policy uses."""

    name: ClassVar[str] = "lagged_causal_bound"

    def __init__(self, per_minute: Sequence[int], lag_s: float, upscale_delay_s: float, downscale_delay_s: float) -> None:
        self.per_minute, self.lag_s = list(per_minute), lag_s
        self.gate = DelayGate(upscale_delay_s, downscale_delay_s)

    def decide(self, inp: ScalingInput) -> Decision:
        if inp.now < self.lag_s:
            return Decision(inp.target_replicas, "nothing seen yet")
        want = _need(self.per_minute, inp.now - self.lag_s)
        return Decision(self.gate.apply(want, inp.target_replicas, inp.now), f"oracle {self.lag_s:g} s late, gated")


def fleet_prefix(caches: Iterable[KVCache], hashes: Sequence[int]) -> int:
    """Leading blocks of `hashes` each cached on some replica: what a replica holding every block the
    fleet has (perfect pre-warm, free KV transfer) would hit."""
    pools = list(caches)
    n = 0
    for h in hashes:
        if not any(kv.is_cached(h) for kv in pools):
            break
        n += 1
    return n


def _rate(hits: float, blocks: int) -> float | None:
    return hits / blocks if blocks else None


def newreplica_hit_bound(requests: Sequence[SimRequest], serving_since: dict[str, float],
                         window_s: float) -> dict[str, Any]:
    """The pre-warm bound over each scaled-up replica's first `window_s` of serving.

    `own`: the requests the router gave a new replica in that window (those of `newreplica_hit_rate`);
    `fleet`: every request routed, anywhere, within any such window. Ratios are to the fleet's hit rate
    over those same spans; `newreplica_hit_bound` is the ceiling's (`SimRequest.fleet_hit_blocks`,
    recorded when each was routed), so a pre-warm that copies blocks cannot reach more."""
    new = {rid: t for rid, t in serving_since.items() if t > 0.0}
    served = [r for r in requests if r.routed is not None and r.first_token is not None and not r.failed]
    own = [r for r in served if r.replica in new and r.routed - new[r.replica] <= window_s]  # type: ignore[operator]
    fleet = [r for r in served if any(t <= r.routed <= t + window_s for t in new.values())]  # type: ignore[operator]
    blocks = sum(len(r.block_hashes) for r in own)
    actual = _rate(sum(r.hit_blocks for r in own), blocks)
    ceiling = _rate(sum(max(r.hit_blocks, r.fleet_hit_blocks or 0) for r in own), blocks)
    same = _rate(sum(r.hit_blocks for r in fleet), sum(len(r.block_hashes) for r in fleet))
    ratio = lambda x: x / same if x is not None and same else None  # noqa: E731
    return {"newreplica_hit_bound": ratio(ceiling), "newreplica_hit_ratio": ratio(actual),
            "newreplica_hit_ceiling": ceiling, "fleet_hit_rate_new_windows": same}
