"""Autoscalers by name: the simulator's (and our live adapter's) pure policy objects.

The names, and what runs live for each, are the one table in `kvserve.policy_registry`.
"""

from __future__ import annotations

import importlib

from autoscaling.base import ScalingPolicy
from kvserve.perf_model import EngineProfile
from kvserve.policy_params import AutoscalerParams, SLOTargets
from kvserve.policy_registry import AUTOSCALERS, sim_names


def autoscaler_names() -> list[str]:
    """Every autoscaler the simulator can run (live ones and simulator-only baselines)."""
    return sim_names(AUTOSCALERS)


def autoscaler_class(name: str) -> type[ScalingPolicy]:
    if name not in AUTOSCALERS:
        raise ValueError(f"unknown autoscaler {name!r}; known: {', '.join(autoscaler_names())}")
    module, _, attr = AUTOSCALERS[name].sim.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_autoscaler(
    name: str,
    params: AutoscalerParams | None = None,
    slo: SLOTargets | None = None,
    profile: EngineProfile | None = None,
    max_batch: int | None = None,
) -> ScalingPolicy:
    """`max_batch`: the engine's `max_num_seqs`. A capacity model must not plan decode batches
    the engine will never run (the default, 256, overstates a 32-sequence engine ~2x)."""
    policy = autoscaler_class(name).create(params or AutoscalerParams(), slo or SLOTargets(), profile)
    if max_batch is not None and hasattr(policy, "max_batch"):
        policy.max_batch = max_batch
    return policy
