"""The recent rate counts once a reading overloads the fleet and for as long as the mean of the readings
since stays over the bar: a step to just over one replica's capacity reads under the bar now and then on
Poisson noise alone, and each such reading made the wish "none" and restarted the upscale delay
(step/low seed 2 on the autoscaling suite: the scale-up acted 29 s after the step instead of 10, and the
minute missed). A spike that ends brings the mean under the bar within a few readings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ScalingInput
from autoscaling.capacity import per_replica_capacity
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.signals import fleet_signals
from kvserve.config import SLOConfig
from tests.unit.test_autoscaling_capacity import NOISY
from tests.unit.test_autoscaling_policies import PROFILE
from tests.unit.test_autoscaling_predictive import cfg, fleet

LOOK_BACK = 0.5  # req/s over the look-back window: one replica's worth
SLO = SLOConfig(ttft_p90_ms=1000.0, itl_p90_ms=500.0)  # the bar (TTFT cap, 0.92 of a replica) is above the plan (0.8)


def need(policy: SLOAutoscaler, rate: float) -> int:
    return policy.model.replicas(fleet_signals(fleet(1, rate=LOOK_BACK)), SLO.params(), rate)


def _bar(policy: SLOAutoscaler) -> float:
    """What one replica serves within the TTFT target: a recent rate over this overloads one replica."""
    return policy.model.per_replica(fleet_signals(fleet(1, rate=LOOK_BACK)), SLO.params()).max_rps


def _dip(policy: SLOAutoscaler) -> float:
    """Over one replica's plan (so the model asks for two) but under the bar: no overload."""
    cap = policy.model.per_replica(fleet_signals(fleet(1, rate=LOOK_BACK)), SLO.params())
    assert cap.per_replica_rps < cap.max_rps
    return (cap.per_replica_rps + cap.max_rps) / 2


def _run(policy: SLOAutoscaler, recent: list[float], current: int = 1) -> int | None:
    """Decisions 1 s apart with these recent rates; the second the fleet grew (None: it did not)."""
    for t, r in enumerate(recent):
        if policy.decide(ScalingInput(100.0 + t, current, current, fleet(current, rate=LOOK_BACK, recent=r))).replicas > current:
            return t
    return None


def test_a_step_whose_recent_rate_dips_under_the_bar_still_scales_up_one_delay_after_it_began():
    policy = SLOAutoscaler(cfg(upscale_delay_s=10).params(), SLO.params(), PROFILE)
    bar = _bar(policy)
    over, dip = 1.3 * bar, _dip(policy)
    assert need(policy, LOOK_BACK) == 1 and need(policy, dip) == 2 and need(policy, over) >= 2
    # Readings under the bar at t=4 and t=8 (each within one recent window of an overload reading).
    assert _run(policy, [dip if t in (4, 8) else over for t in range(20)]) == 10


def test_a_spike_stops_counting_once_the_mean_since_it_falls_under_the_bar():
    policy = SLOAutoscaler(cfg(upscale_delay_s=10).params(), SLO.params(), PROFILE)
    bar = _bar(policy)
    # One overload reading, then readings the plan alone would scale for but that overload nothing.
    assert _run(policy, [1.3 * bar] + [_dip(policy)] * 30) is None
    assert policy.overload is None

def test_an_overload_of_a_smaller_fleet_does_not_count_for_a_larger_one():
    policy = SLOAutoscaler(cfg(upscale_delay_s=0).params(), SLO.params(), PROFILE)
    bar = _bar(policy)
    policy.decide(ScalingInput(100.0, 1, 1, fleet(1, rate=LOOK_BACK, recent=1.3 * bar)))
    assert policy.overload is not None and policy.overload[0] == 1
    # Two replicas now; a recent rate under their bar is no overload of two (and no reason to grow).
    d = policy.decide(ScalingInput(101.0, 2, 2, fleet(2, rate=LOOK_BACK, recent=1.8 * bar)))
    assert d.replicas <= 2


def test_the_overload_reading_round_trips_through_the_state():
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    policy.decide(ScalingInput(100.0, 1, 1, fleet(1, rate=LOOK_BACK, recent=1.3 * _bar(policy))))
    copy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    copy.set_state(policy.get_state())
    assert copy.overload == policy.overload and policy.overload is not None and policy.overload[2] == 1


@settings(max_examples=200, deadline=None)
@given(prompt=st.floats(0, 4000), more=st.floats(0, 4000), output=st.floats(0, 1000), ttft=st.floats(50, 10_000),
       itl=st.floats(5, 500))
def test_the_bar_lies_between_the_plan_and_utilization_1_and_falls_with_longer_prompts(prompt, more, output, ttft, itl):
    cap = per_replica_capacity(NOISY, prompt, output, ttft, itl, 0.8)
    assert cap.per_replica_rps <= cap.max_rps * (1 + 1e-12) <= 1000.0 / cap.service_ms * (1 + 1e-9)
    longer = per_replica_capacity(NOISY, prompt + more, output, ttft, itl, 0.8)
    assert longer.max_rps <= cap.max_rps * (1 + 1e-9)
