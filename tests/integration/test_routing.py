"""The prefix-aware router on real engines: KV-event hashes, tenant affinity, dead replicas."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration


def _system(tenant: str) -> str:
    return " ".join(f"{tenant} policy {i}: reply briefly and mention clause {i * 7}." for i in range(55))


def _chat(cluster, tenant: str, question: str):
    raw = cluster.openai().chat.completions.with_raw_response.create(
        model=MODEL, temperature=0, max_tokens=3,
        messages=[{"role": "system", "content": _system(tenant)}, {"role": "user", "content": question}],
    )
    return raw.headers["x-kvserve-replica"], raw.parse().usage


def test_engine_kv_events_match_ingress_block_hashes(cluster):
    """The chained hashes the ingress computes from a prompt equal the ones rebuilt from vLLM's KV events."""
    body = {"model": MODEL, "temperature": 0, "max_tokens": 2,
            "messages": [{"role": "system", "content": _system("hashcheck")}, {"role": "user", "content": "Hi"}]}
    with cluster.client() as c:
        served_by = c.post("/v1/chat/completions", json=body).headers["x-kvserve-replica"]
        deadline = time.monotonic() + 15
        while True:
            dbg = c.post("/kvserve/debug/prefix", json=body).json()
            if dbg["matched_blocks"].get(served_by) == dbg["num_blocks"] or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert dbg["num_blocks"] == dbg["num_prompt_tokens"] // dbg["block_size"] > 20
    assert dbg["matched_blocks"][served_by] == dbg["num_blocks"]
    others = [n for rid, n in dbg["matched_blocks"].items() if rid != served_by]
    assert all(n < dbg["num_blocks"] for n in others)


def test_two_tenants_each_stick_to_one_replica_with_cache_hits(cluster):
    placements: dict[str, set[str]] = {"alpha": set(), "beta": set()}
    cached: dict[str, list[int]] = {"alpha": [], "beta": []}
    for i in range(4):
        for tenant in ("alpha", "beta"):
            replica, usage = _chat(cluster, tenant, f"Question number {i}?")
            placements[tenant].add(replica)
            cached[tenant].append(usage.prompt_tokens_details.cached_tokens)
    assert all(len(p) == 1 for p in placements.values()), placements
    for tenant, hits in cached.items():
        assert all(h > 800 for h in hits[1:]), (tenant, hits)



def test_simultaneous_requests_spread_over_both_replicas(cluster):
    """Four prompts with nothing cached arrive together: the router books each decision at once,
    so the later ones see the earlier ones' load and split 2 + 2 (no herding in the accept window)."""
    import concurrent.futures as cf
    from collections import Counter

    def one(i: int) -> str:
        body = {"model": MODEL, "prompt": f"Note {i}: the river {i * 13}", "max_tokens": 24, "ignore_eos": True}
        with cluster.client() as c:
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.headers["x-kvserve-replica"]

    for _ in range(2):
        with cf.ThreadPoolExecutor(4) as pool:
            placed = Counter(pool.map(one, range(4)))
        assert sorted(placed.values()) == [2, 2], placed

@pytest.mark.slow
def test_killing_a_replica_leaves_routing_working(cluster):
    import ray
    from ray.util.state import list_actors

    _chat(cluster, "gamma", "warm up")
    victim = next(a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000)
                  if a.name and "LLMReplica" in a.name)
    ray.kill(ray.get_actor(victim.name, namespace="serve"), no_restart=True)
    time.sleep(1.0)
    # Every request after the kill succeeds: the dead replica drops out of the index and the queue.
    for i in range(6):
        replica, usage = _chat(cluster, "gamma", f"after kill {i}")
        assert usage.completion_tokens > 0
        assert replica != victim.name.rsplit("#", 1)[-1]
    # Serve replaces the replica; wait so later tests see two again.
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        r = httpx.get(cluster.url + "/ready", timeout=10).json()
        if r.get("running_replicas") == 2 and len(cluster.stats()) == 2:
            break
        time.sleep(2)
    assert httpx.get(cluster.url + "/ready", timeout=10).json()["running_replicas"] == 2
