"""Local launcher: start (or join) Ray, deploy the Serve app from a config, wait until it serves.

`kvserve serve` = start_cluster + deploy + block + shutdown.
`kvserve deploy` / bench = deploy onto an already-running cluster.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable

import httpx

from kvserve.config import KVServeConfig
from cluster.serve_config import NODE_ENV


def _ray_env(cfg: KVServeConfig) -> dict[str, str]:
    from deployments.autoscaling_policy import metrics_push_env_vars

    env = {
        # Replicas report routing stats often; the controller must not treat this as slow.
        "RAY_SERVE_REQUEST_ROUTING_STATS_PERIOD_S": str(cfg.router.stats_period_s),
        **NODE_ENV,  # Serve's proxy -> ingress hop over gRPC (cluster.serve_config)
        # Keep vLLM usage stats off (no network here) and its logs readable.
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CONFIGURE_LOGGING": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }
    env.update(metrics_push_env_vars(cfg))
    return env


def cluster_reachable() -> bool:
    import ray

    try:
        ray.init(address="auto", namespace="kvserve", logging_level="ERROR", log_to_driver=False)
        return True
    except (ConnectionError, RuntimeError, ValueError):
        return False


def start_cluster(cfg: KVServeConfig, join_existing: bool = True) -> bool:
    """Connect to a running Ray cluster or start a local one. Returns True if we started it."""
    import ray

    for k, v in _ray_env(cfg).items():
        os.environ.setdefault(k, v)
    if ray.is_initialized():
        return False
    if join_existing and os.environ.get("RAY_ADDRESS") and cluster_reachable():
        return False
    needed = cfg.num_replicas * cfg.engine.cpus_per_replica
    if cfg.autoscaling.enabled:
        needed = cfg.autoscaling.max_replicas * cfg.engine.cpus_per_replica
    ray.init(
        namespace="kvserve",
        num_cpus=int(max(os.cpu_count() or 1, needed)),
        include_dashboard=True,  # the state API (`kvserve status`, live replica list) needs it
        dashboard_host="127.0.0.1",
        logging_level="WARNING",
        log_to_driver=os.environ.get("KVSERVE_LOG_TO_DRIVER", "1") == "1",
        runtime_env={"env_vars": _ray_env(cfg)},
    )
    return True


def deploy(cfg: KVServeConfig, address: str | None = "auto", timeout_s: float = 600.0,
           on_wait: Callable[[str], None] | None = None, restart: bool = False, wait: bool = True,
           cache_epoch: str = "") -> None:
    """(Re)deploy the app described by `cfg` and (with `wait`) wait until every replica serves.

    Replicas restart only when the config (apart from the replica count) or the code changed
    (`deployments.app.deployment_version`): a resize keeps the running engines and their caches.
    `restart`: replace every replica anyway (cold engines and caches).
    `cache_epoch`: a value other than the running one empties every replica's prefix cache, engines kept."""
    import ray
    from ray import serve

    from deployments.app import build_app

    if not ray.is_initialized():
        for k, v in _ray_env(cfg).items():
            os.environ.setdefault(k, v)
        # The same job-level env as `start_cluster`: Serve folds it into the replicas' actor options,
        # so a driver without it (`kvserve bench` redeploying) would restart every engine.
        ray.init(address=address, namespace="kvserve", logging_level="ERROR", log_to_driver=False,
                 runtime_env={"env_vars": _ray_env(cfg)})
    serve.start(
        http_options={"host": cfg.server.host, "port": cfg.server.port,
                      "request_timeout_s": cfg.server.request_timeout_s},
    )
    args: dict = {"config": cfg, "cache_epoch": cache_epoch}
    if restart:
        args["generation"] = uuid.uuid4().hex
    # Serve's own wait (for the app to be RUNNING) only with `wait`: without it the caller gets the
    # cluster while replicas still start, as a user who benches right after a deploy does.
    serve.run_many([serve.RunTarget(build_app(args), name=cfg.app_name, route_prefix="/")],
                   wait_for_applications_running=wait)
    if wait:
        wait_ready(cfg, timeout_s, on_wait)


def base_url(cfg: KVServeConfig) -> str:
    host = "127.0.0.1" if cfg.server.host in ("0.0.0.0", "::") else cfg.server.host
    return f"http://{host}:{cfg.server.port}"


def wait_ready(cfg: KVServeConfig, timeout_s: float = 600.0, on_wait: Callable[[str], None] | None = None) -> None:
    """Until /ready says every replica serves and one real completion goes through each path."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    want = cfg.autoscaling.initial_replicas or cfg.autoscaling.min_replicas if cfg.autoscaling.enabled else cfg.num_replicas
    last = ""
    while time.monotonic() < deadline:
        st = serve.status().applications.get(cfg.app_name)
        if st is not None:
            dep = st.deployments.get("LLMReplica")
            running = dep.replica_states.get("RUNNING", 0) if dep else 0
            msg = f"app {st.status}, replicas running {running}/{want}"
            if st.status == "DEPLOY_FAILED":
                raise RuntimeError(f"deployment failed: {st.message or (dep.message if dep else '')}")
            # want 0 (autoscaling.min_replicas 0): the app serves with no replica; the ingress holds requests.
            if st.status == "RUNNING" and running >= want:
                try:
                    r = httpx.get(base_url(cfg) + "/ready", timeout=5)
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            if msg != last and on_wait:
                on_wait(msg)
            last = msg
        time.sleep(1.0)
    raise TimeoutError(f"app {cfg.app_name} not ready after {timeout_s:.0f}s ({last})")


def shutdown(started_cluster: bool) -> None:
    import ray
    from ray import serve

    try:
        serve.shutdown()
    except Exception:
        pass
    if started_cluster:
        ray.shutdown()
