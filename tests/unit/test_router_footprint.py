"""Cache-footprint packing: which families live where, and what placing one more evicts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvserve.config import RouterConfig
from router.base import ReplicaLoad, RouteRequest
from router.block_hash import chain_hashes
from router.footprint import Footprints
from router.policies.kvserve import PrefixCostRouter


def test_overflow_is_zero_with_room_and_at_most_the_prefix_when_full():
    fp = Footprints(window_s=100)
    fp.record(1, "a", 600, now=0)
    assert fp.overflow("a", 2, 300, capacity=1000, now=1) == 0  # 600 + 300 fits
    assert fp.overflow("a", 2, 500, capacity=1000, now=1) == 100  # pushes 100 tokens of family 1 out
    fp.record(3, "a", 900, now=2)
    assert fp.overflow("a", 2, 500, capacity=1000, now=3) == 500  # already over: all of it evicts someone
    assert fp.overflow("a", 1, 600, capacity=1000, now=3) == 0  # family 1 lives there already
    assert fp.overflow("b", 2, 500, capacity=1000, now=3) == 0


def test_a_family_moves_and_old_families_expire():
    fp = Footprints(window_s=10)
    fp.record(1, "a", 600, now=0)
    fp.record(1, "b", 600, now=5)  # moved: it no longer needs room on a
    assert (fp.demand("a", 6), fp.demand("b", 6)) == (0, 600)
    assert fp.demand("b", 16) == 0  # not routed for longer than the window
    assert len(fp) == 0


events = st.lists(st.tuples(st.integers(0, 5), st.sampled_from("abc"), st.integers(1, 2000), st.floats(0, 5)),
                  max_size=60)


@given(events=events, window=st.floats(1, 20))
def test_demand_equals_brute_force(events, window):
    fp, now, last = Footprints(window), 0.0, {}
    for family, replica, tokens, dt in events:
        now += dt
        fp.record(family, replica, tokens, now)
        last[family] = (replica, tokens, now)
        for r in "abc":
            want = sum(t for rep, t, seen in last.values() if rep == r and seen >= now - window)
            assert fp.demand(r, now) == want


def _request(i: int, tenant: int) -> RouteRequest:
    toks = [1000 + tenant] * 64 + [i] * 4  # a 64-token tenant prefix (4 blocks of 16) + a question
    return RouteRequest(f"r{i}", chain_hashes(toks, 16), len(toks), tenant=str(tenant))


def test_new_families_go_where_they_evict_nobody():
    """Each replica holds 2.x families. Three new families land on `a` by load (it is the idle one);
    the footprint charge sends the third to `b`, where it evicts nothing, despite `b`'s queue."""
    cfg = RouterConfig(prefill_ms_per_token=1.0, decode_ms_per_seq=0.0, tie_tolerance=0.0)
    policy = PrefixCostRouter(cfg.params(), block_size=16)
    a = ReplicaLoad("a", kv_capacity_tokens=160)
    b = ReplicaLoad("b", queued_prefill_tokens=40, kv_capacity_tokens=160)
    placed = []
    for i, tenant in enumerate(range(3)):
        req = _request(i, tenant)
        rid = policy.rank(req, [a, b], now=float(i))[0]
        policy.on_routed(req, rid, now=float(i))
        policy.on_finished(req, rid, now=float(i))
        placed.append(rid)
    assert placed == ["a", "a", "b"]
    assert policy.footprints.demand("a", 3.0) == 2 * 64


def test_without_a_known_capacity_the_charge_is_off():
    cfg = RouterConfig(prefill_ms_per_token=1.0, decode_ms_per_seq=0.0, tie_tolerance=0.0)
    policy = PrefixCostRouter(cfg.params(), block_size=16)
    a, b = ReplicaLoad("a"), ReplicaLoad("b", queued_prefill_tokens=40)
    for i in range(3):
        req = _request(i, i)
        assert policy.rank(req, [a, b], now=float(i))[0] == "a"
        policy.on_routed(req, "a", now=float(i))
        policy.on_finished(req, "a", now=float(i))
