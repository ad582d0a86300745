"""One registry per kind: every name resolves to a simulator policy and (unless simulator-only) a live
implementation, and the config accepts exactly the live names."""

from __future__ import annotations

import importlib

import pytest

from autoscaling.base import ScalingPolicy
from autoscaling.registry import autoscaler_class, autoscaler_names, make_autoscaler
from deployments.app import request_router_config
from deployments.autoscaling_policy import SLOAutoscalingPolicy, autoscaling_config_for
from deployments.request_router import KVServeRequestRouter
from kvserve.config import ConfigError, KVServeConfig, load_config
from kvserve.policy_registry import AUTOSCALERS, ROUTERS, live_names
from router.base import RoutingPolicy
from router.registry import make_policy, policy_class, policy_names


def _load(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def test_every_simulator_policy_is_the_named_pure_class() -> None:
    assert policy_names() == sorted(ROUTERS) and autoscaler_names() == sorted(AUTOSCALERS)
    for name in ROUTERS:
        assert issubclass(policy_class(name), RoutingPolicy) and policy_class(name).name == name
        assert isinstance(make_policy(name), policy_class(name))
    for name in AUTOSCALERS:
        assert issubclass(autoscaler_class(name), ScalingPolicy) and autoscaler_class(name).name == name
        assert isinstance(make_autoscaler(name), autoscaler_class(name))


def test_live_implementations_resolve_and_ray_ones_are_marked() -> None:
    for table in (ROUTERS, AUTOSCALERS):
        for entry in table.values():
            if entry.live is not None:
                assert callable(_load(entry.live)), entry
    assert {n for n, e in ROUTERS.items() if e.live_origin == "ray"} == {"pow2", "ray_prefix"}
    assert {n for n, e in AUTOSCALERS.items() if e.live_origin == "ray"} == {"serve_default"}
    assert _load(ROUTERS["kvserve"].live) is KVServeRequestRouter and ROUTERS["kvserve"].shared
    assert _load(AUTOSCALERS["kvserve"].live) is SLOAutoscalingPolicy and AUTOSCALERS["kvserve"].shared


def test_simulator_only_baselines_are_declared_and_the_config_refuses_them() -> None:
    assert ROUTERS["approx_tree"].live is None and AUTOSCALERS["fixed_max"].live is None
    assert set(live_names(ROUTERS)) == {"round_robin", "pow2", "ray_prefix", "kvserve"}
    assert set(live_names(AUTOSCALERS)) == {"kvserve", "serve_default"}
    with pytest.raises(ConfigError, match="router.policy"):
        load_config(overrides={"router": {"policy": "approx_tree"}}, environ={})
    with pytest.raises(ConfigError, match="autoscaling.policy"):
        load_config(overrides={"autoscaling": {"policy": "fixed_max"}}, environ={})


@pytest.mark.parametrize("name", live_names(ROUTERS))
def test_serve_runs_the_registry_entry_for_each_live_router(name: str) -> None:
    rc = request_router_config(KVServeConfig.model_validate({"router": {"policy": name}}))
    assert rc.get_request_router_class() is _load(ROUTERS[name].live)
    # Our adapter is told which pure policy to run; Ray's classes take no kwargs from us.
    assert (rc.request_router_kwargs.get("policy") == name) == ROUTERS[name].shared


def test_serve_default_live_is_serves_own_rule() -> None:
    cfg = KVServeConfig.model_validate({"autoscaling": {"enabled": True, "policy": "serve_default"}})
    assert "policy" not in autoscaling_config_for(cfg)  # no custom policy: Serve's built-in rule runs
    cfg = KVServeConfig.model_validate({"autoscaling": {"enabled": True, "policy": "kvserve"}})
    assert autoscaling_config_for(cfg)["policy"]["policy_function"] == AUTOSCALERS["kvserve"].live
