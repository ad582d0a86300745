from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.window import NO_DATA, STAT_KEYS, SignalWindow, metrics_from_stats, percentile_nearest_rank


def brute_p90(values: list[float]) -> float | None:
    """Reference: the smallest sample v with at least 90% of samples <= v."""
    if not values:
        return None
    return min(v for v in values if sum(1 for x in values if x <= v) >= 0.9 * len(values))


# (gap since previous event in s, value)
events = st.lists(
    st.tuples(st.floats(0, 5, allow_nan=False), st.floats(0, 10_000, allow_nan=False)), max_size=120
)


@settings(max_examples=200, deadline=None)
@given(events=events, look_back=st.floats(1, 60), max_samples=st.integers(1, 50), query_gap=st.floats(0, 30))
def test_window_p90_equals_brute_force_over_the_window(events, look_back, max_samples, query_gap):
    w = SignalWindow(look_back_s=look_back, max_samples=max_samples, clock=lambda: 0.0)
    t = 0.0
    recorded: list[tuple[float, float]] = []
    for gap, value in events:
        t += gap
        w.on_first_token(value, now=t)
        w.on_token_gap(value / 10, now=t)
        recorded.append((t, value))
    now = t + query_gap
    # Expected: samples inside the look-back window, of the newest `max_samples` recorded.
    kept = [v for ts, v in recorded[-max_samples:] if ts >= now - look_back]
    assert w.ttft_p90_ms(now) == brute_p90(kept)
    itl = w.itl_p90_ms(now)
    expected_itl = brute_p90([v / 10 for v in kept])
    assert itl == expected_itl


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=200), st.floats(1, 100))
def test_nearest_rank_matches_reference_for_any_q(values, q):
    got = percentile_nearest_rank(values, q)
    ref = min(v for v in values if sum(1 for x in values if x <= v) >= q / 100 * len(values) - 1e-9)
    assert got == ref


def test_rates_and_means_over_window_only():
    w = SignalWindow(look_back_s=10.0, num_buckets=10, clock=lambda: 0.0)
    # Old traffic that must age out of the window.
    for i in range(50):
        w.on_arrival(prompt_tokens=1000, now=0.5)
    # 20 requests within the last 10 s, 100 prompt tokens each, 40 cached.
    for i in range(20):
        w.on_arrival(prompt_tokens=100, cached_tokens=40, now=20.0 + i * 0.4)
        w.on_completion(output_tokens=30, now=20.5 + i * 0.4)
    m = w.metrics("r1", now=29.9)
    assert m.replica_id == "r1"
    assert m.requests_per_s == pytest.approx(20 / 10.0)
    assert m.mean_prompt_tokens == pytest.approx(100)
    assert m.mean_output_tokens == pytest.approx(30)
    assert m.prompt_tokens_per_s == pytest.approx(200)
    assert m.output_tokens_per_s == pytest.approx(60)
    assert m.cache_hit_rate == pytest.approx(0.4)


def test_young_replica_rate_uses_its_age_not_the_full_window():
    w = SignalWindow(look_back_s=30.0, num_buckets=30, clock=lambda: 100.0)
    for i in range(10):
        w.on_arrival(prompt_tokens=10, now=100.0 + i * 0.5)
    assert w.metrics("r", now=105.0).requests_per_s == pytest.approx(10 / 5.0)


def test_memory_is_bounded():
    w = SignalWindow(look_back_s=1e9, max_samples=100, num_buckets=10, clock=lambda: 0.0)
    for i in range(10_000):
        w.on_token_gap(float(i), now=i * 0.001)
        w.on_arrival(10, now=i * 0.001)
    assert len(w.itl_samples(now=10.0)) == 100
    assert len(w._buckets) <= 10 + 1


def test_stats_dict_round_trip_and_no_data_sentinel():
    w = SignalWindow(look_back_s=30.0, clock=lambda: 0.0)
    empty = w.to_stats_dict(now=1.0)
    assert set(empty) == set(STAT_KEYS)
    assert all(isinstance(v, float) for v in empty.values())  # Serve accepts only numbers
    assert empty["kvserve_ttft_p90_ms"] == NO_DATA
    assert metrics_from_stats("a", empty).ttft_p90_ms is None

    w.set_engine_state(waiting=3, running=7, kv_usage=0.25)
    for i in range(10):
        w.on_arrival(200, cached_tokens=50, now=1.0 + i)
        w.on_first_token(100.0 + i, now=1.5 + i)
        w.on_token_gap(20.0 + i, now=1.6 + i)
        w.on_completion(40, now=2.0 + i)
    now = 12.0
    direct = w.metrics("rep", now=now)
    back = metrics_from_stats("rep", w.to_stats_dict(now=now))
    assert back == direct
    assert back.ttft_p90_ms == 108.0 and back.itl_p90_ms == 28.0  # 9th of 10 (nearest rank)
    assert (back.waiting, back.running, back.kv_usage) == (3, 7, 0.25)
    assert math.isclose(back.cache_hit_rate, 0.25)


def test_engine_hit_rate_overrides_window_ratio():
    w = SignalWindow(clock=lambda: 0.0)
    w.on_arrival(100, cached_tokens=0, now=0.0)
    w.set_engine_state(0, 0, 0.0, cache_hit_rate=0.9)
    assert w.metrics("r", now=1.0).cache_hit_rate == 0.9
