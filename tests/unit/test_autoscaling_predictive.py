"""The capacity-led path of the kvserve policy: recent rate, rising trend, measured start-up,
backlog floor, fleet SLO quantile; and that the simulator feeds it the live window's signals."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ScalingInput
from autoscaling.capacity import replicas_needed
import random

from autoscaling.demand import SAMPLE_S as TREND_SAMPLE_S
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.signals import fleet_signals, fleet_slo_ratio
from kvserve.policy_params import AutoscalerParams
from autoscaling.window import SignalWindow, WindowMetrics, metrics_from_stats
from kvserve.config import AutoscalingConfig, SLOConfig
from tests.unit.test_autoscaling_policies import PROFILE

SLO = SLOConfig(ttft_p90_ms=1000.0, itl_p90_ms=100.0)
DEFAULT_STARTUP_S = AutoscalerParams().startup_estimate_s


def predicted(policy: SLOAutoscaler, sig, now: float) -> float:  # type: ignore[no-untyped-def]
    """The rate the policy plans for (recent rate counted), with its ramp forecast."""
    a = policy.arrivals
    return max(a.rate(sig, now, 0.0, True), a.ramp_rate(a.trend_fit(now), 0.0))


def fleet(n: int, rate: float, recent: float | None = None, ttft: float = 200.0, waiting: int = 0,
          prompt: float = 300.0, output: float = 100.0) -> list[WindowMetrics]:
    return [
        WindowMetrics(f"r{i}", ttft, 20.0, waiting, 0, 0.1, rate / n, prompt * rate / n, output * rate / n,
                      prompt, output, 0.0, None if recent is None else recent / n)
        for i in range(n)
    ]


def need(rate: float) -> int:
    return replicas_needed(PROFILE, rate, 300.0, 100.0, SLO.ttft_p90_ms, SLO.itl_p90_ms, 0.8).replicas


def cfg(**kw) -> AutoscalingConfig:  # type: ignore[no-untyped-def]
    base = dict(min_replicas=1, max_replicas=40, upscale_delay_s=0, downscale_delay_s=0, max_step=40)
    return AutoscalingConfig(**{**base, **kw})


def test_recent_rate_scales_up_before_the_look_back_rate_catches_up():
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert need(4.0) < need(20.0)
    d = policy.decide(ScalingInput(0.0, need(4.0), need(4.0), fleet(need(4.0), rate=4.0, recent=20.0)))
    assert d.replicas == need(20.0)
    # A recent rate below the look-back rate does not shrink the demand under the look-back one.
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(0.0, 1, 1, fleet(1, rate=20.0, recent=1.0))).replicas == need(20.0)


def _feed(policy: SLOAutoscaler, rates: list[float], current: int, recent: list[float] | None = None,
          queued: list[float] | None = None) -> int:
    """One decision per second; `rates` are look-back rates, `recent` the recent (5 s) rates."""
    for t, r in enumerate(rates):
        rr = r if recent is None else recent[t]
        q = 0.0 if queued is None else queued[t]
        current = policy.decide(ScalingInput(float(t), current, current, fleet(current, r, rr), queued_requests=q)).replicas
    return current


def test_a_sustained_ramp_is_extrapolated_over_start_up_and_delay():
    slope = 0.2  # req/s per s, well above Poisson noise at these rates
    rates = [2.0 + slope * t for t in range(60)]
    policy = SLOAutoscaler(cfg(upscale_delay_s=5).params(), SLO.params(), PROFILE)
    _feed(policy, rates, 1)
    assert abs(_slope(policy, 59.0) - slope) < 1e-6
    horizon = DEFAULT_STARTUP_S + 5
    sig_rate = rates[-1]
    assert abs(predicted(policy, _sig(sig_rate), 59.0) - (sig_rate + slope * horizon)) < 1e-6


def _slope(policy: SLOAutoscaler, now: float) -> float:
    fit = policy.arrivals.trend_fit(now)
    return fit[1] if fit else 0.0


def _sig(rate: float):  # type: ignore[no-untyped-def]
    return fleet_signals(fleet(1, rate, rate))


def _poisson_rates(rate_at, seconds: int, seed: int) -> list[float]:  # type: ignore[no-untyped-def]
    """Recent (5 s) rates of Poisson arrivals with intensity `rate_at(t)`, one per second."""
    rng = random.Random(seed)
    counts = []
    for t in range(seconds):
        lam, n, acc = rate_at(t), 0, rng.expovariate(1.0)
        while acc < lam:  # arrivals in one second
            n += 1
            acc += rng.expovariate(1.0)
        counts.append(n)
    return [sum(counts[max(0, t - 4): t + 1]) / TREND_SAMPLE_S for t in range(seconds)]


def test_a_noisy_ramp_is_seen_and_its_forecast_leads_the_look_back_rate():
    # The look-back rate of a ramp lags it by half its window; the fitted line does not.
    slope, seconds = 0.3, 90
    rates = [10.0 + slope * max(t - 15, 0) for t in range(seconds)]  # the look-back rate (30 s window)
    recent = _poisson_rates(lambda t: 10.0 + slope * t, seconds, seed=1)
    policy = SLOAutoscaler(cfg(upscale_delay_s=10).params(), SLO.params(), PROFILE)
    _feed(policy, rates, 1, recent)
    now = float(seconds - 1)
    assert 0.5 * slope < _slope(policy, now) < 1.5 * slope
    truth_ahead = 10.0 + slope * (now + DEFAULT_STARTUP_S + 10)
    assert abs(policy.arrivals.ramp_rate(policy.arrivals.trend_fit(now), 0.0) - truth_ahead) < 0.2 * truth_ahead
    assert predicted(policy, _sig(rates[-1]), now) > rates[-1] + slope * (DEFAULT_STARTUP_S + 10)
    # The decision says so (it is logged next to Serve's own scaling line).
    d = policy.decide(ScalingInput(now + 1, 1, 1, fleet(1, rates[-1], recent[-1])))
    assert "ramp forecast: +" in d.reason


def test_a_step_is_not_extrapolated():
    # The recent rate of a step jumps; a line through it does not fit the samples.
    recent = [5.0] * 40 + [20.0] * 15
    rates = [5.0] * 40 + [5.0 + 15.0 * min(t, 30) / 30 for t in range(1, 16)]
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(policy, rates, 1, recent)
    assert _slope(policy, float(len(rates) - 1)) == 0.0


def _forecasts(rate_at, seeds: int) -> int:  # type: ignore[no-untyped-def]
    """Of `seeds` independent minutes of Poisson arrivals at `rate_at(t)`, how many end with a ramp forecast."""
    n = 0
    for seed in range(seeds):
        policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
        _feed(policy, [rate_at(t) for t in range(61)], 1, _poisson_rates(rate_at, 61, seed))
        n += _slope(policy, 60.0) > 0
    return n


def test_a_noisy_step_is_mostly_told_from_a_ramp():
    """At a few requests/s a step's samples can fit a line within Poisson noise; a two-level fit that is
    clearly better (z standard errors) says step, so no forecast. A ramp over the same range is still seen."""
    assert _forecasts(lambda t: 1.0 if t < 40 else 3.0, 200) <= 100  # a line alone: 129 of 200
    assert _forecasts(lambda t: 1.0 + 3.0 * t / 60, 200) >= 170  # 185 of 200 (a line alone: 190)


@settings(max_examples=60, deadline=None)
@given(ys=st.lists(st.floats(0, 100), min_size=2, max_size=24), k=st.integers(1, 23), a=st.floats(0, 50),
       b=st.floats(0, 50))
def test_the_two_level_fit_is_never_worse_than_one_level_and_exact_on_a_step(ys, k, a, b):
    from autoscaling.demand import _step_sse

    pts = [(5.0 * i, y) for i, y in enumerate(ys)]
    mean = sum(ys) / len(ys)
    assert _step_sse(pts) <= sum((y - mean) ** 2 for y in ys) + 1e-6
    k = min(k, len(ys) - 1)
    assert _step_sse([(5.0 * i, a if i < k else b) for i in range(len(ys))]) < 1e-6


def test_flat_poisson_loads_rarely_read_as_ramps():
    """Over 200 independent minutes of a flat Poisson load, a significant, fitting rise is rare:
    the false-alarm rate of a 2.5-sigma one-sided test is ~0.6%."""
    alarms = 0
    for seed in range(200):
        level = 2.0 + (seed % 10) * 8.0
        recent = _poisson_rates(lambda t: level, 61, seed)
        policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
        _feed(policy, [level] * 61, need(level), recent)
        alarms += _slope(policy, 60.0) > 0
    assert alarms <= 6


@settings(max_examples=60, deadline=None)
@given(level=st.floats(1, 80), noise=st.lists(st.floats(-0.5, 0.5), min_size=60, max_size=60))
def test_flat_noisy_rate_has_no_trend(level, noise):
    """Jitter of the size a 30 s window shows on a flat load never reads as a ramp."""
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(policy, [level + n * min(level, 10) ** 0.5 / 10 for n in noise], need(level))
    assert _slope(policy, 59.0) * DEFAULT_STARTUP_S < max(level, 1.0) * 0.5


def test_samples_taken_while_the_routers_queue_grows_are_left_out():
    # Saturated from t = 34 s: the replicas admit a flat 20 req/s while arrivals keep rising and
    # the routers' queue grows. Those samples are service rates; fitting them would bend (and
    # reject) the line. From t = 50 s the queue's (window-peak) size stays flat: samples count again.
    slope, seconds = 0.3, 60
    recent = [min(10.0 + slope * t, 20.0) for t in range(seconds)]
    queued = [0.0 if t < 34 else 5.0 * (min(t, 50) - 33) for t in range(seconds)]
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(policy, recent, 1, recent, queued)
    left_out = [t for t, _, ok in policy.arrivals.samples if not ok]
    assert left_out and min(left_out) >= 34 and max(left_out) <= 50
    restored = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    restored.set_state(json.loads(json.dumps(policy.get_state())))
    assert restored.arrivals.samples == policy.arrivals.samples
    # The same rise without the queue's samples in it is the clean line through the first 35 s.
    clean = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(clean, recent[:34], 1, recent[:34])
    assert abs(_slope(clean, 33.0) - slope) < 1e-6


def test_no_forecast_while_the_newest_sample_is_left_out():
    # A clean rise for 40 s, then the routers' queue grows: the newest samples are left out, and a
    # line through the older ones would be extrapolated across the gap (a step's first seconds,
    # with replicas still starting, read as a steep ramp). No forecast until a sample counts again.
    slope = 0.3
    recent = [10.0 + slope * t for t in range(60)]
    queued = [0.0 if t < 40 else 5.0 * (t - 39) for t in range(50)] + [50.0] * 10
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    fits = []
    for t in range(60):
        policy.decide(ScalingInput(float(t), 1, 1, fleet(1, recent[t], recent[t]), queued_requests=queued[t]))
        fits.append(policy.arrivals.trend_fit(float(t)))
    assert fits[39] is not None and all(f is None for f in fits[40:50])
    assert fits[-1] is not None  # the queue stopped growing: samples count again


@settings(max_examples=60, deadline=None)
@given(base=st.floats(1.0, 20.0), slope=st.floats(0.1, 1.0), n=st.integers(50, 90), grow=st.integers(6, 20))
def test_never_a_forecast_while_the_routers_queue_grows(base, slope, n, grow):
    """However clean the rise before, while the routers' queue grows (the newest sample left out) no
    ramp is read: the arrival estimate is then the admitted rate plus the queue's growth."""
    rates = [base + slope * t for t in range(n)]
    queued = [0.0] * (n - grow) + [5.0 * (k + 1) for k in range(grow)]
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    for t in range(n):
        policy.decide(ScalingInput(float(t), 1, 1, fleet(1, rates[t], rates[t]), queued_requests=queued[t]))
    assert not policy.arrivals.samples[-1][2]
    assert policy.arrivals.trend_fit(float(n - 1)) is None


