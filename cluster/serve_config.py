"""KVServeConfig -> Ray Serve config (the `serveConfigV2` shape used by `serve deploy` and KubeRay).

One function builds it so `kvserve deploy`, the Helm chart's tests and the `ray up`
configs all agree on the application layout. Secrets never appear: the config model
only holds key *references* (env var, mounted file) or sha256 hashes, and
`assert_no_clear_secrets` guards that invariant before anything is rendered.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from kvserve.config import KVServeConfig

IMPORT_PATH = "deployments.app:build_app"
# Env of every Ray node that serves kvserve, set where Ray starts (the local launcher, ray up's `ray start`,
# the chart's containers): Serve's HTTP proxy reaches the ingress over gRPC rather than Ray's object
# streaming. Every streamed chunk crosses that hop, and gRPC costs both ends about half the CPU per
# chunk (docs/BENCHMARKS.md, "Overhead vs bare vLLM"). The ingress -> replica hop picks gRPC in code.
NODE_ENV = {"RAY_SERVE_PROXY_USE_GRPC": "1"}


def node_env_prefix() -> str:
    """NODE_ENV as a shell prefix for `ray start`."""
    return " ".join(f"{k}={v}" for k, v in sorted(NODE_ENV.items()))
ROUTE_PREFIX = "/"
REPLICA_DEPLOYMENT, INGRESS_DEPLOYMENT = "LLMReplica", "Ingress"

# Keys that would carry a clear-text secret if someone ever added them to the model.
_CLEAR_SECRET_KEYS = re.compile(r"^(key|api_key|token|password|secret)$", re.IGNORECASE)


def assert_no_clear_secrets(data: Any, path: str = "config") -> None:
    """Raise ValueError if a mapping key looks like it holds a clear-text secret."""
    if isinstance(data, dict):
        for k, v in data.items():
            if _CLEAR_SECRET_KEYS.match(str(k)) and v not in (None, ""):
                raise ValueError(f"{path}.{k}: clear-text secrets must not be rendered; use key_env/key_file/key_sha256")
            assert_no_clear_secrets(v, f"{path}.{k}")
    elif isinstance(data, list):
        for i, v in enumerate(data):
            assert_no_clear_secrets(v, f"{path}[{i}]")


def ingress_limits(cfg: KVServeConfig) -> dict[str, int]:
    """The ingress admits twice what the replicas' routers can hold (each replica's
    `max_ongoing_requests` plus the routers' `max_queued_requests`), so that the routers' bound
    -- an OpenAI-style 503 from the ingress, and a queue the autoscaler sees -- is the one that
    binds, with room for the requests being turned away. Its own queue, in Serve's HTTP proxy
    (whose 503s are plain), is bounded at the same size: it absorbs a burst's hand-over to the
    ingress, and a sustained flood past it is refused instead of queued without end."""
    s = cfg.server
    replicas = cfg.autoscaling.max_replicas if cfg.autoscaling.enabled else cfg.num_replicas
    ongoing = max(2 * (s.max_ongoing_requests * max(replicas, 1) + max(s.max_queued_requests, 0)), 256)
    return {"max_ongoing_requests": ongoing, "max_queued_requests": -1 if s.max_queued_requests < 0 else ongoing}


def size_overrides(cfg: KVServeConfig) -> list[dict[str, Any]]:
    """What depends on a fixed replica count, as Serve's per-deployment config overrides.

    Serve hashes an application's import path, runtime env and args into its code version, and
    a new code version restarts every replica. So the count is not in the args (they carry
    `num_replicas: 1`) but here, where changing it is a lightweight update: resizing adds or
    drains replicas and restarts no engine that keeps serving (their KV caches survive), nor the
    ingress (its `max_ongoing_requests` is reconfigured in place). With autoscaling on, Serve's
    autoscaling config sizes the fleet and there is nothing to override."""
    if cfg.autoscaling.enabled:
        return []
    return [
        {"name": REPLICA_DEPLOYMENT, "num_replicas": cfg.num_replicas},
        {"name": INGRESS_DEPLOYMENT, **ingress_limits(cfg)},
    ]


def build_application(cfg: KVServeConfig, runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The single Serve application entry (one element of `applications`)."""
    dumped = cfg.model_dump(mode="json")
    assert_no_clear_secrets(dumped)
    overrides = size_overrides(cfg)
    app = {
        "name": cfg.app_name,
        "route_prefix": ROUTE_PREFIX,
        "import_path": IMPORT_PATH,
        "args": {"config": {**dumped, "num_replicas": 1} if overrides else dumped},
        "runtime_env": dict(runtime_env or {}),
    }
    if overrides:
        app["deployments"] = overrides
    return app


def build_serve_config(cfg: KVServeConfig, runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """Ray Serve config (serveConfigV2 shape) for `cfg`: HTTP options plus one application."""
    return {
        "http_options": {
            "host": cfg.server.host,
            "port": cfg.server.port,
            "request_timeout_s": cfg.server.request_timeout_s,
        },
        "applications": [build_application(cfg, runtime_env)],
    }


def serve_config_yaml(cfg: KVServeConfig, runtime_env: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(build_serve_config(cfg, runtime_env), sort_keys=False)


def config_from_serve_config(serve_config: dict[str, Any] | str, app_name: str | None = None) -> KVServeConfig:
    """Inverse of build_serve_config: the KVServeConfig carried in a Serve config's app args.

    Accepts the dict or its YAML text (e.g. a RayService's `serveConfigV2` string).
    """
    data = yaml.safe_load(serve_config) if isinstance(serve_config, str) else serve_config
    apps = [a for a in data.get("applications", []) if a.get("import_path") == IMPORT_PATH]
    if app_name is not None:
        apps = [a for a in apps if a.get("name") == app_name]
    if len(apps) != 1:
        raise ValueError(f"expected exactly one {IMPORT_PATH} application, found {len(apps)}")
    raw = dict(apps[0]["args"]["config"])
    for dep in apps[0].get("deployments") or []:
        if dep.get("name") == REPLICA_DEPLOYMENT and "num_replicas" in dep:
            raw["num_replicas"] = dep["num_replicas"]  # the count lives in the override (size_overrides)
    return KVServeConfig.model_validate(raw)
