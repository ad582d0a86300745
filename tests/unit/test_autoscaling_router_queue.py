"""Requests that wait at the routers (every replica at `max_ongoing_requests`): the simulator
queues them as Serve does (FIFO, a 503 beyond `max_queued_requests`), replicas count each one
when it arrived, and the kvserve policy reads the routers' queue as demand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ScalingInput
from autoscaling.policies.kvserve import SLOAutoscaler
from autoscaling.signals import fleet_signals
from kvserve.policy_params import AutoscalerParams
from autoscaling.window import SignalWindow, WindowMetrics, metrics_from_stats
from kvserve.config import SLOConfig
from simulator.cluster import Cluster
from simulator.engine import EngineSettings
from simulator.metrics import UNSERVED_TTFT_MS, TrailingPeak, minute_buckets
from simulator.workloads import SimWorkload
from router.registry import make_policy
from tests.unit.test_autoscaling_policies import PROFILE
from tests.unit.test_autoscaling_predictive import cfg, need
from tests.unit.test_sim_cluster import LINEAR, mk

SLO = SLOConfig(ttft_p90_ms=1000.0, itl_p90_ms=100.0)
QUEUE_GROWTH_S = AutoscalerParams().queue_growth_s


# -- the simulator's router queue -----------------------------------------------------------

def _burst(n: int) -> SimWorkload:
    return SimWorkload("burst", [mk(i, 0.0, [10 * i + 1, 10 * i + 2], 2) for i in range(n)], 4)


def test_a_full_replica_leaves_requests_at_the_router_in_arrival_order():
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(_burst(4), LINEAR, eng, make_policy("round_robin"), replicas=1, max_ongoing=1,
                  trace_events=True).run()
    routed = [(round(t, 6), i) for t, kind, i, _ in res.events if kind == "routed"]
    # One at a time: each is routed when the one before it finished (8 ms prefill + 10 ms decode).
    assert routed == [(0.0, 0), (0.018, 1), (0.036, 2), (0.054, 3)]
    assert all(r.finished is not None and not r.failed for r in res.requests)
    assert [round(r.first_token - r.arrival, 6) for r in res.requests] == [0.008, 0.026, 0.044, 0.062]


def test_a_full_router_queue_turns_requests_away_and_they_count_as_misses():
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(_burst(5), LINEAR, eng, make_policy("round_robin"), replicas=1, max_ongoing=1,
                  max_queued=2).run()
    assert res.overloaded_requests == 2  # one running, two waiting, two 503s
    assert sum(1 for r in res.requests if r.failed) == 2
    assert sum(1 for r in res.requests if r.finished is not None and not r.failed) == 3
    ttfts = minute_buckets(res.requests, res.itl)[0][0]
    assert sorted(ttfts)[-2:] == [UNSERVED_TTFT_MS, UNSERVED_TTFT_MS]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(0, 6), st.integers(1, 25))
def test_conservation_with_caps(replicas, max_ongoing, max_queued, n):
    eng = EngineSettings(block_size=4, kv_blocks=64, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(_burst(n), LINEAR, eng, make_policy("pow2", seed=1), replicas=replicas,
                  max_ongoing=max_ongoing, max_queued=max_queued).run()
    served = sum(1 for r in res.requests if r.finished is not None and not r.failed)
    assert served + res.overloaded_requests == n  # every request served once or turned away
    assert res.overloaded_requests == max(0, n - replicas * max_ongoing - max_queued)


def test_trailing_peak_is_the_largest_value_in_the_span():
    p = TrailingPeak()
    for t, v in [(1.0, 5), (2.0, 9), (3.0, 2), (10.0, 0)]:
        p.set(v, t)
    assert p.peak(5.0, 4.0) == 9  # 9 held from 2 to 3
    assert p.peak(12.0, 4.0) == 2  # 2 was in effect at 8
    assert p.peak(20.0, 4.0) == 0


# -- the replica window counts a request when it arrived -------------------------------------

def test_a_flushed_queue_is_counted_when_it_arrived_not_as_a_burst():
    w = SignalWindow(look_back_s=30.0, recent_s=5.0, clock=lambda: 0.0)
    for i in range(40):  # 2 req/s for 20 s, each received after waiting 10 s at the router
        w.on_arrival(100, now=30.0 + i * 0.5, waited_s=10.0)
    m = w.metrics("a", now=50.0)
    assert abs(m.requests_per_s - 40 / 30) < 1e-9  # all arrived in the window
    assert abs(m.recent_requests_per_s - 0.0) < 1e-9  # none arrived in the last 5 s...
    assert abs(m.recent_admitted_per_s - 2.0) < 0.25  # ... but it took 2/s over them
    assert metrics_from_stats("a", w.to_stats_dict(now=50.0)).recent_admitted_per_s == m.recent_admitted_per_s


def test_arrivals_before_the_window_or_the_replica_are_not_counted():
    w = SignalWindow(look_back_s=30.0, clock=lambda: 100.0)  # the replica started at 100
    w.on_arrival(100, now=101.0, waited_s=5.0)  # arrived at 96: before this replica existed
    w.on_arrival(100, now=140.0, waited_s=35.0)  # arrived at 105: older than the window at 140
    w.on_arrival(100, now=140.0, waited_s=2.0)
    m = w.metrics("a", now=140.0)
    assert m.requests_per_s * 30.0 == 1.0
    assert m.recent_admitted_per_s > 0


# -- the policy reads the routers' queue -----------------------------------------------------

def _full(n: int, admitted: float, arrivals: float) -> list[WindowMetrics]:
    """n saturated replicas: they take `admitted` req/s in all; of what arrived recently they
    have seen `arrivals` req/s (the rest waits at the router)."""
    return [
        WindowMetrics(f"r{i}", 400.0, 20.0, 10, 32, 0.5, arrivals / n, 300.0 * arrivals / n, 100.0 * arrivals / n,
                      300.0, 100.0, 0.0, arrivals / n, admitted / n)
        for i in range(n)
    ]


def test_a_growing_router_queue_reads_as_the_arrivals_the_replicas_never_saw():
    policy = SLOAutoscaler(cfg(look_back_s=30.0).params(), SLO.params(), PROFILE)
    admitted = 1.2
    assert need(admitted) == 1 and need(3 * admitted) > 2
    d = None
    for t in range(int(QUEUE_GROWTH_S) + 2):  # the queue grows 2.4/s: arrivals are 1.2 + 2.4 = 3.6/s
        d = policy.decide(ScalingInput(float(t), 1, 1, _full(1, admitted, admitted), queued_requests=2.4 * t))
    assert d is not None
    queued = 2.4 * (QUEUE_GROWTH_S + 1)
    expected = policy.model.replicas(fleet_signals(_full(1, admitted, admitted)), SLO.params(), 3.6 + queued / 30.0)
    assert d.replicas == expected >= need(3.6)


def test_without_a_router_queue_saturated_replicas_ask_for_no_more():
    policy = SLOAutoscaler(cfg(look_back_s=30.0).params(), SLO.params(), PROFILE)
    for t in range(12):
        d = policy.decide(ScalingInput(float(t), 1, 1, _full(1, 1.2, 1.2)))
    assert d.replicas == need(1.2) == 1


def test_the_queues_growth_is_not_read_while_new_replicas_take_its_flush():
    policy = SLOAutoscaler(cfg(look_back_s=30.0, downscale_delay_s=1000).params(), SLO.params(), PROFILE)
    policy.decide(ScalingInput(0.0, 3, 1, _full(1, 1.2, 1.2), queued_requests=10.0))
    # Two replicas joined at t=1 and took 12 req/s from the queue at once: its peak figure still
    # grew (10 -> 30), but that is the old fleet's queue; only its drain counts.
    d = policy.decide(ScalingInput(1.0, 3, 3, _full(3, 12.0, 3.0), queued_requests=30.0))
    assert d.replicas == need(3.0 + 30.0 / 30.0)
    # Once the newcomers have served `QUEUE_GROWTH_S`, a queue that still grows is arrivals again.
    t = 1.0 + QUEUE_GROWTH_S
    for k in range(int(QUEUE_GROWTH_S) + 1):
        d = policy.decide(ScalingInput(t + k, 3, 3, _full(3, 3.0, 3.0), queued_requests=30.0 + 2.0 * k))
    assert d.replicas == need(3.0 + 2.0 + (30.0 + 2.0 * QUEUE_GROWTH_S) / 30.0)


def test_no_shrink_acts_while_requests_wait_at_the_routers():
    # Replicas asked for are still starting; the one serving is full and the routers' queue sits
    # at a cap (no growth to read): demand reads low, but every replica is full.
    policy = SLOAutoscaler(cfg(look_back_s=30.0, downscale_delay_s=5.0).params(), SLO.params(), PROFILE)
    full = _full(1, 1.2, 1.2)
    assert need(1.2 + 20.0 / 30.0) < 3
    for t in range(20):
        d = policy.decide(ScalingInput(float(t), 3, 1, full, queued_requests=20.0))
        assert d.replicas == 3, d.reason
    assert "held: requests wait at the routers" in d.reason and d.holds == ("routers_queue",)
    # The queue drained (its window peak is back to 0): the due shrink acts at once.
    d = policy.decide(ScalingInput(20.0, 3, 3, _full(3, 1.2, 1.2)))
    assert d.replicas < 3