def test_a_burst_shorter_than_half_the_fit_window_is_not_a_ramp():
    # 20 s of a steep, clean rise: four samples, a perfect line, and still no forecast.
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(policy, [5.0 + 0.5 * t for t in range(20)], 1)
    assert policy.arrivals.trend_fit(19.0) is None
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    _feed(policy, [5.0 + 0.5 * t for t in range(40)], 1)  # 40 s of it: a ramp
    assert _slope(policy, 39.0) > 0


def test_start_up_time_is_measured_from_the_replicas_asked_for():
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    ms = fleet(1, 5.0, 5.0)
    policy.decide(ScalingInput(0.0, 1, 1, ms))
    policy.decide(ScalingInput(1.0, 3, 1, ms))  # two replicas starting
    policy.decide(ScalingInput(12.0, 3, 2, ms))
    policy.decide(ScalingInput(18.0, 3, 3, ms))  # all serving: 17 s after the first was pending
    assert policy.arrivals.startup_s == 17.0
    restored = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    restored.set_state(json.loads(json.dumps(policy.get_state())))
    assert restored.arrivals.startup_s == 17.0 and restored.arrivals.running_rose_at == 18.0


def test_an_slo_violation_waits_for_the_fleet_to_settle_then_scales_up():
    policy = SLOAutoscaler(cfg(look_back_s=30).params(), SLO.params(), PROFILE)
    low = fleet(2, 1.0, 1.0)
    policy.decide(ScalingInput(0.0, 2, 1, fleet(1, 1.0, 1.0)))
    policy.decide(ScalingInput(1.0, 2, 2, low))  # the second replica just started serving
    assert need(2.0) == 2  # the capacity model alone holds 2
    hot = fleet(2, 2.0, 2.0, ttft=3000.0)  # r = 3
    assert policy.decide(ScalingInput(10.0, 2, 2, hot)).replicas == 2  # window still holds the start-up
    # Settled: r adds replicas; as the model says 2 carry the rate, x1.5 at most (not 2 x 3).
    assert policy.decide(ScalingInput(31.0, 2, 2, hot)).replicas == 3


