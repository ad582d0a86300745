from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ReplicaMetrics, ScalingInput
from autoscaling.policies.fixed_max import FixedMaxPolicy
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.policies.serve_default import ServeDefaultPolicy
from autoscaling.registry import autoscaler_names, make_autoscaler
from autoscaling.window import WindowMetrics
from kvserve.config import AutoscalingConfig, SLOConfig
from kvserve.perf_model import EngineProfile

SLO = SLOConfig(ttft_p90_ms=1000.0, itl_p90_ms=100.0)

PROFILE = EngineProfile.from_dict(
    {
        "block_size": 16,
        "kv_cache_tokens": 65_536,
        "prefill": [
            {"prompt_tokens": 64, "cached_fraction": 0.0, "ttft_ms": 40.0},
            {"prompt_tokens": 512, "cached_fraction": 0.0, "ttft_ms": 250.0},
            {"prompt_tokens": 2048, "cached_fraction": 0.0, "ttft_ms": 1000.0},
        ],
        "decode": [
            {"context_tokens": 512, "batch": 1, "itl_ms": 20.0},
            {"context_tokens": 512, "batch": 8, "itl_ms": 40.0},
            {"context_tokens": 512, "batch": 32, "itl_ms": 120.0},
        ],
    }
)


def fleet(n: int, rate: float, ttft: float | None, itl: float | None, prompt=300.0, output=100.0, hit=0.0,
          waiting=0, running=0) -> list[ReplicaMetrics]:
    return [
        ReplicaMetrics(f"r{i}", ttft, itl, waiting, running, 0.1, rate / n, prompt * rate / n,
                       output * rate / n, prompt, output, hit)
        for i in range(n)
    ]


def step(now: float, current: int, metrics, running: int | None = None, ongoing: float = 0.0) -> ScalingInput:
    return ScalingInput(now, current, current if running is None else running, metrics, ongoing)


configs = st.builds(
    lambda lo, span, up, down, step_, hyst: AutoscalingConfig(
        min_replicas=lo, max_replicas=max(lo + span, 1), upscale_delay_s=up, downscale_delay_s=down,
        max_step=step_, hysteresis=hyst,
    ),
    st.integers(0, 3), st.integers(0, 12), st.sampled_from([0.0, 3.0, 10.0]),
    st.sampled_from([0.0, 5.0, 30.0]), st.integers(1, 5), st.floats(0.3, 0.9),
)
loads = st.fixed_dictionaries({
    "rate": st.floats(0, 100, allow_nan=False),
    "ttft": st.floats(0, 5000, allow_nan=False),
    "itl": st.floats(0, 500, allow_nan=False),
    "prompt": st.floats(0, 3000, allow_nan=False),
    "output": st.floats(0, 500, allow_nan=False),
})
gate_states = st.fixed_dictionaries({
    "gate": st.fixed_dictionaries({"direction": st.sampled_from([-1, 0, 1]),
                                   "since": st.one_of(st.none(), st.floats(0, 100))}),
    "overload_per_replica": st.one_of(st.none(), st.floats(0.01, 50)),
})


def make_kvserve(cfg: AutoscalingConfig, with_profile: bool) -> SLOAutoscaler:
    """`with_profile` False: a model nobody measured (a conservative estimate fitted online)."""
    return SLOAutoscaler(cfg.params(), SLO.params(), PROFILE if with_profile else None)


def per_replica_rps(prompt: float = 300.0, output: float = 100.0) -> float:
    from autoscaling.capacity import per_replica_capacity

    return per_replica_capacity(PROFILE, prompt, output, SLO.ttft_p90_ms, SLO.itl_p90_ms, 0.8).per_replica_rps


R1 = 0.5 * per_replica_rps()  # a rate the capacity model gives one replica


# -- properties of every policy ---------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(cfg=configs, name=st.sampled_from(["fixed_max", "serve_default", "kvserve"]), n=st.integers(1, 6),
       current=st.integers(0, 20), load=loads, ongoing=st.floats(0, 500), now=st.floats(0, 1000))
def test_decisions_respect_min_max_bounds(cfg, name, n, current, load, ongoing, now):
    policy = make_autoscaler(name, cfg.params(), SLO.params(), PROFILE)
    ms = fleet(n, load["rate"], load["ttft"], load["itl"], load["prompt"], load["output"])
    d = policy.decide(step(now, current, ms, ongoing=ongoing))
    assert cfg.min_replicas <= d.replicas <= cfg.max_replicas


