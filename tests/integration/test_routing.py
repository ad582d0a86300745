"""The prefix-aware router on real engines: KV-event hashes, tenant affinity, dead replicas."""

from __future__ import annotations

import time
from pathlib import Path

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
    """Four prompts with nothing cached, all in flight together: the router books each decision at
    once, so the later ones see the earlier ones' load and split 2 + 2 (no herding in the accept
    window). Long streams held open until all four are placed keep them in flight together however
    slowly the machine starts them (short requests could finish before the last one is routed)."""
    import concurrent.futures as cf
    import threading
    from collections import Counter

    for round_ in range(2):
        start, placed_all = threading.Barrier(4), threading.Barrier(4)

        def one(i: int) -> str:
            body = {"model": MODEL, "prompt": f"Note {round_}.{i}: the river {i * 13}", "max_tokens": 400,
                    "ignore_eos": True, "stream": True}
            with cluster.client() as c:
                start.wait(timeout=60)
                with c.stream("POST", "/v1/completions", json=body) as r:  # headers come with the first token
                    assert r.status_code == 200, r.read()
                    placed_all.wait(timeout=120)  # closing the stream then aborts the rest
                    return r.headers["x-kvserve-replica"]

        with cf.ThreadPoolExecutor(4) as pool:
            placed = Counter(pool.map(one, range(4)))
        assert sorted(placed.values()) == [2, 2], placed


def test_replica_reports_its_prefill_backlog_in_tokens(cluster):
    """While a cold ~1,500-token prompt prefills (seconds on CPU), its replica reports that work to
    the routers (`queued_prefill_tokens`); once the first token is out the backlog is gone.
    Non-streaming on purpose: the backlog must clear at the engine's first output, not at the response."""
    import threading

    prompt = " ".join(f"ledger line {i} records parcel {i * 31} for depot {i % 17}." for i in range(100))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
    seen: list[int] = []
    status: list[int] = []
    done = threading.Event()

    def send() -> None:
        try:
            with cluster.client() as c:
                status.append(c.post("/v1/completions", json=body).status_code)
        finally:
            done.set()

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 120
    while not done.is_set() and time.monotonic() < deadline:
        seen.append(max(int(s.get("queued_prefill_tokens", 0)) for s in cluster.stats()))
        time.sleep(0.1)
    sender.join(timeout=5)
    assert status == [200], status
    assert max(seen) > 1000, seen
    deadline = time.monotonic() + 15  # stats are posted about once a second
    while max(int(s.get("queued_prefill_tokens", 0)) for s in cluster.stats()) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert all(int(s.get("queued_prefill_tokens", -1)) == 0 for s in cluster.stats())


def test_replicas_report_their_kv_capacity_for_footprint_packing(cluster):
    """The router packs prefix families by each replica's KV capacity: the figure must be the engine's own
    block count x block size, i.e. the cache budget / (bytes one token's K and V take in every layer)."""
    import json

    from kvserve.model import resolve_model_path

    m = json.loads((Path(resolve_model_path(cluster.cfg.model)) / "config.json").read_text())
    head_dim = m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"]
    bytes_per_token = 2 * m["num_hidden_layers"] * m["num_key_value_heads"] * head_dim * 4  # K+V, float32
    bs = cluster.cfg.engine.block_size
    want = int(cluster.cfg.engine.kv_cache_gib * 2**30 // bytes_per_token) // bs * bs
    stats = cluster.stats()
    assert len(stats) == 2
    assert [s["kv_capacity_tokens"] for s in stats] == [want, want]


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


def test_tenants_do_not_share_cached_blocks(cluster):
    """Cache isolation (tenants.cache_isolation: tenant, the default): the same long prompt hits the
    prefix cache for the tenant that sent it and for nobody else, on whichever replica it lands."""

    def cached(tenant: str) -> int:
        usage = cluster.openai(tenant).completions.create(
            model=MODEL, prompt=_system("isolation-probe") + " Answer:", max_tokens=1, temperature=0).usage
        return usage.prompt_tokens_details.cached_tokens or 0

    first_a, again_a, first_b = cached("tenant-a"), cached("tenant-a"), cached("tenant-b")
    assert first_a == 0 and again_a > 800, (first_a, again_a)
    assert first_b == 0, first_b
    assert cached("tenant-b") > 800  # within tenant-b, sharing still works
