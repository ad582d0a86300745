"""Microbenchmark: per-decision latency of the kvserve routing core (rank + on_routed).

Setup mirrors the issues' targets: R replicas each holding B cached blocks, made
of realistic overlapping prefix chains (tenants' shared system prompts, then
per-conversation histories), and requests of ~64 blocks that mostly extend a
cached conversation, with the simulator's load and footprint state (`run`).

    kvserve bench micro --replicas 1000 --blocks 10000
    python -m bench.router_micro --replicas 64 --blocks 10000 --decisions 5000

Targets: p99 <= 1 ms at 64 replicas (issue 3) and at 1,000 (issue 26).
"""

from __future__ import annotations

import gc
import json
import math
import random
import statistics
import time

import typer

from kvserve.config import RouterConfig
from router.base import ReplicaLoad, RouteRequest
from router.block_hash import chain_ids
from router.policies.kvserve import PrefixCostRouter

SYSTEM_BLOCKS = 24  # a tenant's shared system prompt, in blocks
CONVERSATION_BLOCKS = 32  # history beyond the system prompt
NEW_BLOCKS = 8  # the turn being sent
BLOCK_TOKENS = 16


def _build_cache(
    replicas: int, blocks: int, rng: random.Random
) -> tuple[dict[str, list[int]], list[list[int]], list[str]]:
    """Per-replica cached hash sets, the cached conversations (block-id lists) and the replica of each."""
    tenants = max(replicas * 2, 8)
    system = [[rng.getrandbits(48) for _ in range(SYSTEM_BLOCKS)] for _ in range(tenants)]
    cache: dict[str, list[int]] = {}
    conversations: list[list[int]] = []
    placed_on: list[str] = []
    for i in range(replicas):
        rid = f"replica-{i}"
        held: set[int] = set()
        # Each replica is "home" to a few tenants; prefixes overlap between conversations of a tenant.
        homes = [system[(i * 2 + k) % tenants] for k in range(3)]
        while len(held) < blocks:
            ids = rng.choice(homes) + [rng.getrandbits(48) for _ in range(CONVERSATION_BLOCKS)]
            conversations.append(ids)
            placed_on.append(rid)
            held.update(chain_ids(ids))
        cache[rid] = list(held)  # whole conversations only (>= blocks), so chains have no holes
    return cache, conversations, placed_on


