"""Build the Serve application from the one config: Ingress -> LLMReplica (routed by config.router.policy).

`build_app` is the Serve import path (`deployments.app:build_app`, args
`{"config": {...}}`) used by `kvserve serve`, `serve deploy`, ray up and the
Helm chart's serveConfigV2 alike.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig

from cluster.serve_config import ingress_limits
from deployments.autoscaling_policy import autoscaling_config_for, drain_options_for
from deployments.ingress import Ingress
from deployments.replica import LLMReplica
from kvserve.config import KVServeConfig, require_servable
from kvserve.policy_registry import ROUTERS


def request_router_config(cfg: KVServeConfig) -> RequestRouterConfig:
    entry = ROUTERS[cfg.router.policy]  # the config only accepts names with a live implementation
    kwargs: dict[str, Any] = {}
    if entry.shared:  # our adapter, running the registry's pure policy
        kwargs = {"policy": entry.name, "router_config": cfg.router.model_dump(mode="json")}
    return RequestRouterConfig(
        request_router_class=entry.live,
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=cfg.router.stats_period_s,
        request_routing_stats_timeout_s=max(cfg.router.stats_period_s * 4, 2.0),
    )


def replica_options(cfg: KVServeConfig) -> dict[str, Any]:
    e = cfg.engine
    actor: dict[str, Any] = {"num_cpus": e.cpus_per_replica}
    if e.device == "gpu":
        actor["num_gpus"] = e.gpus_per_replica
    opts: dict[str, Any] = {
        "name": "LLMReplica",
        "ray_actor_options": actor,
        "max_ongoing_requests": cfg.server.max_ongoing_requests,
        "max_queued_requests": cfg.server.max_queued_requests,
        "request_router_config": request_router_config(cfg),
        "health_check_period_s": cfg.server.health_check_period_s,
        "health_check_timeout_s": 60.0,
        **drain_options_for(cfg),
    }
    if cfg.autoscaling.enabled:
        opts["autoscaling_config"] = autoscaling_config_for(cfg, cfg.autoscaling.profile)
    else:
        opts["num_replicas"] = cfg.num_replicas
    return opts


SOURCE_PACKAGES = ("deployments", "router", "autoscaling", "flow", "kvserve", "cluster")  # what the replicas import


@functools.cache
def source_fingerprint() -> str:
    """sha256 of the Python sources the replicas run (these packages' .py files)."""
    h = hashlib.sha256()
    for pkg in SOURCE_PACKAGES:
        root = Path(importlib.import_module(pkg).__file__).parent
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def deployment_version(config_args: dict, generation: str = "") -> str:
    """What must restart a replica: the config it is built from (without the replica count) and
    our code. `serve.run` otherwise gives every deploy a random version, so each `kvserve deploy`
    -- a resize too -- restarted every engine and emptied every KV cache. With this version a
    resize is a lightweight update (replicas added or drained, none restarted), as it is for a
    Serve config file (`cluster.serve_config.size_overrides`); there Serve derives the version itself.
    `generation`: any new value forces a restart (`kvserve bench --cold-engines`)."""
    payload = json.dumps([config_args, generation], sort_keys=True, default=str).encode()
    return hashlib.sha256(payload + source_fingerprint().encode()).hexdigest()[:32]


def replica_version(config_args: dict, generation: str = "") -> str:
    """The replicas' version leaves out the routing policy: it runs in the ingress's handle, so a
    policy change restarts the ingress (a new handle, a new router) and only reconfigures the engines."""
    router = {k: v for k, v in config_args.get("router", {}).items() if k != "policy"}
    return deployment_version({**config_args, "router": router}, generation)


def batch_store_pin(cfg: KVServeConfig) -> dict[str, Any]:
    """The ingress runs the batch worker and holds its SQLite file: pinned to that file's node if asked."""
    res = cfg.batch.node_resource
    return {"resources": {res: 0.001}} if res else {}


def build_app(args: dict) -> serve.Application:
    raw = args.get("config", args)
    cfg = raw if isinstance(raw, KVServeConfig) else KVServeConfig.model_validate(raw)
    require_servable(cfg)  # every path ends here (Helm's serveConfigV2 too): no keyless server by accident
    config = cfg.model_dump(mode="json")
    # Both deployments get the config without the replica count, so resizing is a lightweight
    # scale: it restarts neither the engines that keep serving nor the ingress, whose restart
    # would cut the streams it is relaying (the replica count is not read by either).
    config_args = {**config, "num_replicas": 1}
    generation = str(args.get("generation", ""))
    version = deployment_version(config_args, generation)
    # A new cache_epoch empties every replica's prefix cache (LLMReplica.reconfigure), engines kept.
    replica = serve.deployment(LLMReplica).options(**replica_options(cfg),
                                                   user_config={"cache_epoch": str(args.get("cache_epoch", ""))})
    replica = replica.options(version=replica_version(config_args, generation),
                              _internal=True).bind(config_args)  # (Serve's own way to pin it)
    ingress = serve.deployment(Ingress).options(
        name="Ingress",
        num_replicas=1,
        ray_actor_options={"num_cpus": 0, **batch_store_pin(cfg)},
        **ingress_limits(cfg),
        **drain_options_for(cfg),  # a config change that does replace it lets its streams finish
    )
    return ingress.options(version=version, _internal=True).bind(replica, config_args)
