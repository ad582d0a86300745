"""Helm values <-> KVServeConfig, and the chart's values.schema.json generated from the pydantic models.

The chart's `kvserve:` section *is* a KVServeConfig; the other sections (image, head,
worker, ingress, ...) are chart-only and modelled here, so one pydantic model
validates a whole values file and produces the JSON schema Helm enforces.

    python -m cluster.helm_values schema > helm/kvserve/values.schema.json
    python -m cluster.helm_values check my-values.yaml      # validate like `helm install` would
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvserve.config import ConfigError, KVServeConfig, deep_merge, format_validation_error, serving_problem

DRAFT_07 = "http://json-schema.org/draft-07/schema#"
CHART_DIR = Path(__file__).resolve().parents[1] / "helm" / "kvserve"
SCHEMA_PATH = CHART_DIR / "values.schema.json"
# Where the chart mounts the tenant-key Secret (also the default keys_file it injects).
DEFAULT_KEYS_MOUNT = "/etc/kvserve/keys"
DEFAULT_BATCH_MOUNT = "/var/lib/kvserve"
HEAD_NODE_RESOURCE = "node:__internal_head__"  # Ray gives the head node this resource


class _Values(BaseModel):
    model_config = ConfigDict(extra="forbid")


K8sObject = dict[str, Any]  # passed through to Kubernetes verbatim (validated by k8s, not us)


class ImageValues(_Values):
    repository: str = Field("kvserve/kvserve", description="Image with kvserve installed (see docs/DEPLOY.md).")
    tag: str | None = Field(None, description="Defaults to the chart's appVersion.")
    pullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    pullSecrets: list[K8sObject] = Field(default_factory=list)


class PodValues(_Values):
    resources: K8sObject = Field(default_factory=dict)
    rayStartParams: dict[str, str] = Field(default_factory=dict, description="Extra `ray start` flags.")
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[K8sObject] = Field(default_factory=list)
    affinity: K8sObject = Field(default_factory=dict)
    env: list[K8sObject] = Field(default_factory=list)


class WorkerValues(PodValues):
    groupName: str = Field("gpu", pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    gpus: int = Field(1, ge=0, description="nvidia.com/gpu per worker pod (GPU device only).")
    minReplicas: int | None = Field(None, ge=0, description="Override; default derived from kvserve replicas.")
    maxReplicas: int | None = Field(None, ge=0, description="Override; default derived from kvserve replicas.")


class AutoscalerValues(_Values):
    idleTimeoutSeconds: int = Field(60, ge=0)
    upscalingMode: Literal["Default", "Aggressive", "Conservative"] = "Default"


class ServiceValues(_Values):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(80, ge=1, le=65535)
    annotations: dict[str, str] = Field(default_factory=dict)


class IngressValues(_Values):
    enabled: bool = False
    className: str | None = None
    host: str | None = None
    path: str = "/"
    annotations: dict[str, str] = Field(default_factory=dict)
    tls: list[K8sObject] = Field(default_factory=list)


class ApiKeyEntry(_Values):
    tenant: str = Field(..., min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    key_sha256: str = Field(..., pattern=r"^[0-9a-f]{64}$")


class ApiKeySecretValues(_Values):
    name: str | None = Field(
        "kvserve-api-keys", description="Existing Secret holding the tenants keys file; null = none mounted."
    )
    key: str = Field("keys.yaml", description="Data key of the keys file in the Secret.")
    mountPath: str = DEFAULT_KEYS_MOUNT
    create: bool = Field(False, description="Render the Secret from `entries` (sha256 hashes only, never keys).")
    entries: list[ApiKeyEntry] = Field(default_factory=list)


class MonitorValues(_Values):
    enabled: bool = False
    interval: str = "15s"
    labels: dict[str, str] = Field(default_factory=dict)


class DashboardValues(_Values):
    enabled: bool = False
    labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})


class BatchStoreValues(_Values):
    enabled: bool = Field(False, description="A PersistentVolumeClaim on the head pod for the Batch API's SQLite "
                          "store (kvserve.batch.db_path points into it; the ingress is pinned to the head node).")
    size: str = "10Gi"
    storageClassName: str | None = None
    mountPath: str = DEFAULT_BATCH_MOUNT


class ServeValues(_Values):
    runtimeEnv: K8sObject = Field(default_factory=dict, description="Ray runtime_env of the Serve application.")


class ChartValues(_Values):
    """A whole values file. `kvserve` is the one config; everything else is chart plumbing."""

    kvserve: KVServeConfig = Field(default_factory=KVServeConfig)
    image: ImageValues = Field(default_factory=ImageValues)
    rayVersion: str = "2.60.0"
    head: PodValues = Field(default_factory=PodValues)
    worker: WorkerValues = Field(default_factory=WorkerValues)
    autoscaler: AutoscalerValues = Field(default_factory=AutoscalerValues)
    service: ServiceValues = Field(default_factory=ServiceValues)
    ingress: IngressValues = Field(default_factory=IngressValues)
    apiKeySecret: ApiKeySecretValues = Field(default_factory=ApiKeySecretValues)
    serviceMonitor: MonitorValues = Field(default_factory=MonitorValues)
    podMonitor: MonitorValues = Field(default_factory=MonitorValues)
    grafanaDashboard: DashboardValues = Field(default_factory=DashboardValues)
    serve: ServeValues = Field(default_factory=ServeValues)
    batchStore: BatchStoreValues = Field(default_factory=BatchStoreValues)
    podLabels: dict[str, str] = Field(default_factory=dict)
    podAnnotations: dict[str, str] = Field(default_factory=dict)
    nameOverride: str | None = None
    fullnameOverride: str | None = None
    # Helm passes `global` to every chart; accept it so umbrella charts work.
    global_: K8sObject | None = Field(None, alias="global")


# ---------------------------------------------------------------- schema


def _to_draft07(node: Any) -> Any:
    """Pydantic emits 2020-12 (`$defs`); Helm 3's validator wants draft-07 (`definitions`)."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "title":
                continue  # noise in a values schema; descriptions carry the meaning
            if k == "$ref" and isinstance(v, str):
                v = v.replace("#/$defs/", "#/definitions/")
            out["definitions" if k == "$defs" else k] = _to_draft07(v)
        return out
    if isinstance(node, list):
        return [_to_draft07(v) for v in node]
    return node


