"""Hit-rate bounds and the oracle's replica-seconds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.oracle import infinite_hit_rate, oracle_hit_rate, oracle_replica_seconds
from tests.unit.test_sim_cluster import mk


def test_hand_example() -> None:
    reqs = [mk(0, 0.0, [1, 2], 1), mk(1, 1.0, [1, 2, 3], 1), mk(2, 2.0, [9], 1), mk(3, 3.0, [1, 5], 1)]
    assert infinite_hit_rate(reqs) == 3 / 8  # 0 + 2 + 0 + 1
    # 3 blocks of global cache: [1,2] cached, then [1,2,3] (hit 2), then 9 evicts the tail 3,
    # then [1,5] still hits 1.
    assert oracle_hit_rate(reqs, 3) == 3 / 8
    # 1 block: the head block is kept (tails are evicted first), so request 1 hits block 1,
    # then request 2's block 9 displaces it: 1 hit in 8.
    assert oracle_hit_rate(reqs, 1) == 1 / 8


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=6), min_size=1, max_size=30), st.integers(1, 40))
def test_oracle_between_zero_and_infinite(prompts, cap) -> None:  # type: ignore[no-untyped-def]
    reqs = [mk(i, float(i), p, 1) for i, p in enumerate(prompts)]
    inf = infinite_hit_rate(reqs)
    assert 0.0 <= oracle_hit_rate(reqs, cap) <= inf
    assert oracle_hit_rate(reqs, 10_000) == inf


def test_oracle_replica_seconds_takes_per_minute_minimum() -> None:
    # minute 0 is met by 1 replica, minute 1 needs 3, minute 2 has no traffic.
    def fixed(n: int) -> dict[int, bool]:
        return {0: True, 1: n >= 3}

    secs, need = oracle_replica_seconds(fixed, min_replicas=1, max_replicas=4, horizon_s=150.0)
    assert need == [1, 3, 1]
    assert secs == 60 * 1 + 60 * 3 + 30 * 1