def test_an_slo_driven_upscale_is_capped_at_four_times_the_fleet():
    policy = SLOAutoscaler(cfg(look_back_s=30).params(), SLO.params(), PROFILE)
    policy.decide(ScalingInput(0.0, 2, 2, fleet(2, 1.0, 1.0)))
    hot = fleet(2, 4.0, 4.0, ttft=10_000.0)  # r = 10, and the model asks for 3
    assert policy.decide(ScalingInput(31.0, 2, 2, hot)).replicas == 8


@given(n=st.integers(1, 12), r=st.floats(1.2, 50.0))
@settings(max_examples=60, deadline=None)
def test_an_slo_upscale_the_capacity_model_does_not_explain_grows_by_half_at_most(n, r):
    # The rate is one that a single replica carries: r > 1 then comes from what the model
    # does not see (long prompts queued on a few replicas), and at most ceil(1.5 n) are asked for.
    assert need(1.0) == 1
    policy = SLOAutoscaler(cfg(look_back_s=30).params(), SLO.params(), PROFILE)
    policy.decide(ScalingInput(0.0, n, n, fleet(n, 1.0, 1.0)))
    d = policy.decide(ScalingInput(31.0, n, n, fleet(n, 1.0, 1.0, ttft=1000.0 * r)))
    assert n + 1 <= d.replicas <= max(n + 1, math.ceil(1.5 * n))
    assert d.replicas == max(n + 1, min(math.ceil(n * r - 1e-9), math.ceil(1.5 * n), 4 * n))
    if math.ceil(n * r - 1e-9) > d.replicas:
        assert "1.5 at most" in d.reason