@settings(max_examples=200, deadline=None)
@given(cfg=configs, with_profile=st.booleans(), n=st.integers(1, 6), load=loads, state=gate_states,
       data=st.data())
def test_kvserve_respects_max_step(cfg, with_profile, n, load, state, data):
    current = data.draw(st.integers(cfg.min_replicas, cfg.max_replicas))
    policy = make_kvserve(cfg, with_profile)
    policy.set_state(state)
    ms = fleet(n, load["rate"], load["ttft"], load["itl"], load["prompt"], load["output"])
    d = policy.decide(step(200.0, current, ms))
    assert abs(d.replicas - current) <= cfg.max_step


@settings(max_examples=100, deadline=None)
@given(cfg=configs, with_profile=st.booleans(), state=gate_states, now=st.floats(0, 1000), data=st.data())
def test_kvserve_holds_with_no_data(cfg, with_profile, state, now, data):
    current = data.draw(st.integers(max(cfg.min_replicas, 1), cfg.max_replicas))
    policy = make_kvserve(cfg, with_profile)
    policy.set_state(state)
    for t in range(50):  # however long the silence lasts
        assert policy.decide(step(now + t * 10, current, [], ongoing=100.0)).replicas == current


# -- monotone in load -------------------------------------------------------------------------

def _dominating(lo: dict, data) -> dict:
    return {k: v + data.draw(st.floats(0, 1000, allow_nan=False), label=k) for k, v in lo.items()}


@settings(max_examples=300, deadline=None)
@given(cfg=configs, with_profile=st.booleans(), n=st.integers(1, 6), lo=loads, state=gate_states,
       now=st.floats(0, 300), data=st.data())
def test_kvserve_more_load_never_yields_fewer_replicas(cfg, with_profile, n, lo, state, now, data):
    hi = _dominating(lo, data)
    current = data.draw(st.integers(cfg.min_replicas, cfg.max_replicas))
    running = data.draw(st.integers(0, current))
    decisions = []
    for load in (lo, hi):
        policy = make_kvserve(cfg, with_profile)
        policy.set_state(json.loads(json.dumps(state)))
        ms = fleet(n, load["rate"], load["ttft"], load["itl"], load["prompt"], load["output"])
        decisions.append(policy.decide(step(now, current, ms, running=running)).replicas)
    assert decisions[0] <= decisions[1]


@settings(max_examples=200, deadline=None)
@given(cfg=configs, a=st.floats(0, 500), b=st.floats(0, 500), state=gate_states, now=st.floats(0, 300),
       data=st.data())
def test_serve_default_more_ongoing_never_yields_fewer_replicas(cfg, a, b, state, now, data):
    current = data.draw(st.integers(cfg.min_replicas, cfg.max_replicas))
    out = []
    for ongoing in sorted((a, b)):
        policy = ServeDefaultPolicy(cfg.params())
        policy.set_state({"gate": state["gate"]})
        out.append(policy.decide(step(now, current, [], ongoing=ongoing)).replicas)
    assert out[0] <= out[1]


# -- cooldowns --------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(cfg=configs, with_profile=st.booleans(),
       trace=st.lists(st.tuples(st.floats(0.1, 5), loads), min_size=1, max_size=80))
def test_changes_only_after_the_wish_persisted_for_its_delay(cfg, with_profile, trace):
    """Closed loop over an arbitrary load trace: an upscale happens only after >= upscale_delay_s
    since the previous change (or start), a downscale likewise with downscale_delay_s."""
    for policy in (make_kvserve(cfg, with_profile), ServeDefaultPolicy(cfg.params())):
        # From zero both policies cold-start at once by design; start from one replica.
        current, now, last_change = max(cfg.min_replicas, 1), 0.0, 0.0
        for gap, load in trace:
            now += gap
            ms = fleet(max(current, 1), load["rate"], load["ttft"], load["itl"], load["prompt"], load["output"])
            new = policy.decide(step(now, current, ms, ongoing=load["rate"])).replicas
            if new > current and current > 0:  # (from zero: cold start, immediate by design)
                assert now - last_change >= cfg.upscale_delay_s - 1e-6
            elif new < current:
                assert now - last_change >= cfg.downscale_delay_s - 1e-6
            if new != current:
                last_change, current = now, new


