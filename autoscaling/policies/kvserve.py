"""kvserve's SLO autoscaler: the fewest replicas that keep p90 TTFT and ITL within target.

Two demands, the larger wins:
  (a) SLO error: r = max(p90 TTFT / target, p90 ITL / target) over the fleet
      (per-replica p90s weighted by request rate).
        r > 1                       -> ceil(current * r)    (scale up in proportion)
        hysteresis <= r <= 1        -> current              (hold; veto scale-down)
        r < hysteresis              -> no SLO constraint, provided that after removing
                                       one replica the load-scaled r * n/(n-1) would still
                                       be below hysteresis; otherwise hold.
  (b) Capacity model (`autoscaling.capacity`, from the engine profile): the fleet's
      measured request rate and mean uncached prompt / output lengths -> replicas needed.
Then: an overload memory (the per-replica rate that once broke the SLO, planned at
`hysteresis` of it) vetoes scale-downs that would recreate that overload -- this is
what stops 1 -> 2 -> 1 -> 2 flapping on a steady load when latency is steep in load;
min/max bounds; at most `max_step` replicas per decision; upscale/downscale delays
(a wish must persist that long, as in Ray Serve). No metrics at all -> hold (except
from zero replicas with requests waiting: cold start to one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from autoscaling.base import Decision, ReplicaMetrics, ScalingInput, ScalingPolicy
from autoscaling.capacity import DEFAULT_MAX_BATCH, replicas_needed
from autoscaling.delay import DelayGate, clamp, limit_step
from kvserve.config import AutoscalingConfig, SLOConfig
from kvserve.perf_model import EngineProfile

MIN_RATE_RPS = 1e-6  # below this a fleet is idle: too little traffic to learn an overload rate from


@dataclass(frozen=True)
class FleetSignals:
    rate_rps: float  # arrivals/s summed over replicas
    uncached_prompt_tokens: float  # rate-weighted mean prompt tokens not served from cache
    output_tokens: float  # rate-weighted mean output tokens
    ttft_p90_ms: float | None  # rate-weighted mean of replicas' p90s (None: no samples)
    itl_p90_ms: float | None
    waiting: int
    running: int


def _weighted(pairs: Sequence[tuple[float, float]]) -> float | None:
    """Weighted mean of (value, weight); equal weights when all weights are zero."""
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    if total <= 0:
        return sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def fleet_signals(metrics: Sequence[ReplicaMetrics]) -> FleetSignals:
    rate = sum(max(m.requests_per_s, 0.0) for m in metrics)
    uncached = [(m.mean_prompt_tokens * (1.0 - min(max(m.cache_hit_rate, 0.0), 1.0)), m.requests_per_s) for m in metrics]
    output = [(m.mean_output_tokens, m.requests_per_s) for m in metrics]
    ttft = [(m.ttft_p90_ms, m.requests_per_s) for m in metrics if m.ttft_p90_ms is not None]
    itl = [(m.itl_p90_ms, m.requests_per_s) for m in metrics if m.itl_p90_ms is not None]
    return FleetSignals(
        rate_rps=rate,
        uncached_prompt_tokens=_weighted(uncached) or 0.0,
        output_tokens=_weighted(output) or 0.0,
        ttft_p90_ms=_weighted(ttft),  # type: ignore[arg-type]
        itl_p90_ms=_weighted(itl),  # type: ignore[arg-type]
        waiting=sum(m.waiting for m in metrics),
        running=sum(m.running for m in metrics),
    )


class KVServePolicy(ScalingPolicy):
    name: ClassVar[str] = "kvserve"

    def __init__(
        self,
        cfg: AutoscalingConfig,
        slo: SLOConfig,
        profile: EngineProfile | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.cfg, self.slo, self.profile, self.max_batch = cfg, slo, profile, max_batch
        self.gate = DelayGate(cfg.upscale_delay_s, cfg.downscale_delay_s)
        self.overload_rps_per_replica: float | None = None
        self._capacity_memo: dict[tuple[float, float, float], int] = {}

    # -- the two demands ---------------------------------------------------------

    def slo_ratio(self, sig: FleetSignals) -> float | None:
        ratios = []
        if sig.ttft_p90_ms is not None:
            ratios.append(sig.ttft_p90_ms / self.slo.ttft_p90_ms)
        if sig.itl_p90_ms is not None:
            ratios.append(sig.itl_p90_ms / self.slo.itl_p90_ms)
        return max(ratios) if ratios else None

    def slo_demand(self, sig: FleetSignals, inp: ScalingInput) -> tuple[int, str]:
        current = inp.current_replicas
        r = self.slo_ratio(sig)
        if r is None:
            if sig.rate_rps == 0 and sig.waiting == 0 and sig.running == 0:
                return 0, "idle"
            return current, "no latency samples yet: hold"
        if r > 1:
            if inp.running_replicas < current:
                # Replicas still starting: the latency they will remove is not measured yet.
                return current, f"slo r={r:.2f} but scale-up in progress"
            return max(current + 1, math.ceil(max(current, 1) * r - 1e-9)), f"slo r={r:.2f} > 1"
        if r >= self.cfg.hysteresis:
            return current, f"slo r={r:.2f} within hysteresis band"
        if current > 1 and r * current / (current - 1) < self.cfg.hysteresis:
            # With a capacity model it sizes the fleet; without one, shed one replica at a
            # time (latency is not linear in load, so larger steps would be guesses).
            return (0 if self.profile is not None else current - 1), f"slo r={r:.2f} comfortable"
        return current, f"slo r={r:.2f}: one replica fewer would not stay comfortable"

    def capacity_demand(self, sig: FleetSignals) -> int:
        if self.profile is None or sig.rate_rps <= 0:
            return 0
        key = (sig.rate_rps, sig.uncached_prompt_tokens, sig.output_tokens)
        if key in self._capacity_memo:  # steady load repeats the same signals tick after tick
            return self._capacity_memo[key]
        est = replicas_needed(
            self.profile,
            sig.rate_rps,
            sig.uncached_prompt_tokens,
            sig.output_tokens,
            self.slo.ttft_p90_ms,
            self.slo.itl_p90_ms,
            self.cfg.headroom,
            self.max_batch,
        )
        if len(self._capacity_memo) >= 64:
            self._capacity_memo.clear()
        self._capacity_memo[key] = est.replicas
        return est.replicas

    def memory_floor(self, sig: FleetSignals) -> int:
        if not self.overload_rps_per_replica or sig.rate_rps <= 0:
            return 0
        # Capped: the floor only ever limits a scale-down to at most `current` anyway.
        x = min(sig.rate_rps / (self.overload_rps_per_replica * self.cfg.hysteresis), 1e6)
        return math.ceil(x * (1 - 1e-12))

    # -- decision ----------------------------------------------------------------

    def decide(self, inp: ScalingInput) -> Decision:
        cfg = self.cfg
        current = inp.current_replicas
        if inp.running_replicas == 0 and current == 0 and inp.total_ongoing > 0:
            # Scale from zero at once (Serve's cold-start path does the same live).
            return Decision(clamp(1, max(cfg.min_replicas, 1), cfg.max_replicas), "cold start")
        if not inp.metrics:
            return Decision(clamp(current, cfg.min_replicas, cfg.max_replicas), "no metrics: hold")
        sig = fleet_signals(inp.metrics)
        slo_n, slo_why = self.slo_demand(sig, inp)
        cap_n = self.capacity_demand(sig)
        desired = max(slo_n, cap_n)
        if desired < current:
            desired = max(desired, min(self.memory_floor(sig), current))
        # Learn: a comfortable fleet at a higher per-replica rate than the remembered overload
        # proves the memory stale (e.g. prompts got shorter), so raise it.
        r = self.slo_ratio(sig)
        if self.overload_rps_per_replica and r is not None and r < cfg.hysteresis and current > 0 \
                and sig.rate_rps > MIN_RATE_RPS:
            self.overload_rps_per_replica = max(self.overload_rps_per_replica, sig.rate_rps / current)
        desired = clamp(limit_step(clamp(desired, cfg.min_replicas, cfg.max_replicas), current, cfg.max_step),
                        cfg.min_replicas, cfg.max_replicas)
        out = clamp(self.gate.apply(desired, current, inp.now), cfg.min_replicas, cfg.max_replicas)
        if out > current and slo_n >= cap_n and slo_n > current and sig.rate_rps > MIN_RATE_RPS and current > 0:
            self.overload_rps_per_replica = sig.rate_rps / current
        reason = f"{slo_why}; capacity={cap_n}; desired={desired}"
        return Decision(out, reason if out != current or desired == current else reason + " (delayed)")

    def get_state(self) -> dict[str, Any]:
        return {"gate": self.gate.get_state(), "overload_rps_per_replica": self.overload_rps_per_replica}

    def set_state(self, state: dict[str, Any]) -> None:
        self.gate.set_state(state.get("gate", {}))
        v = state.get("overload_rps_per_replica")
        self.overload_rps_per_replica = None if v is None else float(v)
