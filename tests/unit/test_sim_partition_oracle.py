"""The partition oracle: split enumeration, cache-overflow ranking, and the hindsight pick by simulated p90."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from kvserve.config import KVServeConfig
from simulator.cluster import Cluster
from simulator.engine import EngineSettings
from simulator.partition_oracle import (
    StaticPartitionPolicy, best_static_partition, candidate_splits, overflow, prefix_blocks, searched_splits,
)
from simulator.metrics import latency_summary
from simulator.runner import ROUTING_KEYS, SimSetup
from simulator.workloads import SimWorkload, TenantMix, generated
from router.base import ReplicaLoad, RouteRequest
from tests.unit.test_sim_cluster import LINEAR, mk


def _tenant(req, name):  # type: ignore[no-untyped-def]
    return replace(req, tenant=name)


def test_prefix_blocks_are_the_blocks_every_request_of_a_tenant_shares() -> None:
    reqs = [
        _tenant(mk(0, 0.0, [1, 2, 3], 2), "a"),
        _tenant(mk(1, 1.0, [1, 2, 4], 2), "a"),
        _tenant(mk(2, 2.0, [1, 9], 2), "a"),
        _tenant(mk(3, 0.5, [7, 8, 9], 2), "b"),
    ]
    assert prefix_blocks(reqs) == {"a": 1, "b": 3}


def test_overflow_keeps_the_most_popular_prefixes_that_fit() -> None:
    counts = {"a": 10, "b": 5, "c": 3, "d": 1}
    blocks = {"a": 4, "b": 4, "c": 4, "d": 1}
    # Capacity 9: a (4) and b (4) fit, c (4) does not, d (1) still fits.
    assert overflow(counts, blocks, ["a", "b", "c", "d"], 9) == 3
    assert overflow(counts, blocks, ["c", "d"], 4) == 1
    assert overflow(counts, blocks, [], 4) == 0


def _workload(counts: dict[str, int], blocks: int = 3) -> list:  # type: ignore[type-arg]
    reqs, i = [], 0
    for n, (tenant, k) in enumerate(sorted(counts.items())):
        for _ in range(k):
            reqs.append(_tenant(mk(i, i * 0.1, [100 * (n + 1) + b for b in range(blocks)] + [10_000 + i], 2), tenant))
            i += 1
    return reqs


def test_candidate_splits_respect_the_share_bound_and_list_each_split_once() -> None:
    counts = {"a": 6, "b": 3, "c": 2, "d": 1}
    splits = candidate_splits(_workload(counts), kv_blocks=100, max_share=1.25)
    keys = [frozenset(t for t, v in s.side.items() if v) for s in splits]
    assert len(keys) == len(set(keys))
    total = sum(counts.values())
    for s in splits:
        ones = sum(counts[t] for t, v in s.side.items() if v)
        assert max(ones, total - ones) / (total / 2) == pytest.approx(s.share) and s.share <= 1.25
    # 12 requests, share <= 1.25: a side carries at most 7.5. {a} vs {b,c,d} (6/6) and {a,d} vs {b,c} (7/5)
    # qualify, {a,c} (8/4) does not; mirror images are not listed again.
    sides = {frozenset(t for t, v in s.side.items() if v == s.side["a"]) for s in splits}
    assert sides == {frozenset({"a"}), frozenset({"a", "d"})}


def test_candidate_splits_rank_by_cache_overflow() -> None:
    # Prefixes of 3 blocks, 6 blocks of cache per replica: two tenants fit per side.
    counts = {"a": 5, "b": 4, "c": 4, "d": 3, "e": 2}
    splits = candidate_splits(_workload(counts), kv_blocks=6, max_share=2.0)
    assert [s.overflow for s in splits] == sorted(s.overflow for s in splits)
    best = splits[0]
    on = defaultdict(list)
    for t, v in best.side.items():
        on[v].append(t)
    # Five tenants, four slots: the least popular tenant (e, 2 requests) is the only overflow.
    assert best.overflow == 2 and sorted(len(v) for v in on.values()) in ([2, 3], [1, 4])


def test_candidate_splits_refuse_a_single_tenant() -> None:
    with pytest.raises(ValueError, match="two tenants"):
        candidate_splits(_workload({"a": 3}), kv_blocks=10, max_share=1.25)


def test_static_policy_keeps_each_tenant_on_its_side() -> None:
    pol = StaticPartitionPolicy({"a": 1, "b": 0})
    loads = [ReplicaLoad("r1"), ReplicaLoad("r0")]
    assert pol.rank(RouteRequest("1", [], 10, tenant="a"), loads, 0.0) == ["r1", "r0"]
    assert pol.rank(RouteRequest("2", [], 10, tenant="b"), loads, 0.0) == ["r0", "r1"]


def ttft_p90_ms(res) -> float:  # type: ignore[no-untyped-def]
    return latency_summary(res.requests, res.itl)["ttft_p90_ms"]  # type: ignore[return-value]


def _setup(replicas: int = 2) -> SimSetup:
    mix = TenantMix(4, "zipf:1.1", 32, 8, 4)
    wl = generated("multi-tenant", mix, LINEAR.block_size, rate=50.0, requests=60, concurrency=4, seed=3)
    eng = EngineSettings(block_size=LINEAR.block_size, kv_blocks=24, max_num_seqs=8, max_batched_tokens=64)
    return SimSetup(wl, LINEAR, eng, KVServeConfig(), replicas, seed=3)


def test_best_static_partition_is_the_lowest_p90_of_the_simulated_candidates() -> None:
    setup = _setup()
    split, res = best_static_partition(setup, candidates=4, max_share=1.5)
    by_tenant: dict[str, set[str]] = defaultdict(set)
    for r in res.requests:
        by_tenant[r.tenant].add(r.replica)  # type: ignore[arg-type]
    assert all(len(v) == 1 for v in by_tenant.values())  # a static split: never moved, never duplicated
    p90s = []
    for cand in candidate_splits(setup.workload.requests, setup.engine.kv_blocks, 1.5)[:4]:
        run = Cluster(setup.workload, setup.profile, setup.engine, StaticPartitionPolicy(cand.side), replicas=2).run()
        p90s.append(ttft_p90_ms(run))
    assert ttft_p90_ms(res) == pytest.approx(min(p90s))
    assert split.share <= 1.5


def test_searched_splits_on_more_replicas_are_static_within_share_and_ranked() -> None:
    setup = _setup(replicas=3)
    # 3 replicas: the most popular tenant alone carries 1.7x the mean share
    splits = searched_splits(setup.workload.requests, 3, setup.engine.kv_blocks, max_share=2.0, starts=16, seed=1)
    assert splits
    keys = [(s.overflow, s.share) for s in splits]
    assert keys == sorted(keys)
    tenants = {r.tenant for r in setup.workload.requests}
    for s in splits:
        assert set(s.side) == tenants and set(s.side.values()) <= {0, 1, 2}
        assert s.share <= 2.0 + 1e-9
    # distinct as partitions: replica labels are interchangeable
    groups = {frozenset(frozenset(t for t in s.side if s.side[t] == r) for r in range(3)) for s in splits}
    assert len(groups) == len(splits)


def test_searched_splits_reach_the_exhaustive_optimum_on_two_replicas() -> None:
    setup = _setup()
    exhaustive = candidate_splits(setup.workload.requests, setup.engine.kv_blocks, 1.5)
    searched = searched_splits(setup.workload.requests, 2, setup.engine.kv_blocks, 1.5, starts=16)
    assert (searched[0].overflow, searched[0].share) == (exhaustive[0].overflow, exhaustive[0].share)


def test_best_static_partition_on_three_replicas_keeps_each_tenant_on_one() -> None:
    split, res = best_static_partition(_setup(replicas=3), candidates=3, max_share=2.0)
    homes: dict[str, set[str]] = defaultdict(set)
    for r in res.requests:
        homes[r.tenant].add(r.replica)  # type: ignore[arg-type]
    assert all(len(v) == 1 for v in homes.values())
    assert len({r.replica for r in res.requests}) <= 3 and split.share <= 2.0 + 1e-9


def test_searched_splits_report_none_when_no_split_keeps_the_share() -> None:
    setup = _setup(replicas=3)  # one tenant alone is 1.7x the mean: no split is within 1.5
    assert searched_splits(setup.workload.requests, 3, setup.engine.kv_blocks, max_share=1.5, starts=8) == []


def test_searched_splits_need_a_tenant_per_replica() -> None:
    setup = _setup()
    with pytest.raises(ValueError, match="at least as many tenants"):
        searched_splits(setup.workload.requests, 9, setup.engine.kv_blocks, 1.5)


def test_cli_adds_the_partition_oracle_row(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    args = ["sim", "--workload", "multi-tenant", "--tenants", "4", "--system-tokens", "64", "--question-tokens", "8",
            "--output-tokens", "4", "--concurrency", "4", "--requests", "40", "--replicas", "2", "--policies", "pow2",
            "--partition-oracle", "3", "--partition-max-share", "1.5", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"pow2", "partition_oracle"}
    assert set(data["policies"]["partition_oracle"]) == set(ROUTING_KEYS)
    details = data["details"]["partition_oracle"]
    assert details["hindsight"] is True and details["candidates"] == 3
    assert data["policies"]["partition_oracle"]["share_max_over_mean"] <= 1.5 + 1e-9


def test_cli_adds_the_partition_oracle_row_on_three_replicas(tmp_path: Path) -> None:
    out = tmp_path / "p3.json"
    args = ["sim", "--workload", "multi-tenant", "--tenants", "6", "--system-tokens", "64", "--question-tokens", "8",
            "--output-tokens", "4", "--concurrency", "4", "--requests", "30", "--replicas", "3", "--policies", "pow2",
            "--partition-oracle", "2", "--partition-max-share", "3", "--json", str(out)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    detail = json.loads(out.read_text())["details"]["partition_oracle"]
    assert len(detail["replica_tenants"]) == 3
    assert sorted(t for group in detail["replica_tenants"] for t in group) == [f"tenant-{i}" for i in range(6)]