def test_an_interrupted_wish_restarts_the_delay():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=10, downscale_delay_s=60)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    hot = fleet(1, R1, ttft=2000.0, itl=50.0)  # r = 2 -> wants 2 (the model says 1 carries it: x1.5)
    ok = fleet(1, R1, ttft=800.0, itl=50.0)  # r = 0.8 -> hold
    assert policy.decide(step(0, 1, hot)).replicas == 1
    assert policy.decide(step(8, 1, ok)).replicas == 1  # wish interrupted
    assert policy.decide(step(12, 1, hot)).replicas == 1  # clock restarted at 12
    assert policy.decide(step(21, 1, hot)).replicas == 1
    assert policy.decide(step(22, 1, hot)).replicas == 2


# -- no flapping ------------------------------------------------------------------------------

def _directions(traj: list[int]) -> list[int]:
    moves = [b - a for a, b in zip(traj, traj[1:]) if b != a]
    return [1 if m > 0 else -1 for m in moves]


@settings(max_examples=150, deadline=None)
@given(cfg=configs, with_profile=st.booleans(), n=st.integers(1, 6), load=loads, data=st.data())
def test_constant_signals_move_in_one_direction_only(cfg, with_profile, n, load, data):
    """Fed the same metrics every tick (closed loop on the replica count), the count never reverses."""
    current = data.draw(st.integers(cfg.min_replicas, cfg.max_replicas))
    policy = make_kvserve(cfg, with_profile)
    ms = fleet(n, load["rate"], load["ttft"], load["itl"], load["prompt"], load["output"])
    if not with_profile:
        # An online fit starts conservative (it may over-provision first, then trim): once it
        # has converged on the steady reports, the count no longer reverses.
        for _ in range(300):
            policy.fit.observe(ms)  # type: ignore[union-attr]
    traj = [current]
    for t in range(300):
        current = policy.decide(step(float(t), current, ms)).replicas
        traj.append(current)
    dirs = _directions(traj)
    assert len(set(dirs)) <= 1
    r = max(load["ttft"] / SLO.ttft_p90_ms, load["itl"] / SLO.itl_p90_ms)
    # A steady, SLO-meeting load changes the decision at most once.
    if r <= 1 and cfg.max_step >= cfg.max_replicas:
        assert len(dirs) <= 1


def plant(rate: float, n: int, mu: float, ttft0: float, itl0: float) -> list[ReplicaMetrics]:
    """A replica fleet whose latency rises steeply with per-replica utilization."""
    rho = min(rate / (max(n, 1) * mu), 0.995)
    return fleet(max(n, 1), rate, ttft=ttft0 / (1 - rho), itl=itl0 * (1 + 2 * rho), prompt=300, output=100)


@settings(max_examples=150, deadline=None)
@given(cfg=configs, with_profile=st.booleans(), rate=st.floats(0.1, 60), mu=st.floats(0.5, 10),
       ttft0=st.floats(50, 900), itl0=st.floats(5, 60), start_at_max=st.booleans())
def test_steady_load_through_a_latency_plant_settles_without_flapping(
    cfg, with_profile, rate, mu, ttft0, itl0, start_at_max
):
    """Flapping = going back to a replica count that already broke the SLO. On a steady load the
    policy may overshoot and trim, or undershoot once and learn, but never returns to a count it
    had to leave because of an SLO violation, and it settles."""
    ticks = (800 if with_profile else 400) + 2 * cfg.max_replicas * int(cfg.downscale_delay_s + 1)
    # Within the overload memory's lifetime (its expiry is tested apart below).
    cfg = cfg.model_copy(update={"overload_memory_s": ticks + 1.0, "overload_memory_max_s": ticks + 1.0})
    policy = make_kvserve(cfg, with_profile)
    # (A zero-replica fleet reports nothing; from zero it is the cold-start path, tested apart.)
    current = cfg.max_replicas if start_at_max else max(cfg.min_replicas, 1)
    traj = [current]
    left_in_violation: list[int] = []
    # With a profile an SLO-driven step waits for the window to refresh (look_back_s) after the
    # previous rise, so climbing max_replicas one step at a time takes up to ~15 x 41 ticks.
    # Without one a comfortable fleet sheds one replica per downscale delay, and may do that
    # twice (down to a count that breaks the SLO, up in proportion, down to the remembered floor).
    for t in range(ticks):
        ms = plant(rate, current, mu, ttft0, itl0)
        new = policy.decide(step(float(t), current, ms)).replicas
        assert all(new > bad for bad in left_in_violation), (traj, new)
        if new > current and ms[0].ttft_p90_ms > SLO.ttft_p90_ms:
            left_in_violation.append(current)
        current = new
        traj.append(current)
    assert len(set(traj[-100:])) == 1  # settled


