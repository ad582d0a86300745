"""Ray Serve's built-in rule (`replica_queue_length_autoscaling_policy`), re-implemented so the
simulator can compare against it: desired = ceil(total_ongoing / target_ongoing_requests),
with Serve's upscale/downscale delays and min/max bounds (scaling factors of 1)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from autoscaling.delay import DelayGate, clamp
from kvserve.policy_params import AutoscalerParams


class ServeDefaultPolicy(ScalingPolicy):
    name: ClassVar[str] = "serve_default"

    def __init__(self, cfg: AutoscalerParams) -> None:
        self.cfg = cfg
        self.gate = DelayGate(cfg.upscale_delay_s, cfg.downscale_delay_s)

    def decide(self, inp: ScalingInput) -> Decision:
        cfg = self.cfg
        current = inp.target_replicas
        if inp.running_replicas == 0 and inp.total_ongoing > 0:
            # Serve's cold-start fast path: from zero, scale up at once, bypassing the delay.
            return Decision(clamp(max(1, current), max(cfg.min_replicas, 1), cfg.max_replicas), "cold start")
        if inp.running_replicas == 0:
            return Decision(clamp(current, cfg.min_replicas, cfg.max_replicas), "no running replicas: hold")
        raw = math.ceil(inp.total_ongoing / cfg.target_ongoing_requests - 1e-9)
        if raw < current and current > 1:
            raw = max(raw, 1)  # Serve only goes to zero from exactly one replica
        desired = clamp(raw, cfg.min_replicas, cfg.max_replicas)
        out = clamp(self.gate.apply(desired, current, inp.now), cfg.min_replicas, cfg.max_replicas)
        return Decision(out, f"ongoing={inp.total_ongoing:.1f} target/replica={cfg.target_ongoing_requests} -> {desired}")

    def get_state(self) -> dict[str, Any]:
        return {"gate": self.gate.get_state()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.gate.set_state(state.get("gate", {}))
