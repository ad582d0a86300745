"""Microbenchmark: per-decision latency of the kvserve routing core (rank + on_routed).

Setup mirrors the issue's target: R replicas each holding B cached blocks, made
of realistic overlapping prefix chains (tenants' shared system prompts, then
per-conversation histories), and requests of ~64 blocks that mostly extend a
cached conversation. Each decision also carries fresh random load stats.

    python -m bench.router_micro --replicas 64 --blocks 10000 --decisions 5000

Target (issue 3): p99 <= 1 ms.
"""

from __future__ import annotations

import gc
import json
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


def _build_cache(replicas: int, blocks: int, rng: random.Random) -> tuple[dict[str, list[int]], list[list[int]]]:
    """Per-replica cached hash sets and the list of cached conversations (block-id lists)."""
    tenants = max(replicas * 2, 8)
    system = [[rng.getrandbits(48) for _ in range(SYSTEM_BLOCKS)] for _ in range(tenants)]
    cache: dict[str, list[int]] = {}
    conversations: list[list[int]] = []
    for i in range(replicas):
        rid = f"replica-{i}"
        held: set[int] = set()
        # Each replica is "home" to a few tenants; prefixes overlap between conversations of a tenant.
        homes = [system[(i * 2 + k) % tenants] for k in range(3)]
        while len(held) < blocks:
            ids = rng.choice(homes) + [rng.getrandbits(48) for _ in range(CONVERSATION_BLOCKS)]
            conversations.append(ids)
            held.update(chain_ids(ids))
        cache[rid] = list(held)  # whole conversations only (>= blocks), so chains have no holes
    return cache, conversations


def run(
    replicas: int = 64, blocks: int = 10_000, decisions: int = 5_000, seed: int = 0, gc_freeze: bool = False
) -> dict:
    """Time `decisions` routing decisions; returns latency percentiles in ms.

    The index holds ~1M small containers, so a full (gen-2) garbage collection
    costs ~100-200 ms and shows up as `max_ms`; `gc_freeze` moves the prebuilt
    index out of the collector's reach (what a long-lived router process can do
    after loading its first snapshots).
    """
    rng = random.Random(seed)
    cache, conversations = _build_cache(replicas, blocks, rng)
    policy = PrefixCostRouter(RouterConfig().params(), seed=seed, block_size=BLOCK_TOKENS)
    for rid, held in cache.items():
        policy.on_cache_snapshot(rid, held, now=0.0)
    ids = sorted(cache)
    if gc_freeze:
        gc.collect()
        gc.freeze()

    requests = []
    for n in range(decisions):
        ids_ = rng.choice(conversations) + [rng.getrandbits(48) for _ in range(NEW_BLOCKS)]
        hashes = chain_ids(ids_)
        requests.append(RouteRequest(f"r{n}", hashes, len(hashes) * BLOCK_TOKENS + rng.randrange(BLOCK_TOKENS)))
    loads = [
        [
            ReplicaLoad(rid, ongoing=rng.randrange(8), waiting=rng.randrange(4), running=rng.randrange(32),
                        queued_prefill_tokens=rng.randrange(4096), kv_usage=rng.random(),
                        kv_capacity_tokens=blocks * BLOCK_TOKENS)  # footprint charge on
            for rid in ids
        ]
        for _ in range(16)
    ]

    # Wall time is what a request waits; process CPU time is the same work minus the
    # moments the OS ran someone else (this machine is shared, so both are reported).
    lat_ms: list[float] = []
    cpu_ms: list[float] = []
    best_match: list[int] = []
    in_flight: list[tuple[RouteRequest, str]] = []
    for n, req in enumerate(requests):
        now = 1.0 + n * 0.002  # 500 decisions/s: speculative entries pile up for the full TTL
        replica_loads = loads[n % len(loads)]
        c0, t0 = time.process_time_ns(), time.perf_counter_ns()
        chosen = policy.rank(req, replica_loads, now)[0]
        policy.on_routed(req, chosen, now)
        lat_ms.append((time.perf_counter_ns() - t0) / 1e6)
        cpu_ms.append((time.process_time_ns() - c0) / 1e6)
        if n % 10 == 0:  # sanity: requests really do hit long cached prefixes
            best_match.append(max(policy.index.match(req.block_hashes, now).values(), default=0))
        in_flight.append((req, chosen))
        if len(in_flight) > 64:  # requests complete after a while (outside the timed region)
            done, rid = in_flight.pop(0)
            policy.on_finished(done, rid, now)

    if gc_freeze:
        gc.unfreeze()
    lat_ms.sort()
    cpu_ms.sort()

    def pct(xs: list[float], q: float) -> float:
        return round(xs[min(int(q * len(xs)), len(xs) - 1)], 4)

    return {
        "replicas": replicas,
        "gc_freeze": gc_freeze,
        "blocks_per_replica": blocks,
        "decisions": decisions,
        "request_blocks": round(statistics.fmean(len(r.block_hashes) for r in requests), 1),
        "mean_best_match_blocks": round(statistics.fmean(best_match), 1),
        "index_entries": policy.index.num_entries(),
        "p50_ms": pct(lat_ms, 0.50),
        "p99_ms": pct(lat_ms, 0.99),
        "max_ms": round(lat_ms[-1], 4),
        "mean_ms": round(statistics.fmean(lat_ms), 4),
        "cpu_p50_ms": pct(cpu_ms, 0.50),
        "cpu_p99_ms": pct(cpu_ms, 0.99),
    }


def main(
    replicas: int = typer.Option(64, help="Replicas in the index."),
    blocks: int = typer.Option(10_000, help="Cached blocks per replica."),
    decisions: int = typer.Option(5_000, help="Routing decisions to time."),
    seed: int = typer.Option(0),
    gc_freeze: bool = typer.Option(False, help="gc.freeze() the prebuilt index (removes full-GC pauses)."),
) -> None:
    print(json.dumps(run(replicas, blocks, decisions, seed, gc_freeze), indent=2))


if __name__ == "__main__":
    typer.run(main)