# -- signals, capacity and hysteresis ---------------------------------------------------------

def test_slo_violation_scales_up_in_proportion():
    # Up to `max_slo_factor_within_capacity` when the model says the fleet carries the rate.
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=10, upscale_delay_s=0, max_step=10,
                            max_slo_factor_within_capacity=4.0)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    d = policy.decide(step(0, 2, fleet(2, 2 * R1, ttft=2500.0, itl=50.0)))  # r = 2.5
    assert d.replicas == 5
    capped = SLOAutoscaler(AutoscalingConfig(min_replicas=1, max_replicas=10, upscale_delay_s=0, max_step=10).params(),
                           SLO.params(), PROFILE)
    assert capped.decide(step(0, 2, fleet(2, 2 * R1, ttft=2500.0, itl=50.0))).replicas == 3  # x1.5 by default


def test_itl_violation_alone_scales_up():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=10, upscale_delay_s=0)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    assert policy.decide(step(0, 2, fleet(2, 2 * R1, ttft=100.0, itl=150.0))).replicas == 3


def test_capacity_model_drives_scale_up_before_latency_degrades():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=20, upscale_delay_s=0, max_step=20)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    ms = fleet(1, 30.0, ttft=300.0, itl=30.0, prompt=400, output=100)  # latency fine, rate high
    d = policy.decide(step(0, 1, ms))
    from autoscaling.capacity import replicas_needed

    expected = replicas_needed(PROFILE, 30.0, 400, 100, SLO.ttft_p90_ms, SLO.itl_p90_ms, cfg.headroom).replicas
    assert expected > 1 and d.replicas == min(expected, cfg.max_replicas)


def test_cached_prefixes_reduce_capacity_demand():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=50, upscale_delay_s=0, max_step=50)
    cold = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE).decide(step(0, 1, fleet(1, 30.0, 300.0, 30.0, 1500, 50, hit=0.0)))
    warm = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE).decide(step(0, 1, fleet(1, 30.0, 300.0, 30.0, 1500, 50, hit=0.8)))
    assert warm.replicas < cold.replicas


def test_idle_fleet_goes_to_min_after_the_downscale_delay():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, downscale_delay_s=60)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    idle = fleet(3, 0.0, None, None)
    assert policy.decide(step(0, 3, idle)).replicas == 3
    assert policy.decide(step(59, 3, idle)).replicas == 3
    assert policy.decide(step(60, 3, idle)).replicas == 1


def test_cold_start_from_zero():
    cfg = AutoscalingConfig(min_replicas=0, max_replicas=3, upscale_delay_s=30)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), None)
    assert policy.decide(step(0, 0, [], running=0, ongoing=0)).replicas == 0
    assert policy.decide(step(1, 0, [], running=0, ongoing=2)).replicas == 1


def test_no_further_slo_upscale_while_replicas_are_starting():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=8, upscale_delay_s=0)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    assert policy.decide(step(0, 3, fleet(2, R1, 3000.0, 50.0), running=2)).replicas == 3


