"""Policy factory: config name -> pure policy object (shared by the live router and the simulator)."""

from __future__ import annotations

from collections.abc import Callable

from kvserve.config import RouterConfig
from router.base import RoutingPolicy
from router.policies.approx_tree import ApproxTreePolicy
from router.policies.kvserve import KVServePolicy
from router.policies.pow2 import PowerOfTwoPolicy
from router.policies.ray_prefix_sim import RayPrefixSimPolicy
from router.policies.round_robin import RoundRobinPolicy

_FACTORIES: dict[str, Callable[[RouterConfig, int], RoutingPolicy]] = {
    "round_robin": lambda cfg, seed: RoundRobinPolicy(),
    "pow2": lambda cfg, seed: PowerOfTwoPolicy(seed),
    "kvserve": lambda cfg, seed: KVServePolicy(cfg, seed),
    # Simulator baselines (our re-implementations); live, `ray_prefix` is Ray's own router.
    "approx_tree": lambda cfg, seed: ApproxTreePolicy(),
    "ray_prefix": lambda cfg, seed: RayPrefixSimPolicy(seed),
}


def register(name: str, factory: Callable[[RouterConfig, int], RoutingPolicy]) -> None:
    _FACTORIES[name] = factory


def policy_names() -> list[str]:
    return sorted(_FACTORIES)


def make_policy(name: str, cfg: RouterConfig | None = None, seed: int = 0) -> RoutingPolicy:
    if name not in _FACTORIES:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(policy_names())}")
    return _FACTORIES[name](cfg or RouterConfig(), seed)
