"""Hindsight bound for partitioning routers: the best static tenant -> replica split, found by simulation.

A router that keeps every tenant on one replica (Ray's PrefixCacheAffinityRouter,
and kvserve's once its families settle) is at best a static partition of the
tenants. This module knows the whole workload in advance -- every tenant's
request count -- and searches static partitions of the tenants over the replicas:

1. two replicas and at most 20 tenants: every split whose request share max/mean is within
   `max_share`; more replicas or tenants: the splits a seeded local search reaches from many
   shuffled greedy starts (moves and swaps of tenants that lower overflow, then imbalance), kept
   within `max_share` -- a search, so the bound is "the best static split found";
2. ranked by overflow: requests of the tenants whose prefixes do not fit their
   side's KV cache once the more popular tenants there are placed (those are
   the tenants that will be evicted and come back cold);
3. the `candidates` best-ranked splits are simulated (same engines, same
   workload) and the one with the lowest p90 TTFT wins.

Picking the winner on the very run it is scored on makes it optimistic: no
online router that partitions tenants can expect to beat it. It is a bound on
that family of routers, not on every router (one that moves or duplicates
tenants over time is not covered).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from simulator.cluster import Cluster, RunResult
from simulator.engine import SimRequest
from simulator.metrics import latency_summary
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy


class StaticPartitionPolicy(RoutingPolicy):
    """Sends each tenant to a fixed replica (its index among the replica ids, sorted)."""

    name = "static_partition"

    def __init__(self, side: dict[str, int]) -> None:
        self.side = side

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        ids = sorted(load.replica_id for load in replicas)
        home = ids[self.side.get(request.tenant, 0) % len(ids)]
        return [home, *(rid for rid in ids if rid != home)]


@dataclass(frozen=True)
class Split:
    side: dict[str, int]  # tenant -> replica index (0..replicas-1)
    share: float  # request share max/mean
    overflow: int  # requests of tenants that do not fit their side's cache


def prefix_blocks(requests: Sequence[SimRequest]) -> dict[str, int]:
    """Per tenant: the leading blocks all its requests share (its system prompt's full blocks)."""
    shared: dict[str, list[int]] = {}
    for r in requests:
        hashes = list(r.block_hashes)
        prev = shared.get(r.tenant)
        if prev is None:
            shared[r.tenant] = hashes
            continue
        n = 0
        while n < min(len(prev), len(hashes)) and prev[n] == hashes[n]:
            n += 1
        shared[r.tenant] = prev[:n]
    return {t: len(h) for t, h in shared.items()}


def overflow(counts: dict[str, int], blocks: dict[str, int], tenants: Sequence[str], capacity: int) -> int:
    """Requests of `tenants` that miss the cache: the most popular are kept until `capacity` blocks are used."""
    used, out = 0, 0
    for t in sorted(tenants, key=lambda t: (-counts[t], t)):
        if used + blocks[t] <= capacity:
            used += blocks[t]
        else:
            out += counts[t]
    return out


def candidate_splits(requests: Sequence[SimRequest], kv_blocks: int, max_share: float) -> list[Split]:
    """Two-replica splits within `max_share`, fewest overflow requests first (tenant order breaks ties)."""
    counts = Counter(r.tenant for r in requests)
    tenants = sorted(counts)
    if len(tenants) < 2:
        raise ValueError("the partition oracle needs a workload with at least two tenants")
    if len(tenants) > 20:
        raise ValueError(f"{len(tenants)} tenants: too many splits to enumerate (at most 20)")
    blocks = prefix_blocks(requests)
    total = sum(counts.values())
    # The whole cache counts as room for prefixes (running requests' own blocks are ignored): the ranking only
    # orders the splits; the simulation of each one decides.
    out = []
    for mask in range(0, 2 ** (len(tenants) - 1)):  # tenants[-1] always on side 0: each split once
        side = {t: (mask >> i) & 1 for i, t in enumerate(tenants)}
        ones = [t for t in tenants if side[t]]
        zeros = [t for t in tenants if not side[t]]
        if not ones:
            continue
        a = sum(counts[t] for t in ones)
        share = max(a, total - a) / (total / 2)
        if share > max_share + 1e-9:
            continue
        spill = overflow(counts, blocks, ones, kv_blocks) + overflow(counts, blocks, zeros, kv_blocks)
        out.append(Split(side, share, spill))
    out.sort(key=lambda s: (s.overflow, s.share, sorted(t for t, v in s.side.items() if v)))
    return out


def _rank_key(side: dict[str, int], replicas: int, counts: Counter, blocks: dict[str, int], kv_blocks: int,
              max_share: float) -> tuple[float, int, float]:
    """(share beyond max_share, overflow, share): a search from an unbalanced start first gets within the share."""
    groups: list[list[str]] = [[] for _ in range(replicas)]
    for t, r in side.items():
        groups[r].append(t)
    total = sum(counts.values())
    share = max(sum(counts[t] for t in g) for g in groups) / (total / replicas)
    return max(share - max_share, 0.0), sum(overflow(counts, blocks, g, kv_blocks) for g in groups), share


def searched_splits(requests: Sequence[SimRequest], replicas: int, kv_blocks: int, max_share: float,
                    starts: int = 64, seed: int = 0) -> list[Split]:
    """Distinct splits over `replicas` within `max_share` from seeded greedy starts + local search, best first."""
    counts = Counter(r.tenant for r in requests)
    tenants = sorted(counts)
    if len(tenants) < replicas:
        raise ValueError(f"the partition oracle needs at least as many tenants as replicas ({replicas})")
    blocks = prefix_blocks(requests)
    rng = random.Random(seed)
    found: dict[frozenset, Split] = {}
    for start in range(starts):
        order = sorted(tenants, key=lambda t: (-counts[t], t))
        if start:  # the first start is the plain greedy order; the rest perturb it
            rng.shuffle(order)
        load = [0] * replicas
        side: dict[str, int] = {}
        for t in order:  # greedy: the least-loaded replica takes the next tenant
            r = min(range(replicas), key=lambda i: (load[i], i))
            side[t] = r
            load[r] += counts[t]
        best = _rank_key(side, replicas, counts, blocks, kv_blocks, max_share)
        improved = True
        while improved:  # first-improvement local search over moves and swaps
            improved = False
            for t in tenants:
                for r in range(replicas):
                    if r == side[t]:
                        continue
                    old = side[t]
                    side[t] = r
                    key = _rank_key(side, replicas, counts, blocks, kv_blocks, max_share)
                    if key < best:
                        best, improved = key, True
                        break
                    side[t] = old
            for a in tenants:
                for b in tenants:
                    if side[a] >= side[b]:
                        continue
                    side[a], side[b] = side[b], side[a]
                    key = _rank_key(side, replicas, counts, blocks, kv_blocks, max_share)
                    if key < best:
                        best, improved = key, True
                    else:
                        side[a], side[b] = side[b], side[a]
        if best[0] > 1e-9:
            continue
        groups = frozenset(frozenset(t for t in tenants if side[t] == r) for r in range(replicas))
        found.setdefault(groups, Split(dict(side), best[2], best[1]))
    return sorted(found.values(), key=lambda s: (s.overflow, s.share, sorted(s.side.items())))


def best_static_partition(setup, candidates: int = 100, max_share: float = 1.25) -> tuple[Split, RunResult]:  # type: ignore[no-untyped-def]
    """Simulate the `candidates` best-ranked splits of `setup` (a `runner.SimSetup`); the lowest p90 TTFT wins."""
    requests = setup.workload.requests
    if setup.replicas == 2 and len({r.tenant for r in requests}) <= 20:
        splits = candidate_splits(requests, setup.engine.kv_blocks, max_share)
    else:
        splits = searched_splits(requests, setup.replicas, setup.engine.kv_blocks, max_share, seed=setup.seed)
    splits = splits[: max(candidates, 1)]
    if not splits:
        raise ValueError(f"no split of the tenants keeps the request share within {max_share}")
    best: tuple[float, Split, RunResult] | None = None
    for split in splits:
        res = Cluster(
            setup.workload, setup.profile, setup.engine, StaticPartitionPolicy(split.side),
            replicas=setup.replicas, router_cfg=setup.cfg.router, name="partition_oracle",
        ).run()
        p90 = latency_summary(res.requests, res.itl)["ttft_p90_ms"] or 0.0
        if best is None or p90 < best[0]:
            best = (p90, split, res)
    assert best is not None
    return best[1], best[2]
