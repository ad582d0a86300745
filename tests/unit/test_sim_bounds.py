"""The scripted autoscaling bounds (simulator.bounds): the hindsight script serves the oracle's counts and
costs exactly their start-ups more; the lagged script never acts on a minute before its lag and its gate;
the pre-warm bound counts blocks cached anywhere in the fleet and is never below the actual hit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaling.base import ScalingInput
from kvserve.config import KVServeConfig
from router.registry import make_policy
from simulator.bounds import (HindsightStartup, LaggedScript, fleet_prefix, hindsight_replica_seconds,
                              hindsight_target, newreplica_hit_bound)
from simulator.cluster import Cluster, ScalingSetup
from simulator.engine import KVCache, SimRequest
from simulator.metrics import MINUTE_S

needs = st.lists(st.integers(1, 8), min_size=1, max_size=12)


def _oracle_rs(need: list[int], horizon: float) -> float:
    return sum(n * max(0.0, min(MINUTE_S, horizon - m * MINUTE_S)) for m, n in enumerate(need))


def _starts(need: list[int], initial: int) -> int:
    return sum(max(0, b - a) for a, b in zip([initial] + need, need))


@settings(max_examples=300, deadline=None)
@given(needs, st.floats(0.0, 200.0), st.integers(1, 8), st.floats(0.0, 1.0))
def test_hindsight_costs_at_least_the_oracle_and_at_most_every_start_up_more(need, start, initial, tail):
    initial = min(initial, need[0])
    horizon = (len(need) - 1 + tail) * MINUTE_S if len(need) > 1 else max(tail, 0.01) * MINUTE_S
    cost, oracle = hindsight_replica_seconds(need, start, horizon, initial), _oracle_rs(need, horizon)
    assert cost >= oracle - 1e-6
    assert cost <= oracle + start * _starts(need, initial) + 1e-6


@settings(max_examples=300, deadline=None)
@given(needs, st.floats(0.0, 59.0), st.integers(1, 8))
def test_hindsight_pays_each_start_up_exactly_when_it_is_shorter_than_a_minute(need, start, initial):
    # No dip in the oracle's counts is shorter than a minute, so none is worth keeping a replica through.
    initial = min(initial, need[0])
    horizon = len(need) * MINUTE_S
    expected = _oracle_rs(need, horizon) + start * _starts(need, initial)
    assert abs(hindsight_replica_seconds(need, start, horizon, initial) - expected) < 1e-6


@given(needs, st.floats(0.0, 200.0), st.floats(0.0, 800.0))
def test_the_hindsight_script_has_every_minutes_replicas_asked_for_start_up_ahead(need, lead, t):
    n = HindsightStartup(need, lead).decide(ScalingInput(t, 1, 1, [])).replicas
    at = lambda u: need[min(int(u // MINUTE_S), len(need) - 1)]  # noqa: E731
    assert n == hindsight_target(need, t, lead)
    assert n >= at(t) and n >= at(t + lead) and n <= max(need)


def _lagged_run(need: list[int], lag: float, up: float, down: float, horizon: float) -> list[tuple[float, int]]:
    """Decisions every second, each adopted at once (as the cluster does): [(t, count after it)]."""
    script, cur, out = LaggedScript(need, lag, up, down), 1, []
    for i in range(1, int(horizon) + 1):
        cur = script.decide(ScalingInput(float(i), cur, cur, [])).replicas
        out.append((float(i), cur))
    return out


@settings(max_examples=200, deadline=None)
@given(needs, st.floats(0.0, 60.0), st.floats(0.0, 30.0), st.floats(0.0, 60.0), st.data())
def test_the_lagged_script_never_acts_on_a_minute_before_its_lag_and_its_delay(need, lag, up, down, data):
    horizon = len(need) * MINUTE_S + 120
    run = _lagged_run(need, lag, up, down, horizon)
    at = lambda u: need[min(int(u // MINUTE_S), len(need) - 1)]  # noqa: E731
    prev = 1
    for t, n in run:
        if n != prev:
            assert t >= lag and n == at(t - lag)  # goes to the count it saw, lag late
            delay = up if n > prev else down
            # ... and only once the wish in that direction has lasted its delay (every decision in it agreed)
            for t2, _ in run:
                if t - delay + 1e-9 < t2 < t:
                    assert t2 >= lag and (at(t2 - lag) > prev) == (n > prev) and at(t2 - lag) != prev
        prev = n
    # Causal: changing the counts from minute k on changes nothing before k's start + lag.
    k = data.draw(st.integers(0, len(need) - 1))
    other = need[:k] + [data.draw(st.integers(1, 8)) for _ in need[k:]]
    cut = k * MINUTE_S + lag
    assert [x for x in run if x[0] < cut] == [x for x in _lagged_run(other, lag, up, down, horizon) if x[0] < cut]


def _cache(blocks: list[int]) -> KVCache:
    kv = KVCache(100)
    kv.warm(blocks)
    return kv


def test_fleet_prefix_counts_blocks_cached_on_any_replica():
    a, b = _cache([1, 2]), _cache([1, 2, 3, 4])
    c = _cache([9])
    assert fleet_prefix([a], [1, 2, 3]) == 2
    assert fleet_prefix([a, b, c], [1, 2, 3, 4, 5]) == 4
    # Pieces on different replicas join up: a perfect pre-warm holds them all.
    assert fleet_prefix([_cache([1]), _cache([2])], [1, 2, 3]) == 2 == fleet_prefix([_cache([1, 2])], [1, 2, 3])
    assert fleet_prefix([], [1]) == 0 and fleet_prefix([c], [1, 9]) == 0


def _req(idx: int, rid: str, routed: float, blocks: int, hit: int, fleet: int | None) -> SimRequest:
    r = SimRequest(idx, routed, blocks * 16, 4, list(range(blocks)), blocks + 1)
    r.replica, r.routed, r.first_token, r.hit_blocks, r.fleet_hit_blocks = rid, routed, routed + 0.1, hit, fleet
    return r


def test_newreplica_hit_bound_is_the_fleets_cache_over_the_fleets_hit_in_the_same_window():
    since = {"r0": 0.0, "r1": 100.0}
    reqs = [_req(0, "r0", 50.0, 10, 10, None),  # before the new replica: outside every window
            _req(1, "r0", 120.0, 10, 8, None),  # the fleet, in r1's window
            _req(2, "r1", 130.0, 10, 2, 6),  # r1's own: hit 2, the fleet had 6
            _req(3, "r1", 150.0, 10, 4, 1),  # its own cache had more than the fleet had at routing
            _req(4, "r1", 170.0, 10, 0, 9)]  # past its first 60 s
    out = newreplica_hit_bound(reqs, since, 60.0)
    fleet = (8 + 2 + 4) / 30
    assert out["fleet_hit_rate_new_windows"] == fleet
    assert out["newreplica_hit_ceiling"] == (6 + 4) / 20
    assert out["newreplica_hit_bound"] == (10 / 20) / fleet and out["newreplica_hit_ratio"] == (6 / 20) / fleet
    assert newreplica_hit_bound(reqs, {"r0": 0.0}, 60.0)["newreplica_hit_bound"] is None  # no scale-up


def test_the_cluster_records_the_fleets_cache_for_new_replicas_first_minute_only():
    from simulator import suite_workloads as sw
    from simulator.suite import Cell, cell_setup
    from simulator.workloads import TenantMix, generated

    mix = TenantMix(tenants=4, system_tokens=512, question_tokens=1024, output_tokens=32)
    cell = Cell("step", "tiny", "cpu-smollm2-135m.json",
                lambda seed: generated("step", mix, sw.BLOCK, rate=0.5, phase_s=60.0, seed=seed))
    setup = cell_setup(cell, 0)
    a = KVServeConfig.model_validate({"autoscaling": {"enabled": True, "min_replicas": 1, "max_replicas": 4}}).autoscaling
    res = Cluster(setup.workload, setup.profile, setup.engine, make_policy("kvserve", setup.cfg.router.params(), 0),
                  replicas=0, router_cfg=setup.cfg.router, scaling=ScalingSetup(HindsightStartup([1, 3, 2], 10.0), a, 5.0),
                  ).run()
    new = {rid: t for rid, t in res.serving_since.items() if t > 0}
    assert len(new) >= 2
    recorded = [r for r in res.requests if r.fleet_hit_blocks is not None]
    assert recorded
    for r in res.requests:
        in_window = r.replica in new and r.routed is not None and r.routed - new[r.replica] <= 60.0
        assert (r.fleet_hit_blocks is not None) == in_window
    assert all(r.fleet_hit_blocks <= len(r.block_hashes) for r in recorded)  # type: ignore[operator]
