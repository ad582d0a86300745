"""`ray up` configs under cluster/: up to date with the renderer, valid for Ray, wired to the kvserve config."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import ray.autoscaler
import yaml
from hypothesis import given
from hypothesis import strategies as st
from ray.autoscaler._private.util import prepare_config, validate_config

from cluster.render import CLUSTER_DIR, TARGETS, RayPorts, committed_path, main, render, render_text
from kvserve.config import KVServeConfig
from cluster.helm_values import worker_bounds

RAY_SCHEMA = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
YAMLS = sorted(CLUSTER_DIR.glob("*.yaml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _embedded_config(cluster: dict) -> KVServeConfig:
    """The kvserve config the head writes in head_setup_commands (`echo '<json>' > file`)."""
    (cmd,) = [c for c in cluster["head_setup_commands"] if "config.yaml" in c]
    words = shlex.split(cmd)
    return KVServeConfig.model_validate(json.loads(words[words.index("echo") + 1]))


def test_every_target_is_committed():
    assert {p.stem for p in YAMLS} == set(TARGETS) == {"aws-gpu", "gcp-gpu", "onprem"}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_committed_yaml_is_up_to_date(name):
    assert committed_path(name).read_text() == render_text(TARGETS[name]), "run `python -m cluster.render`"
    assert main(["--check"]) == 0


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_validates_against_rays_schema(path):
    cluster = _load(path)
    if cluster["provider"]["type"] == "local":
        # Ray moves the local provider's top-level min_workers onto its node type before validating.
        cluster = prepare_config(cluster)
    jsonschema.Draft7Validator(RAY_SCHEMA).validate(cluster)
    validate_config(prepare_config(_load(path)))  # Ray's own check, as `ray up` runs it


def test_rays_schema_rejects_a_typo():
    cluster = _load(committed_path("aws-gpu"))
    cluster["head_start_ray_command"] = cluster.pop("head_start_ray_commands")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cluster, RAY_SCHEMA)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_installs_kvserve_and_starts_the_app(path):
    cluster = _load(path)
    target = TARGETS[path.stem]
    assert any(f"kvserve[{target.extra}]" in c for c in cluster["setup_commands"])
    start = cluster["head_start_ray_commands"]
    assert any("ray start --head" in c for c in start)
    assert start[-1].startswith("kvserve deploy --config ~/kvserve/config.yaml")
    assert _embedded_config(cluster) == KVServeConfig.model_validate(target.kvserve)


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_worker_counts_follow_the_autoscaling_section(path):
    target = TARGETS[path.stem]
    prepared = prepare_config(_load(path))
    cfg = KVServeConfig.model_validate(target.kvserve)
    lo, hi = worker_bounds(cfg, target.gpus_per_worker)
    workers = [t for name, t in prepared["available_node_types"].items() if name != prepared["head_node_type"]]
    if not workers:  # local: one node type for head and workers
        workers = list(prepared["available_node_types"].values())
    (wt,) = workers
    assert (wt["min_workers"], wt["max_workers"]) == (lo, hi)


@given(
    enabled=st.booleans(),
    lo=st.integers(0, 6),
    span=st.integers(0, 10),
    fixed=st.integers(1, 12),
)
def test_render_wires_any_replica_range(enabled, lo, span, fixed):
    target = TARGETS["aws-gpu"]
    cfg = KVServeConfig.model_validate(
        {
            **target.kvserve,
            "num_replicas": fixed,
            "autoscaling": {"enabled": enabled, "min_replicas": lo, "max_replicas": max(lo + span, 1)},
        }
    )
    out = render(target, cfg)
    wt = out["available_node_types"]["ray.worker.gpu"]
    want = (lo, max(lo + span, 1)) if enabled else (fixed, fixed)
    # One GPU per worker and per replica: one worker per replica.
    assert (wt["min_workers"], wt["max_workers"]) == tuple(want)
    assert out["max_workers"] == wt["max_workers"]
    assert _embedded_config(out) == cfg


def test_ports_are_all_configurable_for_a_second_cluster_on_one_machine():
    ports = RayPorts(gcs=16379, dashboard=18265, client_server=20001, dashboard_agent_listen=22365, metrics_export=23000)
    out = render(TARGETS["onprem"], ports=ports, deploy_address="127.0.0.1:16379")
    head = " ".join(out["head_start_ray_commands"])
    for flag in ("--port=16379", "--dashboard-port=18265", "--ray-client-server-port=20001",
                 "--dashboard-agent-listen-port=22365", "--metrics-export-port=23000", "--address 127.0.0.1:16379"):
        assert flag in head
    assert out["worker_start_ray_commands"][-1].startswith("ulimit -n 65536; RAY_SERVE_PROXY_USE_GRPC=1 ray start --address=$RAY_HEAD_IP:16379")


def test_cli_renders_a_user_config(tmp_path, capsys):
    cfg_file = tmp_path / "kv.yaml"
    cfg_file.write_text(yaml.safe_dump({"engine": {"device": "gpu"}, "num_replicas": 6, "tenants": {"open_mode": True}}))
    assert main(["gcp-gpu", "--config", str(cfg_file)]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["available_node_types"]["ray.worker.gpu"]["min_workers"] == 6
    assert _embedded_config(out).num_replicas == 6


def test_replica_that_cannot_fit_a_worker_is_rejected():
    target = TARGETS["aws-gpu"]
    cfg = KVServeConfig.model_validate({**target.kvserve, "engine": {**target.kvserve["engine"], "tensor_parallel_size": 2}})
    with pytest.raises(ValueError, match="cannot fit"):
        render(target, cfg)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_ray_start_carries_the_node_env(name):
    """Serve's proxy -> ingress hop runs over gRPC on every node (cluster.serve_config.NODE_ENV)."""
    from cluster.serve_config import node_env_prefix

    cfg = yaml.safe_load(render_text(TARGETS[name]))
    starts = [c for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in cfg[key] if "ray start" in c]
    assert len(starts) == 2 and all(f"{node_env_prefix()} ray start" in c for c in starts)


def test_the_local_launcher_sets_the_node_env():
    from cluster.local import _ray_env
    from cluster.serve_config import NODE_ENV

    env = _ray_env(KVServeConfig.model_validate({"tenants": {"open_mode": True}}))
    assert {k: env[k] for k in NODE_ENV} == NODE_ENV
