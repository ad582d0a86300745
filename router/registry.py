"""Routing policies by name: the simulator's (and our live adapter's) pure policy objects.

The names, and what runs live for each, are the one table in `kvserve.policy_registry`.
"""

from __future__ import annotations

import importlib

from kvserve.policy_params import RouterParams
from kvserve.policy_registry import ROUTERS, sim_names
from router.base import RoutingPolicy


def policy_names() -> list[str]:
    """Every policy the simulator can run (live ones and simulator-only baselines)."""
    return sim_names(ROUTERS)


def policy_class(name: str) -> type[RoutingPolicy]:
    if name not in ROUTERS:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(policy_names())}")
    module, _, attr = ROUTERS[name].sim.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_policy(name: str, params: RouterParams | None = None, seed: int = 0) -> RoutingPolicy:
    return policy_class(name).create(params or RouterParams(), seed)
