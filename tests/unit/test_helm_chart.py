"""Render the Helm chart in-process for every example values file and validate what comes out.

Every object is checked against the Kubernetes schemas (kubernetes-validate), the RayService
against KubeRay's own CRD schema (from ../shared), and its serveConfigV2 must carry exactly
the KVServeConfig the values describe.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

helm_python = pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

from tests.shared_files import shared_file  # noqa: E402
from kvserve.config import ConfigError, KVServeConfig  # noqa: E402
from cluster.serve_config import NODE_ENV  # noqa: E402
from cluster.helm_values import (  # noqa: E402
    CHART_DIR,
    load_values,
    render_chart,
    validate_values,
    values_to_config,
    worker_bounds,
)
from cluster.serve_config import IMPORT_PATH, build_serve_config, config_from_serve_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
KUBERAY_CRD = SHARED / "schemas" / "kuberay-v1.7.0-ray.io_rayservices.yaml"
K8S_VERSION = "1.30"  # oldest Kubernetes we document; strict = unknown fields are errors
VALUES_FILES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
CASES = [None, *VALUES_FILES]  # None = the chart defaults alone
IDS = ["defaults", *[p.name.removesuffix("-values.yaml") for p in VALUES_FILES]]


def _values(path: Path | None) -> dict:
    return yaml.safe_load(path.read_text()) if path else {}


@functools.cache
def _render(path: Path | None) -> dict[str, list[dict]]:
    return render_chart(_values(path), release="llm", namespace="serving")


def _objects(path: Path | None) -> list[dict]:
    return [obj for objs in _render(path).values() for obj in objs]


def _one(path: Path | None, kind: str) -> dict:
    found = [o for o in _objects(path) if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@functools.cache
def _rayservice_validator() -> jsonschema.Draft7Validator:
    shared_file("schemas", KUBERAY_CRD.name)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 1 MB of YAML
    crd = yaml.load(KUBERAY_CRD.read_text(), Loader=loader)  # noqa: S506 - a safe loader
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(v1["schema"]["openAPIV3Schema"])


def test_example_values_files_exist():
    names = {p.name for p in VALUES_FILES}
    for expected in ("cpu-dev", "gpu-production", "autoscaling-on", "autoscaling-off", "ingress-on"):
        assert f"{expected}-values.yaml" in names


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_every_builtin_object_validates_against_kubernetes_schemas(path):
    checked = 0
    for obj in _objects(path):
        if obj["apiVersion"] in ("ray.io/v1", "monitoring.coreos.com/v1"):
            continue  # CRDs: RayService checked against KubeRay's schema below
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 1  # at least the Service


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_rayservice_validates_against_kuberay_crd(path):
    rs = _one(path, "RayService")
    _rayservice_validator().validate(rs)
    # The pod templates inside are plain PodTemplateSpecs: hold them to the strict k8s schema too.
    cluster = rs["spec"]["rayClusterConfig"]
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for tpl in templates:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x", **tpl.get("metadata", {})}, "spec": tpl["spec"]}
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_kuberay_schema_actually_rejects_a_broken_rayservice():
    rs = _one(None, "RayService")
    broken = yaml.safe_load(yaml.safe_dump(rs))
    del broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["groupName"]
    with pytest.raises(jsonschema.ValidationError, match="groupName"):
        _rayservice_validator().validate(broken)


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_serve_config_round_trips_into_the_values_config(path):
    rs = _one(path, "RayService")
    serve_cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    expected = values_to_config(load_values(*([path] if path else [])))
    assert config_from_serve_config(serve_cfg) == expected
    # Same layout as build_serve_config (what `kvserve deploy` submits), apart from defaults.
    built = build_serve_config(expected)
    assert serve_cfg["http_options"] == built["http_options"]
    (app,) = serve_cfg["applications"]
    (built_app,) = built["applications"]
    assert {k: app[k] for k in ("name", "route_prefix", "import_path")} == {
        k: built_app[k] for k in ("name", "route_prefix", "import_path")
    }
    assert app["import_path"] == IMPORT_PATH
    assert config_from_serve_config(built) == expected
    assert app.get("deployments") == built_app.get("deployments")  # the size overrides agree


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_worker_group_matches_config(path):
    values = load_values(*([path] if path else []))
    cfg = values_to_config(values)
    cluster = _one(path, "RayService")["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    assert (group["minReplicas"], group["maxReplicas"]) == worker_bounds(cfg, values["worker"]["gpus"])
    assert cluster["enableInTreeAutoscaling"] is cfg.autoscaling.enabled
    (container,) = group["template"]["spec"]["containers"]
    gpus = container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
    if cfg.engine.device == "gpu":
        assert gpus == values["worker"]["gpus"]
        assert group["template"]["spec"]["tolerations"]
    else:
        assert gpus is None


@pytest.mark.parametrize("path", CASES, ids=IDS)
def test_every_ray_container_gets_the_node_env(path):
    """Serve's proxy -> ingress hop runs over gRPC on every node (cluster.serve_config.NODE_ENV)."""
    cluster = _one(path, "RayService")["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        (container,) = pod["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert {k: env.get(k) for k in NODE_ENV} == NODE_ENV


def test_autoscaling_on_sizes_worker_pods_from_replica_range():
    cluster = _one(CHART_DIR / "ci" / "autoscaling-on-values.yaml", "RayService")["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    # 1..8 replicas, 2 GPUs per pod, 1 GPU per replica -> 1..4 pods.
    assert (group["minReplicas"], group["maxReplicas"]) == (1, 4)
    assert cluster["autoscalerOptions"]["upscalingMode"] == "Aggressive"


def test_ingress_only_when_enabled():
    assert not [o for o in _objects(None) if o["kind"] == "Ingress"]
    ing = _one(CHART_DIR / "ci" / "ingress-on-values.yaml", "Ingress")
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == _one(None, "Service")["metadata"]["name"]


def test_monitors_and_dashboard_slot_render_when_enabled():
    prod = CHART_DIR / "ci" / "gpu-production-values.yaml"
    kinds = {o["kind"] for o in _objects(prod)}
    assert {"ServiceMonitor", "PodMonitor", "ConfigMap"} <= kinds
    assert not {"ServiceMonitor", "PodMonitor", "ConfigMap"} & {o["kind"] for o in _objects(None)}
    pm = _one(prod, "PodMonitor")
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_api_key_secret_is_mounted_not_rendered_by_default():
    assert not [o for o in _objects(None) if o["kind"] == "Secret"]
    rs = _one(None, "RayService")
    cfg = config_from_serve_config(rs["spec"]["serveConfigV2"])
    assert cfg.tenants.keys_file == "/etc/kvserve/keys/keys.yaml" and not cfg.tenants.open_mode
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "api-keys", "secret": {"secretName": "kvserve-api-keys", "defaultMode": 0o440}} in head["volumes"]


def test_created_secret_holds_only_hashes():
    secret = _one(CHART_DIR / "ci" / "autoscaling-on-values.yaml", "Secret")
    entries = yaml.safe_load(secret["stringData"]["keys.yaml"])
    assert entries and all(set(e) == {"tenant", "key_sha256"} and len(e["key_sha256"]) == 64 for e in entries)


# ---------------------------------------------------------------- bad values


BAD_VALUES = [
    ({"kvserve": {"num_replicas": -1}}, "/kvserve/num_replicas"),
    ({"kvserve": {"router": {"policy": "fastest"}}}, "/kvserve/router/policy"),
    ({"kvserve": {"engine": {"device": "tpu"}}}, "/kvserve/engine/device"),
    ({"kvserve": {"modle": {"source": "x"}}}, "modle"),
    ({"kvserve": {"tenants": {"keys": [{"tenant": "a", "key": "sk-clear-text"}]}}}, "/kvserve/tenants/keys/0"),
    ({"worker": {"gpus": -2}}, "/worker/gpus"),
    ({"apiKeySecret": {"create": True, "entries": [{"tenant": "a", "key_sha256": "not-a-hash"}]}}, "key_sha256"),
    ({"ingress": {"enabled": "yes"}}, "/ingress/enabled"),
]


@pytest.mark.parametrize(("values", "field"), BAD_VALUES, ids=[f for _, f in BAD_VALUES])
def test_helm_rejects_invalid_values_naming_the_field(values, field):
    with pytest.raises(helm_python.HelmValuesError) as err:
        render_chart(values)
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kvserve": {"autoscaling": {"min_replicas": 5, "max_replicas": 2}}}, "min_replicas must be <="),
        ({"apiKeySecret": {"name": None}}, "no API keys configured"),
        ({"worker": {"minReplicas": 3, "maxReplicas": 1}}, "worker.minReplicas must be <="),
        ({"kvserve": {"autoscaling": {"overload_memory_s": 900, "overload_memory_max_s": 600}}},
         "overload_memory_s must be <="),
    ],
)
def test_chart_rejects_cross_field_errors_the_schema_cannot_express(values, message):
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render_chart(values)


