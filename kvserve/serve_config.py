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
ROUTE_PREFIX = "/"

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


def build_application(cfg: KVServeConfig, runtime_env: dict[str, Any] | None = None) -> dict[str, Any]:
    """The single Serve application entry (one element of `applications`)."""
    dumped = cfg.model_dump(mode="json")
    assert_no_clear_secrets(dumped)
    return {
        "name": cfg.app_name,
        "route_prefix": ROUTE_PREFIX,
        "import_path": IMPORT_PATH,
        "args": {"config": dumped},
        "runtime_env": dict(runtime_env or {}),
    }


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
    return KVServeConfig.model_validate(apps[0]["args"]["config"])
