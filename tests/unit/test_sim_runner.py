"""Simulator runner: router cost slopes from the engine profile, and the TTFT lower bound."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.config import KVServeConfig, RouterConfig
from kvserve.perf_model import EngineProfile
from kvserve.sim.cluster import Cluster
from kvserve.sim.engine import EngineSettings
from kvserve.sim.oracle import chunked_prefill_ms, infinite_hits, ttft_lower_bounds_ms
from kvserve.sim.runner import PACKAGED_PROFILE, SimSetup, router_config_for, routing_summary, run_routing
from kvserve.sim.workloads import SimWorkload
from router.cost import config_from_profile
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
    fitted = config_from_profile(prof)
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