@pytest.mark.parametrize(("values", "field"), BAD_VALUES[:4], ids=[f for _, f in BAD_VALUES[:4]])
def test_python_validation_agrees_and_names_the_field(values, field):
    with pytest.raises(ConfigError) as err:
        validate_values(load_values_from(values))
    dotted = field.strip("/").replace("/", ".")
    assert dotted.split(".")[-1] in str(err.value)


def load_values_from(over: dict) -> dict:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(over, f)
        f.flush()
        return load_values(f.name)


def test_service_monitor_scrapes_the_ingress_metrics_on_the_head_alone():
    """kvserve_* series come from the ingress's /metrics on the Serve port; every proxy answers it,
    so only the head is scraped (otherwise per-pod sums would count each request once per proxy)."""
    prod = CHART_DIR / "ci" / "gpu-production-values.yaml"
    objs = _objects(prod)
    svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-ingress-metrics"))
    assert svc["spec"]["selector"]["ray.io/node-type"] == "head"
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == ["serve"]
    sm = _one(prod, "ServiceMonitor")
    assert {"port": "serve", "path": "/metrics"}.items() <= next(
        e for e in sm["spec"]["endpoints"] if e["port"] == "serve").items()
    components = {o["metadata"]["labels"].get("app.kubernetes.io/component") for o in objs if o["kind"] == "Service"}
    (expr,) = sm["spec"]["selector"]["matchExpressions"]
    assert {"metrics", "ingress-metrics"} <= components and set(expr["values"]) == {"metrics", "ingress-metrics"}