def test_one_backlogged_replica_is_not_a_fleet_violation():
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    ms = fleet(4, 4.0, 4.0)
    backlogged = WindowMetrics("r0", 40_000.0, 20.0, 500, 32, 0.9, 1.0, 300.0, 100.0, 300.0, 100.0, 0.0, 0.05)
    r = fleet_slo_ratio([backlogged, *ms[1:]], SLO.params(), policy.cfg.fleet_ratio_quantile)
    assert r is not None and r < 1
    # ... but it keeps capacity for its queue: no scale-down onto it.
    d = policy.decide(ScalingInput(0.0, 4, 4, [backlogged, *ms[1:]]))
    assert d.replicas == 4
    # Without the queue, the same fleet shrinks to the modelled demand.
    policy = SLOAutoscaler(cfg().params(), SLO.params(), PROFILE)
    assert policy.decide(ScalingInput(0.0, 4, 4, ms)).replicas == need(4.0) < 4


def test_scale_down_goes_to_the_modelled_demand_in_one_decision():
    policy = SLOAutoscaler(cfg(downscale_delay_s=30).params(), SLO.params(), PROFILE)
    ms = fleet(8, 3.0, 3.0)
    assert policy.decide(ScalingInput(0.0, 8, 8, ms)).replicas == 8
    assert policy.decide(ScalingInput(30.0, 8, 8, ms)).replicas == need(3.0)


