"""Autoscaler factory: name -> pure policy object (shared by the Serve adapter and the simulator)."""

from __future__ import annotations

from collections.abc import Callable

from autoscaling.base import ScalingPolicy
from autoscaling.policies.fixed_max import FixedMaxPolicy
from autoscaling.policies.kvserve import KVServePolicy
from autoscaling.policies.serve_default import ServeDefaultPolicy
from kvserve.config import AutoscalingConfig, SLOConfig
from kvserve.perf_model import EngineProfile

Factory = Callable[[AutoscalingConfig, SLOConfig, "EngineProfile | None"], ScalingPolicy]

_FACTORIES: dict[str, Factory] = {
    "fixed_max": lambda cfg, slo, profile: FixedMaxPolicy(cfg),
    "serve_default": lambda cfg, slo, profile: ServeDefaultPolicy(cfg),
    "kvserve": lambda cfg, slo, profile: KVServePolicy(cfg, slo, profile),
}


def register(name: str, factory: Factory) -> None:
    _FACTORIES[name] = factory


def autoscaler_names() -> list[str]:
    return sorted(_FACTORIES)


def load_profile(cfg: AutoscalingConfig) -> EngineProfile | None:
    """The capacity model's engine profile named by `autoscaling.profile` (None when unset)."""
    return EngineProfile.load(cfg.profile) if cfg.profile else None


def make_autoscaler(
    name: str,
    cfg: AutoscalingConfig | None = None,
    slo: SLOConfig | None = None,
    profile: EngineProfile | None = None,
    max_batch: int | None = None,
) -> ScalingPolicy:
    """`max_batch`: the engine's `max_num_seqs`. A capacity model must not plan decode batches
    the engine will never run (the default, 256, overstates a 32-sequence engine ~2x)."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown autoscaler {name!r}; known: {', '.join(autoscaler_names())}")
    policy = _FACTORIES[name](cfg or AutoscalingConfig(), slo or SLOConfig(), profile)
    if max_batch is not None and hasattr(policy, "max_batch"):
        policy.max_batch = max_batch
    return policy