def test_chart_resizing_keeps_the_serve_code_version():
    """Changing the fixed replica count in the values must be a lightweight Serve update (no
    engine restarts), exactly as for `build_serve_config`; other engine settings restart."""
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    def version(values):
        (rs,) = [o for objs in render_chart(values).values() for o in objs if o["kind"] == "RayService"]
        (app,) = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"]
        return get_app_code_version(ServeApplicationSchema.model_validate(app)), app

    v2, app2 = version({"kvserve": {"num_replicas": 2}})
    v5, app5 = version({"kvserve": {"num_replicas": 5}})
    assert v2 == v5 and app2["deployments"] != app5["deployments"]
    built = build_serve_config(values_to_config(load_values_from({"kvserve": {"num_replicas": 5}})))
    assert app5["deployments"] == built["applications"][0]["deployments"]
    assert version({"kvserve": {"num_replicas": 5, "model": {"max_model_len": 4096}}})[0] != v5


def test_chart_resizing_changes_only_fields_kuberay_updates_in_place():
    """KubeRay rolls out a new RayCluster when the cluster spec's hash changes, but leaves the worker
    groups' replicas / minReplicas / maxReplicas out of that hash: a resize must touch nothing else."""

    def cluster_spec(n):
        (rs,) = [o for objs in render_chart({"kvserve": {"num_replicas": n}}).values() for o in objs
                 if o["kind"] == "RayService"]
        spec = rs["spec"]["rayClusterConfig"]
        sizes = [(g["replicas"], g["minReplicas"], g["maxReplicas"]) for g in spec["workerGroupSpecs"]]
        for g in spec["workerGroupSpecs"]:
            for k in ("replicas", "minReplicas", "maxReplicas"):
                g.pop(k)
        return spec, sizes

    (spec2, sizes2), (spec5, sizes5) = cluster_spec(2), cluster_spec(5)
    assert spec2 == spec5 and sizes2 != sizes5