# -- the window's new signals ----------------------------------------------------------------

def test_window_reports_the_recent_rate_and_it_round_trips():
    w = SignalWindow(look_back_s=30.0, recent_s=5.0, clock=lambda: 0.0)
    for i in range(250):  # 10 req/s for 25 s ...
        w.on_arrival(100, now=i * 0.1)
    for i in range(200):  # ... then 40 req/s for 5 s
        w.on_arrival(100, now=25.0 + i * 0.025)
    m = w.metrics("a", now=30.0)
    assert abs(m.recent_requests_per_s - 40.0) < 2.5  # 5 s span: sees the step
    assert abs(m.requests_per_s - 15.0) < 0.5  # 30 s span: still mostly the old load
    back = metrics_from_stats("a", w.to_stats_dict(now=30.0))
    assert back.recent_requests_per_s == m.recent_requests_per_s
    assert metrics_from_stats("a", {}).recent_requests_per_s is None  # older replicas: unknown


def test_token_gap_count_records_each_token():
    w = SignalWindow(look_back_s=10.0, max_samples=100, clock=lambda: 0.0)
    w.on_token_gap(5.0, now=1.0, count=8)
    w.on_token_gap(50.0, now=1.0, count=2)
    assert len(w.itl_samples(now=1.0)) == 10
    assert w.itl_p90_ms(now=1.0) == 50.0  # nearest rank 9 of 10: one of the two 50 ms tokens
    w.on_token_gap(1.0, now=2.0, count=1000)  # bounded by max_samples
    assert len(w.itl_samples(now=2.0)) == 100


# -- the simulator feeds the policy what live replicas report --------------------------------

def test_simulator_hands_the_policy_window_metrics():
    from autoscaling.base import Decision, ScalingPolicy
    from simulator.cluster import Cluster, ScalingSetup
    from simulator.engine import EngineSettings
    from simulator.workloads import TenantMix, generated
    from router.registry import make_policy
    from tests.unit.test_sim_cluster import LINEAR

    class Spy(ScalingPolicy):
        name = "spy"
        seen: list[ScalingInput] = []

        def decide(self, inp: ScalingInput) -> Decision:
            self.seen.append(inp)
            return Decision(1, "hold")

    wl = generated("step", TenantMix(tenants=3, system_tokens=32, question_tokens=8, output_tokens=20), 4,
                   rate=20.0, phase_s=10.0, seed=1)
    eng = EngineSettings(block_size=4, kv_blocks=256, max_num_seqs=4, max_batched_tokens=64)
    spy = Spy()
    Cluster(wl, LINEAR, eng, make_policy("round_robin"), replicas=0,
            scaling=ScalingSetup(spy, AutoscalingConfig(min_replicas=1, max_replicas=1), 1.0, 0.5)).run()
    ms = [m for inp in spy.seen for m in inp.metrics]
    assert ms and all(isinstance(m, WindowMetrics) and m.recent_requests_per_s is not None for m in ms)
    # In the 4x phase (10-20 s) the recent rate leads the look-back rate.
    mid = [m for inp in spy.seen if 11.0 <= inp.now <= 14.0 for m in inp.metrics]
    assert all(m.recent_requests_per_s > m.requests_per_s for m in mid)
    assert any(m.ttft_p90_ms is not None and m.itl_p90_ms is not None for m in ms)


def test_trend_samples_are_never_two_of_one_stats_report():
    # look_back_s 60: replicas push stats every 10 s, so a 5 s sampler would read each report twice.
    policy = SLOAutoscaler(cfg(look_back_s=60).params(), SLO.params(), PROFILE)
    _feed(policy, [10.0 + 0.3 * t for t in range(60)], 1)
    times = [t for t, _, _ in policy.arrivals.samples]
    assert min(b - a for a, b in zip(times, times[1:])) >= 10.0
