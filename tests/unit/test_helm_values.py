"""values.yaml <-> KVServeConfig, the generated values.schema.json, and the worker sizing rule."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.config import KVServeConfig
from cluster.helm_values import (
    CHART_DIR,
    SCHEMA_PATH,
    config_to_values,
    effective_kvserve,
    helm_merge,
    load_values,
    render_chart,
    values_schema,
    values_schema_text,
    values_to_config,
    worker_bounds,
)

VALUES_FILES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))


def test_committed_schema_is_up_to_date():
    assert SCHEMA_PATH.read_text() == values_schema_text(), (
        "helm/kvserve/values.schema.json is stale: run `python -m cluster.helm_values schema > "
        "helm/kvserve/values.schema.json`"
    )


def test_schema_is_draft07_and_covers_every_config_knob():
    schema = values_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    assert "$defs" not in json.dumps(schema)
    kv = schema["definitions"]["KVServeConfig"]["properties"]
    assert set(kv) == set(KVServeConfig.model_fields)


@pytest.mark.parametrize("path", [None, *VALUES_FILES], ids=lambda p: p.name if p else "defaults")
def test_values_files_validate_against_the_schema(path):
    merged = load_values(*([path] if path else []))
    jsonschema.Draft7Validator(values_schema()).validate(merged)
    values_to_config(merged)  # and against the pydantic model, cross-field rules included


@pytest.mark.parametrize("path", VALUES_FILES, ids=lambda p: p.name)
def test_load_values_merges_like_helm(path):
    helm_python = pytest.importorskip("helm_python")
    with helm_python.Chart.load(CHART_DIR) as chart:
        helm_merged = chart.merge_values(yaml.safe_load(path.read_text()))
    assert load_values(path) == helm_merged


def test_schema_rejects_clear_text_key_fields():
    bad = load_values()
    bad["kvserve"]["tenants"] = {"keys": [{"tenant": "a", "key": "sk-live-123"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, values_schema())


def test_key_secret_is_wired_only_when_no_key_source_is_set():
    secret = {"name": "s", "key": "k.yaml", "mountPath": "/m"}
    assert effective_kvserve({"kvserve": {}, "apiKeySecret": secret})["tenants"] == {"keys_file": "/m/k.yaml"}
    own = {"tenants": {"keys_file": "/elsewhere"}}
    assert effective_kvserve({"kvserve": own, "apiKeySecret": secret}) == own
    dev = {"tenants": {"open_mode": True}}
    assert effective_kvserve({"kvserve": dev, "apiKeySecret": secret}) == dev
    assert "tenants" not in effective_kvserve({"kvserve": {}, "apiKeySecret": {"name": None}})


def test_config_to_values_round_trips():
    cfg = KVServeConfig.model_validate(
        {"model": {"source": "org/model"}, "engine": {"device": "gpu"}, "tenants": {"keys_file": "/k"}}
    )
    values = config_to_values(cfg, {"apiKeySecret": {"name": None}})
    assert values_to_config(load_values() | values) == cfg


@st.composite
def sized_configs(draw):
    device = draw(st.sampled_from(["cpu", "gpu"]))
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    lo = draw(st.integers(0, 12))
    hi = draw(st.integers(max(lo, 1), 24))
    kv = {
        "engine": {"device": device, "tensor_parallel_size": tp},
        "num_replicas": draw(st.integers(1, 16)),
        "autoscaling": {"enabled": draw(st.booleans()), "min_replicas": lo, "max_replicas": hi},
        "tenants": {"open_mode": True, "allow_open_on_network": True},  # the chart binds 0.0.0.0
    }
    return kv, draw(st.integers(0, 8))


@given(sized_configs())
def test_worker_bounds_hold_every_replica(case):
    kv, gpus = case
    cfg = KVServeConfig.model_validate(kv)
    if cfg.engine.device == "gpu" and gpus < cfg.engine.tensor_parallel_size:
        with pytest.raises(ValueError, match="cannot fit"):
            worker_bounds(cfg, gpus)
        return
    lo, hi = worker_bounds(cfg, gpus)
    want_lo, want_hi = (
        (cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas)
        if cfg.autoscaling.enabled
        else (cfg.num_replicas, cfg.num_replicas)
    )
    per = gpus // cfg.engine.tensor_parallel_size if cfg.engine.device == "gpu" else 1
    # Enough workers for the replicas, and not one more than needed.
    assert lo * per >= want_lo and (lo == 0 or (lo - 1) * per < want_lo)
    assert hi * per >= want_hi and (hi - 1) * per < want_hi
    assert lo <= hi


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sized_configs())
def test_chart_sizes_workers_like_python(case):
    helm_python = pytest.importorskip("helm_python")
    kv, gpus = case
    cfg = values_to_config(helm_merge(load_values(), {"kvserve": kv, "worker": {"gpus": gpus}}))
    try:
        want = worker_bounds(cfg, gpus)
    except ValueError:
        with pytest.raises(helm_python.HelmRenderError, match="cannot fit"):
            render_chart({"kvserve": kv, "worker": {"gpus": gpus}})
        return
    docs = render_chart({"kvserve": kv, "worker": {"gpus": gpus}})
    (rs,) = docs["kvserve/templates/rayservice.yaml"]
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == want
