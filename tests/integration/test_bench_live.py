"""`kvserve bench` against a cluster whose replicas are still starting: it waits, then measures them all."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from typer.testing import CliRunner

from tests.integration.conftest import KEYS

pytestmark = pytest.mark.integration


def test_bench_waits_for_starting_replicas_and_measures_all_of_them(cluster, tmp_path):
    from cluster.local import deploy
    from cli.app import app

    deploy(cluster.cfg.model_copy(update={"num_replicas": 1}), address=None, timeout_s=300)
    deploy(cluster.cfg, address=None, wait=False)  # back to two: the second engine starts now
    # What a user sees while it starts: not ready, and the config a bench redeploys from carries the count
    # asked for, not the one replica that answers so far. (The controller takes the new target a moment
    # after the deploy call returns; the engine takes far longer to start.)
    deadline = time.monotonic() + 60
    while True:
        ready_before = httpx.get(cluster.url + "/ready", timeout=10)
        if ready_before.json().get("target_replicas") == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ready_before.status_code == 503, ready_before.text
    assert ready_before.json()["target_replicas"] == 2
    assert httpx.get(cluster.url + "/kvserve/config", timeout=10).json()["num_replicas"] == 2

    out, records = tmp_path / "out.json", tmp_path / "requests.jsonl"
    result = CliRunner().invoke(app, [
        "bench", "--url", cluster.url, "--api-key", KEYS["tenant-a"], "--tenants", "2", "--system-tokens", "64",
        "--question-tokens", "8", "--output-tokens", "4", "--requests", "8", "--concurrency", "2",
        "--json", str(out), "--requests-jsonl", str(records), "--ready-timeout", "600",
    ])
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())["policies"]["current"]
    assert run["replicas"] == 2 and run["errors"] == 0, run
    # Mean TTFT, outermost first: each layer's clock starts later and stops no later than the one outside it.
    t = {layer: q["mean"] for layer, q in run["ttft_breakdown_ms"].items()}
    assert all(v is not None and v > 0 for v in t.values()), t
    assert t["client"] >= t["ingress"] >= t["engine"] >= t["engine_queue"] + t["engine_prefill"] - 1.0, t
    assert all(q["p50"] is not None for q in run["ttft_breakdown_ms"].values()), run["ttft_breakdown_ms"]
    ready = httpx.get(cluster.url + "/ready", timeout=10).json()
    assert (ready["running_replicas"], ready["target_replicas"]) == (2, 2)
    assert len(records.read_text().splitlines()) == 8
