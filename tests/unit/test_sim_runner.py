"""Simulator runner: router cost slopes from the engine profile, and the TTFT lower bound."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.config import KVServeConfig, RouterConfig
from kvserve.perf_model import EngineProfile
from simulator.cluster import Cluster
from simulator.engine import EngineSettings
from simulator.oracle import chunked_prefill_ms, infinite_hits, ttft_lower_bounds_ms
from simulator.metrics import seconds_per_minute
from simulator.runner import (
    PACKAGED_PROFILE, SimSetup, compare_autoscalers, router_config_for, routing_summary, run_routing,
)
from simulator.workloads import SimWorkload
from router.registry import make_policy
from tests.unit.test_sim_cluster import mk

# prefill_ms(x) = x + 10 ms: a fixed cost per step, so chunking a prompt costs more than one pass.
OFFSET = EngineProfile.from_dict(
    {
        "block_size": 4,
        "kv_cache_tokens": 4096,
        "prefill": [{"prompt_tokens": 100, "ttft_ms": 110.0}, {"prompt_tokens": 200, "ttft_ms": 210.0}],
        "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}, {"context_tokens": 512, "batch": 64, "itl_ms": 12.0}],
    }
)


def test_router_slopes_come_from_the_profile_unless_explicit() -> None:
    prof = EngineProfile.load(PACKAGED_PROFILE)
    fitted = RouterConfig().fitted_to(prof)
    cfg = router_config_for(KVServeConfig(), prof, explicit=set())
    assert cfg.router.prefill_ms_per_token == fitted.prefill_ms_per_token
    assert cfg.router.decode_ms_per_seq == fitted.decode_ms_per_seq
    # The H200's per-sequence decode cost is far below the CPU-oriented default.
    assert cfg.router.decode_ms_per_seq < RouterConfig().decode_ms_per_seq / 10
    mine = KVServeConfig(router=RouterConfig(decode_ms_per_seq=3.0, prefill_ms_per_token=0.5))
    kept = router_config_for(mine, prof, explicit={"decode_ms_per_seq"})
    assert kept.router.decode_ms_per_seq == 3.0
    assert kept.router.prefill_ms_per_token == fitted.prefill_ms_per_token
    both = router_config_for(mine, prof, explicit={"decode_ms_per_seq", "prefill_ms_per_token"})
    assert both.router == mine.router


def test_lower_bound_hand_example() -> None:
    # 4-token blocks, step budget 5 tokens, prefill_ms(x) = x + 10.
    reqs = [mk(0, 0.0, [1, 2], 1), mk(1, 1.0, [1, 2, 3], 1), mk(2, 2.0, [1, 2], 1)]
    assert infinite_hits(reqs) == [0, 2, 2]
    assert chunked_prefill_ms(8, OFFSET, 5) == (5 + 10) + (3 + 10)
    lb = ttft_lower_bounds_ms(reqs, OFFSET, block_size=4, max_batched_tokens=5)
    # 8 cold tokens in chunks 5 + 3; 12 tokens with 8 cached -> 4 -> one step;
    # 8 tokens fully cached still computes its last token.
    assert lb == [28.0, 14.0, 11.0]


def test_packaged_profile_prefill_is_subadditive_within_a_step() -> None:
    """What makes `ttft_lower_bounds_ms` a bound: more, smaller chunks are never faster."""
    f = EngineProfile.load(PACKAGED_PROFILE).prefill_ms_for
    budget = KVServeConfig().engine.max_num_batched_tokens
    for a in range(1, budget, 13):
        for b in range(1, budget - a + 1, 17):
            assert f(a) + f(b) >= f(a + b) - 1e-9


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=1, max_size=5), st.integers(1, 4)), min_size=1, max_size=25),
    st.sampled_from(["round_robin", "pow2", "kvserve", "approx_tree", "ray_prefix"]),
    st.integers(1, 3),
)
def test_no_request_beats_its_lower_bound(prompts, policy, replicas) -> None:  # type: ignore[no-untyped-def]
    reqs = [mk(i, 0.01 * i, ids, out) for i, (ids, out) in enumerate(prompts)]
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=4, max_batched_tokens=6)
    res = Cluster(SimWorkload("t", reqs, 4), OFFSET, eng, make_policy(policy), replicas=replicas).run()
    lb = ttft_lower_bounds_ms(res.requests, OFFSET, 4, 6)
    for r, bound in zip(res.requests, lb):
        assert (r.first_token - r.arrival) * 1000.0 >= bound - 1e-6


def test_routing_summary_reports_the_bound() -> None:
    reqs = [mk(0, 0.0, [1, 2], 1), mk(1, 1.0, [1, 2, 3], 1), mk(2, 2.0, [1, 2], 1)]
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=4, max_batched_tokens=5)
    setup = SimSetup(SimWorkload("t", reqs, 4), OFFSET, eng, KVServeConfig(), replicas=1)
    res = run_routing(setup, "round_robin")
    row = routing_summary(res, setup, {})
    # One idle replica sees exactly the bound's scenario: every TTFT equals its bound.
    assert row["ttft_p90_lower_bound_ms"] == pytest.approx(row["ttft_p90_ms"])


@given(spans=st.lists(st.tuples(st.floats(0, 400), st.floats(0, 400)), max_size=8), end=st.floats(1, 400))
def test_seconds_per_minute_splits_the_spans_and_loses_none(spans, end) -> None:  # type: ignore[no-untyped-def]
    per_minute = seconds_per_minute(spans, end)
    assert len(per_minute) == max(1, math.ceil(end / 60.0))
    assert sum(per_minute) == pytest.approx(sum(max(0.0, min(b, end) - a) for a, b in spans), abs=1e-6)
    for m, s in enumerate(per_minute):
        assert 0.0 <= s <= len(spans) * min(60.0, end - 60.0 * m) + 1e-6


def test_autoscaler_per_minute_rows_add_up_to_the_summary() -> None:
    from simulator.workloads import TenantMix, generated

    prof = EngineProfile.from_dict(json.loads(PACKAGED_PROFILE.read_text()))
    wl = generated("step", TenantMix(4, "uniform", 64, 16, 8), prof.block_size, rate=6.0, phase_s=50.0, seed=0)
    cfg = KVServeConfig.model_validate({"autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": 3}})
    eng = EngineSettings(block_size=wl.block_size, kv_blocks=512, max_num_seqs=4, max_batched_tokens=256)
    setup = SimSetup(wl, prof, eng, cfg, replicas=1, engine_start_s=5.0)
    out, results = compare_autoscalers(setup, ["fixed_max", "kvserve"], "pow2")
    for name, res in results.items():
        rows = out["details"][name]["per_minute"]
        summary = out["autoscalers"][name]
        lengths = [min(60.0, res.end_time - 60.0 * r["minute"]) for r in rows]
        assert len(rows) == math.ceil(res.end_time / 60.0) >= 3
        assert sum(r["replicas"] * n for r, n in zip(rows, lengths)) == pytest.approx(summary["replica_seconds"])
        assert sum(r["oracle_replicas"] * n for r, n in zip(rows, lengths)) == pytest.approx(summary["oracle_replica_seconds"])
        met = [r["slo_met"] for r in rows if r["slo_met"] is not None]
        assert sum(met) / len(met) == pytest.approx(summary["slo_attainment"])
        assert all(0 <= r["replicas"] <= 3 for r in rows)
    assert all(r["replicas"] >= 2.9 for r in out["details"]["fixed_max"]["per_minute"][1:-1])
