from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.capacity import per_replica_capacity, replicas_needed
from kvserve.perf_model import EngineProfile
from tests.shared_files import shared_file


# A small CPU-like profile with a deliberately noisy decode curve (larger context reads
# faster at batch 4), so monotonicity cannot come from clean data alone.
NOISY = EngineProfile.from_dict(
    {
        "block_size": 16,
        "kv_cache_tokens": 32_768,
        "prefill": [
            {"prompt_tokens": 64, "cached_fraction": 0.0, "ttft_ms": 60.0},
            {"prompt_tokens": 256, "cached_fraction": 0.0, "ttft_ms": 200.0},
            {"prompt_tokens": 1024, "cached_fraction": 0.0, "ttft_ms": 900.0},
        ],
        "decode": [
            {"context_tokens": 256, "batch": 1, "itl_ms": 30.0},
            {"context_tokens": 256, "batch": 4, "itl_ms": 45.0},
            {"context_tokens": 256, "batch": 16, "itl_ms": 120.0},
            {"context_tokens": 1024, "batch": 1, "itl_ms": 32.0},
            {"context_tokens": 1024, "batch": 4, "itl_ms": 41.0},
            {"context_tokens": 1024, "batch": 16, "itl_ms": 180.0},
        ],
    }
)

rates = st.floats(0, 200, allow_nan=False)
prompts = st.floats(0, 4000, allow_nan=False)
outputs = st.floats(0, 1000, allow_nan=False)
ttfts = st.floats(50, 10_000, allow_nan=False)
itls = st.floats(5, 500, allow_nan=False)


def need(rate, prompt, output, ttft, itl, headroom=0.8):
    return replicas_needed(NOISY, rate, prompt, output, ttft, itl, headroom, max_batch=64).replicas


@settings(max_examples=150, deadline=None)
@given(rates, rates, prompts, outputs, ttfts, itls)
def test_monotone_in_rate(r1, r2, prompt, output, ttft, itl):
    lo, hi = sorted((r1, r2))
    assert need(lo, prompt, output, ttft, itl) <= need(hi, prompt, output, ttft, itl)


@settings(max_examples=150, deadline=None)
@given(rates, prompts, prompts, outputs, ttfts, itls)
def test_monotone_in_prompt_length(rate, p1, p2, output, ttft, itl):
    lo, hi = sorted((p1, p2))
    assert need(rate, lo, output, ttft, itl) <= need(rate, hi, output, ttft, itl)


@settings(max_examples=150, deadline=None)
@given(rates, prompts, outputs, outputs, ttfts, itls)
def test_monotone_in_output_length(rate, prompt, o1, o2, ttft, itl):
    lo, hi = sorted((o1, o2))
    assert need(rate, prompt, lo, ttft, itl) <= need(rate, prompt, hi, ttft, itl)


@settings(max_examples=150, deadline=None)
@given(rates, prompts, outputs, ttfts, ttfts, itls, itls)
def test_tighter_targets_never_need_fewer_replicas(rate, prompt, output, t1, t2, i1, i2):
    assert need(rate, prompt, output, min(t1, t2), min(i1, i2)) >= need(rate, prompt, output, max(t1, t2), max(i1, i2))


@settings(max_examples=150, deadline=None)
@given(rates, prompts, outputs, ttfts, itls, st.floats(0.1, 1.0))
def test_replicas_cover_the_rate_at_planned_utilization(rate, prompt, output, ttft, itl, headroom):
    est = replicas_needed(NOISY, rate, prompt, output, ttft, itl, headroom, max_batch=64)
    assert est.utilization <= headroom + 1e-12
    assert est.replicas * est.per_replica_rps >= rate * (1 - 1e-9)
    if est.replicas > 0:  # and not one more than needed
        assert (est.replicas - 1) * est.per_replica_rps < rate


def test_no_load_needs_no_replicas():
    assert need(0.0, 500, 100, 2000, 200) == 0


def test_itl_target_limits_the_decode_batch():
    loose = per_replica_capacity(NOISY, 100, 100, 5000, 200, max_batch=64)
    tight = per_replica_capacity(NOISY, 100, 100, 5000, 50, max_batch=64)
    assert tight.decode_batch < loose.decode_batch
    assert tight.per_replica_rps < loose.per_replica_rps


def test_unreachable_targets_are_flagged():
    assert not per_replica_capacity(NOISY, 2000, 10, ttft_target_ms=100, itl_target_ms=200).feasible
    assert not per_replica_capacity(NOISY, 10, 10, ttft_target_ms=5000, itl_target_ms=10).feasible
    assert per_replica_capacity(NOISY, 10, 10, ttft_target_ms=5000, itl_target_ms=200).feasible


def test_h200_profile_sanity():
    h200 = EngineProfile.load(shared_file("profiles", "h200-vllm0.24-llama8b-profile.json"))
    # Short chat requests: one H200 takes well over 10 req/s at loose targets.
    chat = replicas_needed(h200, 10, 1000, 100, 2000, 200)
    assert chat.replicas == 1 and chat.feasible and chat.decode_batch >= 128
    # Mooncake-like (≈15k prompts, ~64% cached, 149 output) at 50 req/s needs a fleet.
    mooncake = replicas_needed(h200, 50, 15325 * 0.36, 149, 2000, 50)
    assert 5 <= mooncake.replicas <= 40
    # Its replicas-per-rate is linear: doubling the rate roughly doubles the fleet.
    double = replicas_needed(h200, 100, 15325 * 0.36, 149, 2000, 50)
    assert 2 * mooncake.replicas - 1 <= double.replicas <= 2 * mooncake.replicas
