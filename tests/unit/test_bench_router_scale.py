"""Routing at scale: trace tiling, the router microbenchmark, the sampled-vs-exhaustive run, and the
simulator's fallback past a sampling policy's candidates."""

from __future__ import annotations

import json
from collections.abc import Sequence

from typer.testing import CliRunner

from bench import router_micro
from bench.routing_scale import run_one, setup_for
from bench.trace_tiling import tile
from kvserve.perf_model import EngineProfile
from simulator.cluster import Cluster
from simulator.engine import EngineSettings, SimRequest, blocks_for
from simulator.workloads import SimWorkload
from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.block_hash import chain_ids
from tests.shared_files import shared_file


def req(idx: int, t: float, ids: list[int], bs: int = 4) -> SimRequest:
    return SimRequest(idx, t, bs * len(ids), 2, chain_ids(ids), blocks_for(bs * len(ids) + 2, bs))


def test_tiled_copies_keep_their_own_prefix_sharing_and_share_nothing_across():
    src = SimWorkload("trace", [req(0, 0.0, [1, 2, 3]), req(1, 2.0, [1, 2, 9]), req(2, 4.0, [7])], 4)
    wl = tile(src, copies=3, time_scale=0.5)
    assert len(wl.requests) == 9 and [r.idx for r in wl.requests] == list(range(9))
    assert [r.arrival for r in wl.requests] == sorted(r.arrival for r in wl.requests)
    assert max(r.arrival for r in wl.requests) < 4.0 * 0.5 + 1.0  # copies interleave within one gap, scaled
    by_copy: dict[str, list[SimRequest]] = {}
    for r in wl.requests:
        by_copy.setdefault(r.tenant.split("#")[1], []).append(r)
    assert len(by_copy) == 3
    firsts = set()
    for rs in by_copy.values():
        a, b, _ = rs
        assert a.block_hashes[:2] == b.block_hashes[:2] and a.block_hashes[2] != b.block_hashes[2]
        firsts.add(a.block_hashes[0])
    assert len(firsts) == 3  # no block shared between copies
    assert len(tile(src, copies=3, requests=4).requests) == 4


def test_micro_scores_a_bounded_sample_and_reports_percentiles():
    sampled = router_micro.run(replicas=60, blocks=300, decisions=80, warmup=20)
    assert sampled["sample_replicas"] == 16
    assert 16 <= sampled["mean_replicas_scored"] <= 16 + 16 + 1
    assert sampled["mean_best_match_blocks"] >= router_micro.SYSTEM_BLOCKS  # requests hit cached prefixes
    assert sampled["families_in_footprints"] > 0
    assert 0 < sampled["p50_ms"] <= sampled["p99_ms"] <= sampled["max_ms"]
    exhaustive = router_micro.run(replicas=60, blocks=300, decisions=20, warmup=5, sample=None)
    assert exhaustive["mean_replicas_scored"] == 60


def test_kvserve_bench_micro_prints_the_json():
    from cli.app import app

    result = CliRunner().invoke(app, ["bench", "micro", "--replicas", "20", "--blocks", "200", "--decisions", "30"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["replicas"] == 20 and out["decisions"] == 30 and out["p99_ms"] >= out["p50_ms"] > 0


def test_scale_run_on_the_tiled_trace_times_every_decision():
    setup = setup_for(shared_file("traces", "mooncake_synthetic_trace.jsonl"), replicas=40, requests=200)
    assert setup.workload.params["tiled_copies"] == 1 and len(setup.workload.requests) == 200
    assert setup.workload.params["tiled_time_scale"] == 16 / 40  # the trace's load per replica on 16
    row = run_one(setup, sample=4)
    assert row["decisions"] == 200 and row["failed_requests"] == 0
    assert 0 < row["prefix_hit_rate"] < 1 and row["decision_p99_ms"] >= row["decision_p50_ms"] > 0


class FirstOnly(RoutingPolicy):
    """Ranks only the first replica it is given, like a sampling policy whose candidates are all full."""

    name = "first_only"
    takes_load_map = True

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        return [next(iter(replicas))]


def test_simulator_falls_back_to_the_least_loaded_replica_with_room_past_the_candidates():
    profile = EngineProfile.from_dict({
        "block_size": 4, "kv_cache_tokens": 4096,
        "prefill": [{"prompt_tokens": 100, "ttft_ms": 100.0}, {"prompt_tokens": 200, "ttft_ms": 200.0}],
        "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}, {"context_tokens": 512, "batch": 64, "itl_ms": 10.0}],
    })
    wl = SimWorkload("hand", [req(0, 0.0, [1, 2]), req(1, 0.0, [3, 4]), req(2, 0.0, [5, 6])], 4)
    eng = EngineSettings(block_size=4, kv_blocks=16, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(wl, profile, eng, FirstOnly(), replicas=3, max_ongoing=1, trace_events=True).run()
    routed = [rid for _, kind, _, rid in res.events if kind == "routed"]
    assert routed == ["r0000", "r0001", "r0002"]  # each full first choice passes to a replica with room
    assert res.failed_requests == 0
