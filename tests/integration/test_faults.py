"""Faults on the live 2-replica cluster: SIGKILL one replica's vLLM engine process under load, and
the ingress (with it the router and its prefix index). Requests that had produced nothing are
re-sent (none lost), a stream cut mid-way ends with an SSE error event, the router drops the dead
replica, Serve's replacement serves and is routed to by prefix; a restarted ingress routes a
cached prompt back to the replica that holds it. Timings are in `make bench-chaos`, not here."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.ray_procs import engine_core, serve_processes
from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

SYSTEM = "You are a careful assistant for the fault tests. " * 40  # ~400 tokens: several KV blocks


def _stream(cluster, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: status, replica, tokens seen, the error event if one ended it."""
    out = {"status": None, "replica": None, "chunks": 0, "error": None, "done": False}
    with cluster.client() as c, c.stream("POST", "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True}) as r:
        out["status"], out["replica"] = r.status_code, r.headers.get("x-kvserve-replica")
        if r.status_code != 200:
            out["error"] = json.loads(r.read())["error"]
            return out
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out["done"] = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out["error"] = chunk["error"]
                break
            out["chunks"] += 1
    return out


def _complete(cluster, prompt: str) -> tuple[str, int]:
    with cluster.client() as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 200, r.text
    return r.headers["x-kvserve-replica"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 1.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def _ready(cluster) -> bool:
    try:
        return httpx.get(cluster.url + "/ready", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def test_killing_an_engine_under_load_loses_no_request_and_its_replacement_rejoins(cluster):
    app = cluster.cfg.app_name
    _wait(lambda: _ready(cluster), 600, "cluster ready")
    before = serve_processes(app).replicas
    assert len(before) == 2
    # Load: long streams on both replicas, so some are mid-stream and some not started at the kill;
    # 4 in all, what the survivor alone runs at once (the test cluster's max_ongoing_requests), so a
    # re-sent request is never shed as overload.
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_stream, cluster, f"{SYSTEM} Story {i}:", 100) for i in range(3)]
        victim = _wait(lambda: next((s["replica_id"] for s in cluster.stats()
                                     if s["replica_id"] in before and s.get("running", 0) > 0), None),
                       120, "a replica running requests", poll_s=0.2)
        os.kill(engine_core(before[victim]).pid, signal.SIGKILL)
        killed_at = time.time()
        # More requests after the kill: the router must not send them to the dead engine for good.
        futures += [pool.submit(_stream, cluster, f"{SYSTEM} Poem {i}:", 8) for i in range(1)]
        results = [f.result() for f in futures]

    lost = [r for r in results if r["chunks"] == 0 and not r["done"]]
    assert not lost, lost  # nothing that had not started is lost: re-sent to the live replica
    cut = [r for r in results if not r["done"]]
    for r in cut:  # cut mid-stream: an error event, OpenAI's shape, saying why
        assert r["error"] and r["error"]["code"] in ("engine_dead", "replica_lost"), r
        assert r["error"]["type"] == "server_error" and "retry" in r["error"]["message"]
    assert any(r["done"] for r in results)

    # Keep routing until the dead replica is out of the choice: dropped by the router (its stats say
    # engine_dead, or stopped coming) or removed by Serve (its health check failed) -- whichever
    # comes first. Either way, every request meanwhile is answered.
    def out_of_choice():  # type: ignore[no-untyped-def]
        _complete(cluster, f"Trickle {time.monotonic()}: {SYSTEM[:200]}")  # asserts a 200
        drops = httpx.get(cluster.url + "/kvserve/stats", timeout=30).json()["router_drops"]
        if victim in drops:
            return drops[victim]
        return {"reason": "removed by Serve"} if victim not in serve_processes(app).replicas else None

    drop = _wait(out_of_choice, 120, "the dead replica out of the router's choice", poll_s=0.2)
    assert drop["reason"] in ("engine_dead", "silent", "removed by Serve"), drop
    assert drop.get("at", killed_at) >= killed_at - 1

    # Serve replaces the replica (its health check fails); the replacement serves and is routed to
    # by prefix: a prompt it served comes back to it, from its cache.
    new = _wait(lambda: (set(serve_processes(app).replicas) - set(before)) and _ready(cluster), 900,
                "a replacement replica serving")
    new_ids = set(serve_processes(app).replicas) - set(before)
    assert new and new_ids
    served = {}
    for i in range(12):
        prompt = f"Rejoin test {i}. {SYSTEM}"  # its own first block: no replica holds it yet
        replica, _ = _complete(cluster, prompt)
        if replica in new_ids:
            served[prompt] = replica
            break
    assert served, "the replacement replica got none of 12 new prompts"
    (prompt, replica), = served.items()
    again, cached = _complete(cluster, prompt)
    assert again == replica and cached > 0, (again, replica, cached)


def test_a_restarted_ingress_routes_cached_prompts_back_to_their_replica(cluster):
    app = cluster.cfg.app_name
    _wait(lambda: _ready(cluster), 900, "cluster ready")
    homes = {}
    for i in range(4):
        prompt = f"Tenant {i} of the restart test. {SYSTEM}"
        homes[prompt] = _complete(cluster, prompt)[0]
    ingress = serve_processes(app).ingress
    assert len(ingress) == 1
    os.kill(ingress[0], signal.SIGKILL)
    _wait(lambda: (serve_processes(app).ingress not in ([], ingress)) and _ready(cluster), 600,
          "a new ingress serving")
    for prompt, home in homes.items():
        replica, cached = _complete(cluster, prompt)
        assert replica == home and cached > 0, (prompt[-15:], replica, home, cached)