def values_schema() -> dict[str, Any]:
    schema = _to_draft07(ChartValues.model_json_schema(by_alias=True))
    return {"$schema": DRAFT_07, **schema}


def values_schema_text() -> str:
    return json.dumps(values_schema(), indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- values <-> config


def validate_values(values: dict[str, Any]) -> ChartValues:
    """Validate a (merged) values dict; ConfigError names each offending field."""
    # Validate the section as the chart renders it (key Secret already wired into tenants).
    try:
        chart = ChartValues.model_validate({**values, "kvserve": effective_kvserve(values)})
    except ValidationError as err:
        raise ConfigError(format_validation_error(err).replace("invalid kvserve config", "invalid Helm values")) from None
    problem = serving_problem(chart.kvserve)  # a release serves: the app would refuse it at start
    if problem:
        raise ConfigError(f"invalid Helm values: kvserve: {problem}")
    return chart


def load_values(*paths: str | Path, chart_dir: Path = CHART_DIR) -> dict[str, Any]:
    """Chart defaults deep-merged with values files, like `helm install -f a -f b` (nulls delete keys)."""
    merged = _drop_nulls(yaml.safe_load((chart_dir / "values.yaml").read_text()) or {})
    for p in paths:
        merged = helm_merge(merged, yaml.safe_load(Path(p).read_text()) or {})
    return merged


def _drop_nulls(d: dict) -> dict:
    # Helm drops null-valued keys from a chart's defaults too (null means "unset").
    return {k: _drop_nulls(v) if isinstance(v, dict) else v for k, v in d.items() if v is not None}


def helm_merge(base: dict, over: dict) -> dict:
    """Deep merge as Helm coalesces values: maps merge, lists and scalars replace, null deletes."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = helm_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def effective_kvserve(values: dict[str, Any]) -> dict[str, Any]:
    """The `kvserve` section the chart renders into serveConfigV2 (mirrors templates/_helpers.tpl).

    When a key Secret is mounted and no key source is set, the chart points
    `tenants.keys_file` at the mounted file. With batchStore enabled, batch.db_path lies on its
    volume and the ingress (the batch worker) is pinned to the head pod that mounts it.
    """
    section = copy.deepcopy(values.get("kvserve") or {})
    secret = values.get("apiKeySecret") or {}
    keys_file = f"{secret.get('mountPath', DEFAULT_KEYS_MOUNT)}/{secret.get('key', 'keys.yaml')}"
    if "tenants" in section:
        tenants = dict(section["tenants"] or {})
        if secret.get("name") and not (tenants.get("keys") or tenants.get("keys_file") or tenants.get("open_mode")):
            section["tenants"] = {**tenants, "keys_file": keys_file}
    elif secret.get("name"):
        section["tenants"] = {"keys_file": keys_file}
    store = values.get("batchStore") or {}
    if store.get("enabled"):
        batch = dict(section.get("batch") or {})
        batch.setdefault("db_path", f"{store.get('mountPath', DEFAULT_BATCH_MOUNT)}/batch.sqlite")
        batch.setdefault("node_resource", HEAD_NODE_RESOURCE)
        section["batch"] = batch
    return section


def values_to_config(values: dict[str, Any]) -> KVServeConfig:
    """The KVServeConfig a release with these (merged) values serves."""
    return validate_values(values).kvserve


def config_to_values(cfg: KVServeConfig, chart: dict[str, Any] | None = None) -> dict[str, Any]:
    """A values dict whose `kvserve` section is `cfg` (only fields that differ from defaults)."""
    return deep_merge(chart or {}, {"kvserve": cfg.model_dump(mode="json", exclude_defaults=True)})


def replicas_per_worker(cfg: KVServeConfig, gpus_per_worker: int) -> int:
    """How many Serve replicas fit on one worker node (GPU: by GPUs; CPU: one per worker)."""
    if cfg.engine.device != "gpu":
        return 1
    tp = cfg.engine.tensor_parallel_size
    if gpus_per_worker < tp:
        raise ValueError(f"worker.gpus ({gpus_per_worker}) < kvserve.engine.tensor_parallel_size ({tp}): a replica cannot fit")
    return gpus_per_worker // tp


def worker_bounds(cfg: KVServeConfig, gpus_per_worker: int) -> tuple[int, int]:
    """(min, max) worker nodes that hold the replica range of `cfg` (fixed count when autoscaling is off)."""
    per = replicas_per_worker(cfg, gpus_per_worker)
    if cfg.autoscaling.enabled:
        lo, hi = cfg.autoscaling.min_replicas, cfg.autoscaling.max_replicas
    else:
        lo = hi = cfg.num_replicas
    return math.ceil(lo / per), math.ceil(hi / per)


def render_chart(
    values: dict[str, Any] | None = None, release: str = "kvserve", namespace: str = "default", chart_dir: Path = CHART_DIR
) -> dict[str, list[dict[str, Any]]]:
    """Render the chart offline (helm-python-sdk, the `dev` extra): template path -> its objects.

    Raises helm_python.HelmValuesError (schema) / HelmRenderError (template `fail`) on bad values.
    """
    import helm_python  # dev-only dependency: ships Helm as a native library

    with helm_python.Chart.load(chart_dir) as chart:
        rendered = chart.render(values or {}, name=release, namespace=namespace, is_install=True)
    return {
        path: [doc for doc in yaml.safe_load_all(text) if doc]
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
    }


def _main(argv: list[str]) -> int:
    if argv[:1] == ["schema"]:
        sys.stdout.write(values_schema_text())
        return 0
    if argv[:1] == ["check"]:
        try:
            cfg = values_to_config(load_values(*argv[1:]))
        except ConfigError as err:
            print(err, file=sys.stderr)
            return 1
        print(f"ok: {cfg.model.name}, {cfg.engine.device}, router={cfg.router.policy}")
        return 0
    if argv[:1] == ["render"]:
        docs = render_chart(load_values(*argv[1:]))
        sys.stdout.write(yaml.safe_dump_all([d for objs in docs.values() for d in objs], sort_keys=False))
        return 0
    print("usage: python -m cluster.helm_values schema | check [values.yaml ...] | render [values.yaml ...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
