"""Helm `batchStore`: a PVC on the head pod holds the Batch API's SQLite store, the served config points
batch.db_path into it and pins the ingress (the batch worker) to the head node, as the Python mirror says."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("helm_python", reason="helm-python-sdk (dev extra) renders the chart")

from deployments.app import batch_store_pin  # noqa: E402
from cluster.helm_values import CHART_DIR, HEAD_NODE_RESOURCE, load_values, render_chart, values_to_config  # noqa: E402
from cluster.serve_config import config_from_serve_config  # noqa: E402

VALUES = CHART_DIR / "ci" / "batch-store-values.yaml"


def _objects(values: dict) -> list[dict]:
    return [o for objs in render_chart(values, release="llm").values() for o in objs]


def test_batch_store_pvc_is_mounted_on_the_head_and_configured():
    objs = _objects(yaml.safe_load(VALUES.read_text()))
    (pvc,) = [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == "llm-kvserve-batch"
    assert pvc["spec"]["resources"]["requests"]["storage"] == "20Gi" and pvc["spec"]["storageClassName"] == "standard"
    (rs,) = [o for o in objs if o["kind"] == "RayService"]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert {"name": "batch-store", "persistentVolumeClaim": {"claimName": "llm-kvserve-batch"}} in head["volumes"]
    assert {"name": "batch-store", "mountPath": "/var/lib/kvserve"} in head["containers"][0]["volumeMounts"]
    cfg = config_from_serve_config(yaml.safe_load(rs["spec"]["serveConfigV2"]))
    assert cfg.batch.db_path == "/var/lib/kvserve/batch.sqlite" and cfg.batch.node_resource == HEAD_NODE_RESOURCE
    assert cfg == values_to_config(load_values(VALUES))  # the Python mirror agrees
    assert batch_store_pin(cfg) == {"resources": {HEAD_NODE_RESOURCE: 0.001}}
    # The preset fills what the chart's values leave unset; the chart's explicit max_num_seqs wins.
    assert cfg.engine.scenario == "offline-batch" and cfg.engine.kv_cache_dtype == "fp8"
    assert cfg.engine.max_num_seqs == 256 and cfg.slo.ttft_p90_ms == 1000


def test_no_batch_store_by_default():
    objs = _objects({})
    assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"]
    cfg = values_to_config(load_values())
    assert cfg.batch.db_path is None and batch_store_pin(cfg) == {}
