"""The router's predicted-TTFT cost: monotone in every kind of work, calibrated from profiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.shared_files import shared_file
from kvserve.config import RouterConfig
from kvserve.perf_model import EngineProfile
from router.base import ReplicaLoad
from router.cost import (
    CostParams,
    committed_load_ms,
    eviction_cost_ms,
    kv_pressure,
    predicted_ttft_ms,
    routing_cost_ms,
    uncached_tokens,
)

PARAMS = CostParams(prefill_ms_per_token=2.0, decode_ms_per_seq=4.0, cache_miss_weight=1.0, active_token_weight=0.5)

loads = st.builds(
    ReplicaLoad,
    replica_id=st.just("r"),
    running=st.integers(0, 256),
    queued_prefill_tokens=st.integers(0, 100_000),
    kv_usage=st.floats(0.0, 1.0),
)
tokens = st.integers(0, 100_000)


@given(load=loads, a=tokens, b=tokens)
def test_more_uncached_tokens_never_cost_less(load, a, b):
    lo, hi = sorted((a, b))
    assert predicted_ttft_ms(load, lo, PARAMS) <= predicted_ttft_ms(load, hi, PARAMS)
    assert routing_cost_ms(load, lo, PARAMS) <= routing_cost_ms(load, hi, PARAMS)


@given(load=loads, n=tokens, extra_q=st.integers(0, 10_000), extra_run=st.integers(0, 64), extra_kv=st.floats(0, 1))
def test_more_load_never_costs_less(load, n, extra_q, extra_run, extra_kv):
    busier = ReplicaLoad(
        "r",
        running=load.running + extra_run,
        queued_prefill_tokens=load.queued_prefill_tokens + extra_q,
        kv_usage=min(load.kv_usage + extra_kv, 1.0),
    )
    assert predicted_ttft_ms(load, n, PARAMS) <= predicted_ttft_ms(busier, n, PARAMS)
    assert routing_cost_ms(load, n, PARAMS) <= routing_cost_ms(busier, n, PARAMS)


@given(load=loads, n=tokens, a=tokens, b=tokens)
def test_routing_cost_is_the_sum_of_its_terms_and_monotone_in_committed_context(load, n, a, b):
    lo, hi = sorted((a, b))
    base = predicted_ttft_ms(load, n, PARAMS) + eviction_cost_ms(load, n, PARAMS)
    assert routing_cost_ms(load, n, PARAMS) == pytest.approx(base)
    assert routing_cost_ms(load, n, PARAMS, active_tokens=lo) <= routing_cost_ms(load, n, PARAMS, active_tokens=hi)


@given(load=loads, a=tokens, b=tokens)
def test_a_cache_hit_is_worth_more_than_the_same_tokens_of_queue(load, a, b):
    """Queued work delays one request; a miss also evicts cached tokens (cache_miss_weight > 0)."""
    q_load = ReplicaLoad("r", running=load.running, queued_prefill_tokens=load.queued_prefill_tokens + a)
    miss_load = ReplicaLoad("r", running=load.running, queued_prefill_tokens=load.queued_prefill_tokens)
    assert routing_cost_ms(q_load, b, PARAMS) <= routing_cost_ms(miss_load, a + b, PARAMS)


def test_cost_terms_add_up_by_hand():
    load = ReplicaLoad("r", running=3, queued_prefill_tokens=100, kv_usage=0.95)
    assert predicted_ttft_ms(load, 50, PARAMS) == pytest.approx((100 + 50) * 2 + 3 * 4)
    # miss weight 1 + pressure 0.5 * weight 1, on 50 uncached tokens at 2 ms
    assert eviction_cost_ms(load, 50, PARAMS) == pytest.approx(50 * 2 * 1.5)
    assert committed_load_ms(1000, PARAMS) == pytest.approx(1000 * 2 * 0.5)
    assert routing_cost_ms(load, 50, PARAMS, active_tokens=1000) == pytest.approx(312 + 150 + 1000)


def test_kv_pressure_shape():
    assert kv_pressure(0.5, 0.9) == 0.0
    assert kv_pressure(0.9, 0.9) == 0.0
    assert kv_pressure(0.95, 0.9) == pytest.approx(0.5)
    assert kv_pressure(1.0, 0.9) == 1.0


def test_uncached_tokens_counts_partial_tail_and_never_goes_negative():
    assert uncached_tokens(100, matched_blocks=6, block_size=16) == 4
    assert uncached_tokens(100, matched_blocks=0, block_size=16) == 100
    assert uncached_tokens(16, matched_blocks=2, block_size=16) == 0


def test_params_come_from_router_config():
    """The core's CostParams are built from the app config, and the config's defaults are the core's."""
    assert RouterConfig().params().cost == CostParams()
    cfg = RouterConfig(
        prefill_ms_per_token=0.1, decode_ms_per_seq=0.7, kv_pressure_start=0.8, kv_pressure_weight=2.0,
        active_token_weight=0.25, cache_miss_weight=0.3,
    )
    p = cfg.params().cost
    assert (p.prefill_ms_per_token, p.decode_ms_per_seq, p.cache_miss_weight) == (0.1, 0.7, 0.3)
    assert (p.kv_pressure_start, p.kv_pressure_weight, p.active_token_weight) == (0.8, 2.0, 0.25)


def test_config_from_measured_profile():
    path = shared_file("profiles", "h200-vllm0.24-llama8b-profile.json")
    profile = EngineProfile.load(path)
    base = RouterConfig(tie_tolerance=0.2)
    cfg = base.fitted_to(profile)
    assert cfg.prefill_ms_per_token == pytest.approx(profile.prefill_ms_per_token())
    expected_per_seq = (profile.decode_step_ms(32) - profile.decode_step_ms(1)) / 31
    assert cfg.decode_ms_per_seq == pytest.approx(expected_per_seq)
    assert cfg.decode_ms_per_seq > 0
    assert cfg.tie_tolerance == 0.2  # other knobs untouched
    # An H200 prefills an 8B model far faster than the CPU default assumes.
    assert cfg.prefill_ms_per_token < RouterConfig().prefill_ms_per_token