def run(
    replicas: int = 64,
    blocks: int = 10_000,
    decisions: int = 5_000,
    seed: int = 0,
    gc_freeze: bool = False,
    sample: int | None | str = "default",
    warmup: int = 1_000,
) -> dict:
    """Time `decisions` routing decisions; returns latency percentiles in ms.

    The router state is the simulator's: replica loads in one mapping (replica id ->
    `ReplicaLoad`, refreshed as stats arrive) that the policy reads per candidate,
    families recorded on every replica (the footprint charge has work to do), and
    `warmup` untimed decisions first, so homes, in-flight and speculative entries
    are in steady state. Timed per decision: `rank`, `on_routed` and refreshing the
    chosen replica's load entry, as the simulator's `_route` does.

    `sample`: `router.sample_replicas` (None: score every replica; "default": the config's).
    The index holds ~1M small containers per 64 replicas, so a full (gen-2) garbage
    collection costs ~100-200 ms and shows up as `max_ms`; `gc_freeze` moves the
    prebuilt index out of the collector's reach (what a long-lived router process can
    do after loading its first snapshots).
    """
    rng = random.Random(seed)
    cache, conversations, homes = _build_cache(replicas, blocks, rng)
    cfg = RouterConfig() if sample == "default" else RouterConfig(sample_replicas=sample)
    policy = PrefixCostRouter(cfg.params(), seed=seed, block_size=BLOCK_TOKENS)
    for rid, held in cache.items():
        policy.on_cache_snapshot(rid, held, now=0.0)
    ids = sorted(cache)
    capacity = blocks * BLOCK_TOKENS
    for conv, rid in zip(conversations, homes):  # families live on replicas: the footprint charge has work
        policy.footprints.record(chain_ids(conv[:2])[1], rid, len(conv) * BLOCK_TOKENS, 0.0)

    def fresh_load(rid: str, ongoing: int) -> ReplicaLoad:
        return ReplicaLoad(rid, ongoing=ongoing, waiting=rng.randrange(4), running=rng.randrange(32),
                           queued_prefill_tokens=rng.randrange(4096), kv_usage=rng.random(), kv_capacity_tokens=capacity)

    loads = {rid: fresh_load(rid, 0) for rid in ids}  # the simulator's `Cluster.loads`
    # Every replica reports every 0.5 s (router.stats_period_s); at 500 decisions/s that is replicas/250 each.
    stats_per_decision = min(math.ceil(replicas / 250), replicas)
    ongoing = dict.fromkeys(ids, 0)
    requests = []
    for n in range(warmup + decisions):
        ids_ = rng.choice(conversations) + [rng.getrandbits(48) for _ in range(NEW_BLOCKS)]
        hashes = chain_ids(ids_)
        requests.append(RouteRequest(f"r{n}", hashes, len(hashes) * BLOCK_TOKENS + rng.randrange(BLOCK_TOKENS)))
    if gc_freeze:
        gc.collect()
        gc.freeze()

    # Wall time is what a request waits; process CPU time is the same work minus the
    # moments the OS ran someone else (this machine is shared, so both are reported).
    lat_ms: list[float] = []
    cpu_ms: list[float] = []
    scored: list[int] = []
    best_match: list[int] = []
    in_flight: list[tuple[RouteRequest, str]] = []
    for n, req in enumerate(requests):
        now = 1.0 + n * 0.002  # 500 decisions/s: speculative entries pile up for the full TTL
        for rid in rng.sample(ids, stats_per_decision):  # stats reports arriving meanwhile (and heartbeats)
            loads[rid] = fresh_load(rid, ongoing[rid])
            policy.on_cache_events(rid, (), (), now)
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        chosen = policy.rank(req, loads, now)[0]
        last = policy._last  # this decision's prefix matches, for the sanity check below
        policy.on_routed(req, chosen, now)
        ongoing[chosen] += 1
        old = loads[chosen]
        loads[chosen] = ReplicaLoad(chosen, ongoing[chosen], old.waiting, old.running, old.queued_prefill_tokens,
                                    old.kv_usage, old.kv_capacity_tokens)
        wall, cpu = (time.perf_counter_ns() - t0) / 1e6, (time.process_time_ns() - c0) / 1e6
        if n >= warmup:
            lat_ms.append(wall)
            cpu_ms.append(cpu)
            if last is not None:  # sanity: requests really do hit long cached prefixes; candidates scored
                best_match.append(max(last[1].values(), default=0))
                scored.append(len(last[2]))
        in_flight.append((req, chosen))
        if len(in_flight) > 64:  # requests complete after a while (outside the timed region)
            done, rid = in_flight.pop(0)
            policy.on_finished(done, rid, now)
            ongoing[rid] -= 1

    if gc_freeze:
        gc.unfreeze()
    lat_ms.sort()
    cpu_ms.sort()

    def pct(xs: list[float], q: float) -> float:
        return round(xs[min(int(q * len(xs)), len(xs) - 1)], 4)

    return {
        "replicas": replicas,
        "sample_replicas": cfg.sample_replicas,
        "gc_freeze": gc_freeze,
        "blocks_per_replica": blocks,
        "decisions": decisions,
        "request_blocks": round(statistics.fmean(len(r.block_hashes) for r in requests), 1),
        "mean_best_match_blocks": round(statistics.fmean(best_match), 1),
        "mean_replicas_scored": round(statistics.fmean(scored), 1),
        "index_entries": policy.index.num_entries(),
        "families_in_footprints": len(policy.footprints),
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "max_ms": round(lat_ms[-1], 4),
        "mean_ms": round(statistics.fmean(lat_ms), 4),
        "cpu_p50_ms": pct(cpu_ms, 0.50),
        "cpu_p99_ms": pct(cpu_ms, 0.99),
    }


def main(
    replicas: int = typer.Option(64, "--replicas", min=1, help="Replicas in the index."),
    blocks: int = typer.Option(10_000, "--blocks", min=1, help="Cached blocks per replica."),
    decisions: int = typer.Option(5_000, "--decisions", min=1, help="Routing decisions to time."),
    seed: int = typer.Option(0, "--seed"),
    gc_freeze: bool = typer.Option(False, "--gc-freeze", help="gc.freeze() the prebuilt index (removes full-GC pauses)."),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="Score every replica (router.sample_replicas null)."),
) -> None:
    """Per-decision latency of the kvserve routing core; prints JSON (p50_ms, p99_ms, ...)."""
    print(json.dumps(run(replicas, blocks, decisions, seed, gc_freeze, None if exhaustive else "default"), indent=2))


if __name__ == "__main__":
    typer.run(main)
