"""Cache-aware scale-down (router/retire.py): retire the replica whose cached prefixes are worth least."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.retire import CacheRecency, block_worth, losses, retire_order

NOW = 1000.0

# replica -> block -> last hit time; few block ids so that replicas share blocks
holdings_st = st.dictionaries(
    st.sampled_from([f"r{i}" for i in range(6)]),
    st.dictionaries(st.integers(0, 12), st.floats(NOW - 600, NOW)),
    min_size=1, max_size=6,
)


def test_the_replica_whose_prefixes_are_all_held_elsewhere_goes_first():
    h = {"a": {1: NOW, 2: NOW}, "b": {1: NOW, 2: NOW, 3: NOW}, "c": {4: NOW - 30}}
    assert retire_order(h, NOW)[0] == "a"
    assert losses(h, NOW)["a"] == 0.0


def test_stale_unique_prefixes_are_worth_less_than_recent_ones():
    h = {"hot": {1: NOW - 1}, "cold": {2: NOW - 600}}
    assert retire_order(h, NOW, half_life_s=60.0) == ["cold", "hot"]


def test_two_copies_of_one_hot_prefix_are_not_both_retired():
    # a and b both hold the hot prefix 1 (each loses nothing alone); c holds a unique lukewarm one.
    h = {"a": {1: NOW}, "b": {1: NOW}, "c": {2: NOW - 120}}
    first, second = retire_order(h, NOW, n=2)
    assert first in {"a", "b"} and second == "c"


def test_the_worth_of_a_block_halves_every_half_life():
    assert block_worth(NOW, NOW, 60) == 1.0
    assert abs(block_worth(NOW - 60, NOW, 60) - 0.5) < 1e-12
    assert block_worth(NOW + 5, NOW, 60) == 1.0  # a clock skew never makes a block worth more than new


@settings(max_examples=300, deadline=None)
@given(holdings_st)
def test_the_order_is_every_replica_once_and_starts_with_a_least_loss_replica(h):
    order = retire_order(h, NOW)
    assert sorted(order) == sorted(h)
    loss = losses(h, NOW)
    assert loss[order[0]] <= min(loss.values()) + 1e-9
    assert retire_order(h, NOW, n=2) == order[:2]


@settings(max_examples=300, deadline=None)
@given(holdings_st, st.integers(100, 120), st.floats(NOW - 60, NOW))
def test_a_new_unique_hit_never_makes_a_replica_the_first_to_go(h, block, t):
    first = retire_order(h, NOW)[0]
    other = next((r for r in h if r != first), None)
    if other is None:
        return
    more = {**h, other: {**h[other], block: t}}  # a block no one else holds
    assert retire_order(more, NOW)[0] != other


@settings(max_examples=200, deadline=None)
@given(holdings_st)
def test_each_pick_loses_no_more_than_any_other_remaining_choice(h):
    left = {r: dict(b) for r, b in h.items()}
    for victim in retire_order(h, NOW):
        loss = losses(left, NOW)
        assert loss[victim] <= min(loss.values()) + 1e-9
        del left[victim]


def test_recency_follows_routing_and_kv_events():
    rec = CacheRecency()
    rec.on_routed("a", [1, 2, 3], 10.0)
    rec.on_cache_events("a", stored=[3, 4], removed=[2], now=11.0)
    rec.on_routed("a", [1], 12.0)
    assert rec.holdings(["a", "b"]) == {"a": {1: 12.0, 3: 10.0, 4: 11.0}, "b": {}}
    rec.on_replica_gone("a")
    assert rec.holdings(["a"]) == {"a": {}}