def test_overload_memory_prevents_the_one_two_one_flap():
    # The profile is optimistic here: it gives one replica the rate R1, which breaks the SLO there.
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=0)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    assert policy.decide(step(0, 1, fleet(1, R1, 1500.0, 50.0))).replicas == 2
    # At two replicas latency collapses far below target; the same rate must not go back to 1.
    assert policy.decide(step(1, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2
    # When the load really falls, it may.
    assert policy.decide(step(2, 2, fleet(2, 0.4 * R1, 100.0, 20.0))).replicas == 1


def _overloaded_then_comfortable(policy: SLOAutoscaler, t: float) -> None:
    """At 1 replica, R1 breaks the SLO (memory learnt); at 2 it is comfortable."""
    assert policy.decide(step(t, 1, fleet(1, R1, 1500.0, 50.0))).replicas == 2
    assert policy.decide(step(t + 1, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2


def test_overload_memory_expires_after_its_lifetime():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=0,
                            overload_memory_s=300)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    _overloaded_then_comfortable(policy, 0.0)
    assert policy.decide(step(299, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2
    assert policy.decide(step(300, 2, fleet(2, R1, 100.0, 20.0))).replicas == 1
    assert policy.memory.per_replica is None


def test_a_premature_expiry_doubles_the_memory_lifetime_up_to_its_cap():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=0,
                            overload_memory_s=100, overload_memory_max_s=300)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    _overloaded_then_comfortable(policy, 0.0)
    assert policy.decide(step(100, 2, fleet(2, R1, 100.0, 20.0))).replicas == 1  # expired at 100
    _overloaded_then_comfortable(policy, 150.0)  # back within 100 s: the expiry was premature
    assert policy.memory.ttl_s == 200
    assert policy.decide(step(349, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2
    assert policy.decide(step(350, 2, fleet(2, R1, 100.0, 20.0))).replicas == 1
    _overloaded_then_comfortable(policy, 360.0)
    assert policy.memory.ttl_s == 300  # 400, capped
    assert policy.decide(step(659, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2
    assert policy.decide(step(660, 2, fleet(2, R1, 100.0, 20.0))).replicas == 1
    # An overload long after the last expiry is a new one: the lifetime stays, it does not double.
    _overloaded_then_comfortable(policy, 2000.0)
    assert policy.memory.ttl_s == 300 and policy.memory.until == 2300


def test_on_a_steady_load_the_flaps_after_expiries_grow_geometrically_apart():
    """A steady load that one replica cannot carry and two carry comfortably (the case the memory
    exists for): each expiry costs one return to one replica, but each return doubles the memory's
    lifetime, so over 6 hours there are only ~log2(cap / base) + rest / cap of them."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=0,
                            overload_memory_s=300, overload_memory_max_s=3600)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    current, shrinks = 2, []
    for t in range(6 * 3600):
        ms = plant(R1, current, mu=1.05 * R1, ttft0=150.0, itl0=10.0)  # r = 3.2 at one, 0.14 at two
        new = policy.decide(step(float(t), current, ms)).replicas
        if new < current:
            shrinks.append(t)
        current = new
    gaps = [b - a for a, b in zip(shrinks, shrinks[1:])]
    assert len(gaps) >= 5 and all(g >= min(300 * 2**k, 3600) for k, g in enumerate(gaps))
    assert len(shrinks) <= 1 + 4 + 5  # the first; after lifetimes 300 to 2400; then at most hourly


def test_overload_memory_lifetime_survives_a_state_round_trip():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=2, upscale_delay_s=0, downscale_delay_s=0,
                            overload_memory_s=100, overload_memory_max_s=300)
    a = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    _overloaded_then_comfortable(a, 0.0)
    a.decide(step(100, 2, fleet(2, R1, 100.0, 20.0)))
    _overloaded_then_comfortable(a, 150.0)
    b = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    b.set_state(json.loads(json.dumps(a.get_state())))
    assert (b.memory.per_replica, b.memory.until, b.memory.ttl_s, b.memory.expired_at) == (
        a.memory.per_replica, 350.0, 200.0, 100.0)
    assert b.decide(step(349, 2, fleet(2, R1, 100.0, 20.0))).replicas == 2
    assert b.decide(step(350, 2, fleet(2, R1, 100.0, 20.0))).replicas == 1


def test_overload_memory_lifetime_must_not_exceed_its_cap():
    with pytest.raises(ValueError, match="overload_memory_s"):
        AutoscalingConfig(overload_memory_s=600, overload_memory_max_s=300)


def _with_recent(ms: list[ReplicaMetrics], recent_total: float) -> list[ReplicaMetrics]:
    return [dataclasses.replace(m, recent_requests_per_s=recent_total / len(ms)) for m in ms]


def test_recent_rate_noise_does_not_restart_the_downscale_delay():
    """The look-back rate needs 2 replicas; the 5 s recent rate flickers across the 3-replica
    boundary every few ticks (Poisson noise). Shrinking is planned on the look-back rate, so
    the downscale wish persists and lands after its delay."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=6, upscale_delay_s=10, downscale_delay_s=30)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    from autoscaling.capacity import per_replica_capacity

    per = per_replica_capacity(PROFILE, 300, 100, SLO.ttft_p90_ms, SLO.itl_p90_ms, cfg.headroom).per_replica_rps
    lookback, spike = 1.5 * per, 2.2 * per  # 2 replicas vs 3 replicas
    decisions = []
    for t in range(40):
        recent = spike if t % 4 == 0 else lookback
        ms = _with_recent(fleet(3, lookback, ttft=200.0, itl=30.0), recent)
        decisions.append(policy.decide(step(float(t), 3, ms)).replicas)
    assert decisions[:30] == [3] * 30
    assert decisions[30] == 2


def test_a_due_shrink_waits_while_the_recent_rate_needs_the_replicas():
    """The look-back rate (lagging a load step) asks for 1 replica, the recent rate for the 2 in
    place: the shrink's delay runs out but it does not act; once the recent rate agrees it acts
    at once, without a new delay."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=5, downscale_delay_s=30)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    from autoscaling.capacity import per_replica_capacity

    per = per_replica_capacity(PROFILE, 300, 100, SLO.ttft_p90_ms, SLO.itl_p90_ms, cfg.headroom).per_replica_rps
    step_start = _with_recent(fleet(2, 0.3 * per, ttft=200.0, itl=30.0), 1.5 * per)
    quiet = _with_recent(fleet(2, 0.3 * per, ttft=200.0, itl=30.0), 0.3 * per)
    assert [policy.decide(step(float(t), 2, step_start)).replicas for t in range(60)] == [2] * 60
    d = policy.decide(step(60.0, 2, quiet))
    assert d.replicas == 1, d.reason


@pytest.mark.parametrize("with_profile", [True])
def test_a_p90_over_a_handful_of_requests_does_not_add_replicas(with_profile):
    """0.3 req/s over a 30 s window: 9 requests, whose p90 is their slowest (a fresh replica's
    cold prompt). Nothing is queued, so the policy holds; it adds a replica once the same p90
    comes from enough requests, or while requests are queued."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=0, look_back_s=30)

    def decide(rate, waiting=0):
        policy = make_kvserve(cfg, with_profile)
        return policy.decide(step(0.0, 1, fleet(1, rate, ttft=1600.0, itl=30.0, prompt=100, output=20,
                                                waiting=waiting)))

    held = decide(0.3)
    assert held.replicas == 1 and "fewer than 10 requests" in held.reason
    assert policy_overload_unset(cfg, with_profile, 0.3)
    assert decide(0.3, waiting=2).replicas == 2
    assert decide(1.0).replicas == 2


def policy_overload_unset(cfg, with_profile, rate) -> bool:
    policy = make_kvserve(cfg, with_profile)
    policy.decide(step(0.0, 1, fleet(1, rate, ttft=1600.0, itl=30.0, prompt=100, output=20)))
    return policy.memory.per_replica is None


def test_recent_rate_still_scales_up_at_once():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=6, upscale_delay_s=0, max_step=6)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    from autoscaling.capacity import per_replica_capacity

    per = per_replica_capacity(PROFILE, 300, 100, SLO.ttft_p90_ms, SLO.itl_p90_ms, cfg.headroom).per_replica_rps
    ms = _with_recent(fleet(1, 0.5 * per, ttft=200.0, itl=30.0), 2.5 * per)  # a step: only the recent rate sees it
    assert policy.decide(step(0.0, 1, ms)).replicas == 3


def test_with_a_profile_the_overload_memory_forbids_only_the_overload_rate():
    """The memory is learnt at 2 req/s per replica. With a profile the capacity model has its own
    headroom, so the floor stops a return to >= 2 req/s per replica, not to 0.6 of it."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=8, downscale_delay_s=0, hysteresis=0.6)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)

    def floor(ms: list[ReplicaMetrics]) -> int:
        return policy.memory.floor(policy.model.busy(policy_sig(ms), SLO.params()))

    policy.memory.per_replica = policy.model.busy(policy_sig(fleet(1, 2.0, 100.0, 20.0)), SLO.params())
    assert floor(fleet(3, 3.9, 100.0, 20.0)) == 2  # 1.95 per replica at 2
    assert floor(fleet(3, 4.0, 100.0, 20.0)) == 3  # exactly the overload at 2
    # The memory is of work, not of requests: the same rate of much shorter requests is less load.
    assert floor(fleet(3, 4.0, 100.0, 20.0, prompt=30, output=10)) == 1


def policy_sig(ms: list[ReplicaMetrics]):
    from autoscaling.signals import fleet_signals

    return fleet_signals(ms)


def test_state_round_trips_through_plain_dicts():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=6, upscale_delay_s=5, downscale_delay_s=20)
    a = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    inputs = [fleet(2, 8.0, 1500.0 if t < 20 else 200.0, 40.0) for t in range(60)]
    current = 2
    for t in range(30):
        current = a.decide(step(float(t), current, inputs[t])).replicas
    b = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    b.set_state(json.loads(json.dumps(a.get_state())))
    cur_a = cur_b = current
    for t in range(30, 60):
        cur_a = a.decide(step(float(t), cur_a, inputs[t])).replicas
        cur_b = b.decide(step(float(t), cur_b, inputs[t])).replicas
        assert cur_a == cur_b


# -- baselines and registry -------------------------------------------------------------------

def test_fixed_max_is_always_max():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=7)
    p = FixedMaxPolicy(cfg.params())
    assert {p.decide(step(t, c, [])).replicas for t, c in [(0, 1), (5, 7), (9, 3)]} == {7}


def test_serve_default_rule():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=10, target_ongoing_requests=4,
                            upscale_delay_s=10, downscale_delay_s=30)
    p = ServeDefaultPolicy(cfg.params())
    assert p.decide(step(0, 2, [], ongoing=17)).replicas == 2  # wants ceil(17/4) = 5, delayed
    assert p.decide(step(10, 2, [], ongoing=17)).replicas == 5
    assert p.decide(step(11, 5, [], ongoing=20)).replicas == 5
    assert p.decide(step(12, 5, [], ongoing=0)).replicas == 5
    assert p.decide(step(42, 5, [], ongoing=0)).replicas == 1  # floor of min_replicas
    assert p.decide(step(50, 0, [], ongoing=3.0, running=0)).replicas == 1  # cold start, no delay


def test_registry():
    assert autoscaler_names() == ["fixed_max", "kvserve", "serve_default"]
    assert isinstance(make_autoscaler("kvserve"), SLOAutoscaler)
    with pytest.raises(ValueError, match="unknown autoscaler"):
        make_autoscaler("nope")


def _unproven(n: int, rate: float) -> list[ReplicaMetrics]:
    """p90 TTFT over target, but its lower confidence bound under it: no evidence of a violation."""
    return [dataclasses.replace(m, ttft_p90_low_ms=800.0) for m in fleet(n, rate, ttft=1200.0, itl=30.0)]


def test_an_unproven_slo_error_holds_a_shrink_without_restarting_its_delay():
    """The rate needs 1 of 2 replicas while a p90 reads over target without being evidence: no
    shrink acts, but its delay runs; once the p90 is back within target the shrink acts at once."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=4, upscale_delay_s=10, downscale_delay_s=30)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    held = [policy.decide(step(float(t), 2, _unproven(2, R1))) for t in range(40)]
    assert [d.replicas for d in held] == [2] * 40
    assert "slo_feedback" in held[-1].holds and "not significant" in held[-1].reason
    d = policy.decide(step(40.0, 2, fleet(2, R1, ttft=200.0, itl=30.0)))
    assert d.replicas == 1, d.reason


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 6), load=st.floats(0.0, 3.0), starting=st.booleans(), ticks=st.integers(1, 80))
def test_an_slo_error_that_is_no_evidence_never_lets_a_shrink_act(n, load, starting, ticks):
    """Over target but not evidence (the p90's lower bound within target, or replicas still
    starting): whatever the rate, no decision goes below the current fleet."""
    cfg = AutoscalingConfig(min_replicas=0, max_replicas=8, upscale_delay_s=0, downscale_delay_s=0)
    policy = SLOAutoscaler(cfg.params(), SLO.params(), PROFILE)
    ms = fleet(n, load * n * R1, ttft=1500.0, itl=30.0) if starting else _unproven(n, load * n * R1)
    current = n + 1 if starting else n
    for t in range(ticks):
        assert policy.decide(step(float(t), current, ms, running=n)).replicas >= current
