"""Baseline: always run `max_replicas` (the cost ceiling every autoscaler is compared with)."""

from __future__ import annotations

from typing import ClassVar

from autoscaling.base import Decision, ScalingInput, ScalingPolicy
from kvserve.policy_params import AutoscalerParams


class FixedMaxPolicy(ScalingPolicy):
    name: ClassVar[str] = "fixed_max"

    def __init__(self, cfg: AutoscalerParams) -> None:
        self.cfg = cfg

    def decide(self, inp: ScalingInput) -> Decision:
        return Decision(self.cfg.max_replicas, "fixed at max_replicas")
