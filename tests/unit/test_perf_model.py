"""Engine performance model: the cached-context term of prefill, fitted from a profile's warm points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.perf_model import EngineProfile, fit_cached_token_ms

CPU_PROFILE = Path(__file__).resolve().parents[2] / "kvserve" / "profiles" / "cpu-smollm2-135m.json"


def _synthetic(per_new: float, per_cached: float, base: float = 5.0) -> list[dict]:
    points = []
    for n in (128, 256, 512, 1024, 2048):
        for frac in (0.0, 0.5, 0.9):
            cached = n * frac
            points.append({"prompt_tokens": n, "cached_fraction": frac,
                           "ttft_ms": base + per_new * (n - cached) + per_cached * cached})
    return points


@settings(max_examples=50, deadline=None)
@given(per_new=st.floats(0.01, 5.0), ratio=st.floats(0.0, 0.5))
def test_fit_recovers_the_cached_token_slope(per_new, ratio):
    per_cached = per_new * ratio
    assert fit_cached_token_ms(_synthetic(per_new, per_cached)) == pytest.approx(per_cached, rel=1e-6, abs=1e-9)


def test_a_hit_costs_its_context_but_far_less_than_a_miss():
    prefill = _synthetic(2.0, 0.1)
    prof = EngineProfile.from_dict({"prefill": prefill, "prefill_ms_per_cached_token": fit_cached_token_ms(prefill),
                                    "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}],
                                    "kv_cache_tokens": 10_000})
    miss = prof.prefill_ms_for(1024)
    hit = prof.prefill_ms_for(24, cached_context=1000)
    assert prof.prefill_ms_for(24) < hit < miss / 5
    assert hit == pytest.approx(5.0 + 2.0 * 24 + 0.1 * 1000)


def test_profiles_without_the_key_read_as_before():
    raw = json.loads(CPU_PROFILE.read_text())
    legacy = {k: v for k, v in raw.items() if k != "prefill_ms_per_cached_token"}
    old = EngineProfile.from_dict(legacy)
    assert old.cached_token_ms == 0.0
    assert old.prefill_ms_for(100, cached_context=5000) == old.prefill_ms_for(100)
    # The committed CPU profile carries the fitted slope, and it reproduces its own warm points within 20%.
    new = EngineProfile.from_dict(raw)
    assert new.cached_token_ms == pytest.approx(fit_cached_token_ms(raw["prefill"]), rel=1e-3)
    for p in raw["prefill"]:
        if p["cached_fraction"] >= 0.9 and p["prompt_tokens"] >= 512:
            cached = p["prompt_tokens"] * p["cached_fraction"]
            assert new.prefill_ms_for(p["prompt_tokens"] - cached, cached) == pytest.approx(p["ttft_ms"], rel=0.2)
