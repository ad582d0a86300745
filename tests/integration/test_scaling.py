"""Scale-down without loss: a replica being removed finishes its in-flight streams first."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.integration.conftest import KEYS, MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stream(url: str, prompt: str, out: dict, started: threading.Event) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 120, "ignore_eos": True, "temperature": 0.7,
            "stream": True, "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=300) as r:
            out["status"] = r.status_code
            out["replica"] = r.headers.get("x-kvserve-replica")
            for line in r.iter_lines():
                started.set()
                if line.startswith("data: ") and '"usage"' in line and '"completion_tokens"' in line:
                    import json

                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        out["completion_tokens"] = usage["completion_tokens"]
                if line == "data: [DONE]":
                    out["done"] = True
    except Exception as e:  # recorded, asserted below
        out["error"] = repr(e)
        started.set()


def test_scale_down_drains_in_flight_streams(cluster):
    from cluster.local import deploy

    results: list[dict] = []
    threads: list[threading.Thread] = []

    def launch(n: int) -> None:
        batch = [dict() for _ in range(n)]
        events = [threading.Event() for _ in batch]
        for r, e in zip(batch, events):
            i = len(results)
            results.append(r)
            threads.append(threading.Thread(target=_stream, args=(
                cluster.url, f"Story {i}: once upon a time in city {i * 31},", r, e)))
            threads[-1].start()
        for e in events:
            assert e.wait(120)

    # Four at once spread 2 + 2 (the router books each decision before the replica accepts it).
    # This test is about draining, not routing: should they still share one replica, add up to
    # four more -- 8 = 2 replicas x max_ongoing_requests, so none is ever queued or refused.
    launch(4)
    while len({r.get("replica") for r in results}) < 2 and len(results) < 8:
        launch(1)
    assert len({r.get("replica") for r in results}) == 2, "streams should be in flight on both replicas"

    deploy(cluster.cfg.model_copy(update={"num_replicas": 1}), address=None, timeout_s=300)  # one replica drains
    for t in threads:
        t.join(300)
    assert all(r.get("status") == 200 and r.get("done") and r.get("completion_tokens") == 120 and "error" not in r
               for r in results), results

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(cluster.stats()) != 1:
        time.sleep(1)
    assert httpx.get(cluster.url + "/ready", timeout=10).json()["running_replicas"] == 1
    # A resize is a lightweight update: the survivor is one of the engines that served the streams
    # (not a restarted one, whose KV cache would be empty).
    (survivor,) = {s["replica_id"] for s in cluster.stats()}
    assert survivor in {r["replica"] for r in results}

    # Scale-up with warm caches: a family seen 5 times (over autoscaling.warm_min_requests) within a
    # few seconds reaches the stats board on the ingress's timer, and the replica added next pre-fills it.
    system = " ".join(f"Rule {i}: answer briefly and cite clause {i}." for i in range(12))
    with cluster.client() as c:
        for i in range(5):
            r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 2, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": f"Question {i}?"}]})
            assert r.status_code == 200, r.text
    import ray

    from deployments.stats_board import board

    def hot_on_board() -> list:
        return ray.get(board(cluster.cfg.app_name).get_hot.remote())

    def tenant_a_is_hot(hot: list) -> bool:
        return bool(hot) and hot[0][0].startswith("tenant-a:") and hot[0][2] >= cluster.cfg.autoscaling.warm_min_requests

    # Poll until the ingress's timer has posted it, whatever its period; the deadline is many periods.
    deadline = time.monotonic() + 60
    hot = hot_on_board()
    while not tenant_a_is_hot(hot) and time.monotonic() < deadline:
        time.sleep(0.2)
        hot = hot_on_board()
    assert tenant_a_is_hot(hot), hot

    deploy(cluster.cfg, address=None, timeout_s=600)  # back to two for any later test
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(cluster.stats()) < 2:
        time.sleep(1)
    stats = {s["replica_id"]: s for s in cluster.stats()}
    assert survivor in stats
    (new,) = [s for rid, s in stats.items() if rid != survivor]
    assert new["warmed_prefixes"] >= 1, new
