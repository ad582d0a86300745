"""The kvserve policy does not scale on sampling noise: a window's p90 just over the target
(its lower confidence bound is not) holds the fleet, and a few seconds' arrival rate adds
replicas only when it is more than the fleet can serve within the TTFT target."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ScalingInput
from autoscaling.capacity import per_replica_capacity
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.window import (
    P90_LOW_Z, SignalWindow, WindowMetrics, metrics_from_stats, percentile_nearest_rank, quantile_lower_bound,
)
from tests.unit.test_autoscaling_policies import PROFILE
from tests.unit.test_autoscaling_predictive import SLO, cfg, fleet, need

# -- the lower confidence bound of a p90 ------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=500), z=st.floats(0, 4))
def test_lower_bound_is_a_sample_at_or_below_the_p90_and_falls_with_confidence(values, z):
    low = quantile_lower_bound(values, 0.9, z)
    assert low in values
    assert low <= percentile_nearest_rank(values, 90)
    assert quantile_lower_bound(values, 0.9, z + 1.0) <= low


def test_lower_bound_covers_the_true_p90_about_95_percent_of_the_time():
    """Uniform(0, 1) samples: the true p90 is 0.9. A one-sided 95% bound must stay below it in
    ~95% of windows, whether the window holds 40 requests or 400."""
    rng = random.Random(7)
    for n in (40, 400):
        below = sum(quantile_lower_bound([rng.random() for _ in range(n)], 0.9) <= 0.9 for _ in range(2000))
        assert 0.92 <= below / 2000 <= 0.99, (n, below)


def test_lower_bound_tightens_with_more_samples():
    """The bound's rank sits z * sqrt(0.09 n) below the p90's: relatively closer as n grows."""
    for n in (50, 500, 4000):
        ordered = [float(i) for i in range(1, n + 1)]
        gap = percentile_nearest_rank(ordered, 90) - quantile_lower_bound(ordered, 0.9)
        assert abs(gap - P90_LOW_Z * math.sqrt(0.09 * n)) <= 2.0


def test_window_reports_the_bounds_and_they_round_trip():
    w = SignalWindow(look_back_s=30.0, clock=lambda: 0.0)
    for i in range(100):
        w.on_first_token(float(i + 1), now=1.0)
        w.on_token_gap(float(i + 1), now=1.0)
    m = w.metrics("a", now=2.0)
    assert m.ttft_p90_ms == 90.0 and m.ttft_p90_low_ms is not None and 80.0 <= m.ttft_p90_low_ms < 90.0
    assert m.itl_p90_low_ms == m.ttft_p90_low_ms
    back = metrics_from_stats("a", w.to_stats_dict(now=2.0))
    assert (back.ttft_p90_low_ms, back.itl_p90_low_ms) == (m.ttft_p90_low_ms, m.itl_p90_low_ms)
    assert metrics_from_stats("a", {}).ttft_p90_low_ms is None  # an older replica: not reported
    assert SignalWindow(clock=lambda: 0.0).metrics("b").ttft_p90_low_ms is None  # no samples


# -- the policy: a marginal p90 holds, a significant one scales up --------------------------


def _marginal(n: int, rate: float, ttft: float, ttft_low: float | None) -> list[WindowMetrics]:
    return [
        WindowMetrics(f"r{i}", ttft, 20.0, 0, 0, 0.1, rate / n, 300.0 * rate / n, 100.0 * rate / n,
                      300.0, 100.0, 0.0, rate / n, rate / n, ttft_low, 18.0)
        for i in range(n)
    ]


def test_a_p90_over_target_within_its_noise_holds_the_fleet_without_learning_an_overload():
    rate = 1.0
    assert need(rate) < 3
    policy = SLOAutoscaler(cfg(look_back_s=30).params(), SLO.params(), PROFILE)
    d = policy.decide(ScalingInput(100.0, 3, 3, _marginal(3, rate, ttft=1050.0, ttft_low=900.0)))
    assert d.replicas == 3 and "not significant" in d.reason  # neither up (r = 1.05) nor down
    assert policy.memory.per_replica is None
    # Once the bound is over the target too, the SLO error adds replicas and is remembered.
    d = policy.decide(ScalingInput(101.0, 3, 3, _marginal(3, rate, ttft=1300.0, ttft_low=1100.0)))
    assert d.replicas > 3 and policy.memory.per_replica is not None


def test_replicas_that_report_no_bound_are_judged_on_their_p90():
    policy = SLOAutoscaler(cfg(look_back_s=30).params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(100.0, 3, 3, _marginal(3, 1.0, ttft=1050.0, ttft_low=None))).replicas > 3


# -- the policy: the recent rate counts when it overloads the fleet ------------------------


def test_a_recent_rate_the_fleet_can_serve_does_not_add_a_replica_but_an_overload_does():
    cap = per_replica_capacity(PROFILE, 300.0, 100.0, SLO.ttft_p90_ms, SLO.itl_p90_ms, 0.8)
    n = 2
    planned, serveable = n * cap.per_replica_rps, n * cap.max_rps
    assert planned < serveable < n * 1000.0 / cap.service_ms
    look_back = planned * 0.95
    within = (planned + serveable) / 2  # over the plan (headroom), under the TTFT cap
    assert need(look_back) == n and need(within) > n
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(0.0, n, n, fleet(n, rate=look_back, recent=within))).replicas == n
    over = serveable * 1.2
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(0.0, n, n, fleet(n, rate=look_back, recent=over))).replicas == need(over)
    # Over the TTFT cap but under utilization 1 is an overload too: the replicas would serve it, past the target.
    short = (serveable + n * 1000.0 / cap.service_ms) / 2
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(0.0, n, n, fleet(n, rate=look_back, recent=short))).replicas == need(short) > n


def test_a_recent_rate_the_fleet_can_serve_still_holds_a_shrink():
    """The look-back rate lags a step's first seconds: a shrink waits while the recent rate
    alone asks for more, overload or not."""
    cap = per_replica_capacity(PROFILE, 300.0, 100.0, SLO.ttft_p90_ms, SLO.itl_p90_ms, 0.8)
    look_back = cap.per_replica_rps * 0.5  # one replica's worth
    recent = 2.5 * cap.per_replica_rps  # three replicas' worth by the plan, serveable by 4
    assert need(look_back) == 1 and need(recent) == 3 and recent < 4 * cap.max_rps
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    d = policy.decide(ScalingInput(0.0, 4, 4, fleet(4, rate=look_back, recent=recent)))
    assert d.replicas == 4 and "held" in d.reason
