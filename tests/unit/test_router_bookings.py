"""Bookings: decisions are charged at once, moved when the request lands elsewhere, released exactly once."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from router.base import ReplicaLoad, RouteRequest, RoutingPolicy
from router.bookings import Bookings
from router.policies.kvserve import PrefixCostRouter

_ids = itertools.count()


class Ledger(RoutingPolicy):
    """Records what the policy is told: its view of in-flight requests per replica."""

    name = "ledger"

    def __init__(self) -> None:
        self.live: Counter = Counter()

    def rank(self, request, replicas, now):
        return sorted(r.replica_id for r in replicas)

    def on_routed(self, request, replica_id, now):
        self.live[(request.request_id, replica_id)] += 1

    def on_finished(self, request, replica_id, now):
        self.live[(request.request_id, replica_id)] -= 1


def req(n_tokens: int = 12) -> RouteRequest:
    return RouteRequest(f"r{next(_ids)}", [], n_tokens, expected_output_tokens=120)


def test_simultaneous_decisions_see_each_other_and_spread():
    """Four short requests decided before any replica accepted: 2 + 2, not a coin flip each."""
    for seed in range(20):
        policy = PrefixCostRouter(seed=seed)
        bookings = Bookings(policy)
        loads = [ReplicaLoad("a"), ReplicaLoad("b")]
        picks = []
        for _ in range(4):
            r = req()
            first = policy.rank(r, loads, now=0.0)[0]
            bookings.decided(r, first, now=0.0)
            picks.append(first)
        assert Counter(picks) == {"a": 2, "b": 2}, (seed, picks)
        assert bookings.ongoing("a") == bookings.ongoing("b") == 2


def test_landing_elsewhere_moves_the_booking():
    ledger = Ledger()
    b = Bookings(ledger)
    r = req()
    b.decided(r, "a", 0.0)
    b.accepted(r, "b", 0.1)  # "a" was full: Serve sent it to the next rank
    assert (b.ongoing("a"), b.ongoing("b")) == (0, 1)
    assert ledger.live[(r.request_id, "a")] == 0 and ledger.live[(r.request_id, "b")] == 1
    assert not b.finished(r.request_id, "a", 0.2)  # a stale attempt's completion changes nothing
    assert b.finished(r.request_id, "b", 0.3)
    assert b.ongoing("b") == 0 and len(b) == 0 and all(v == 0 for v in ledger.live.values())


def test_unconfirmed_bookings_of_cancelled_requests_expire():
    ledger = Ledger()
    b = Bookings(ledger, unconfirmed_ttl_s=30.0)
    lost, kept = req(), req()
    b.decided(lost, "a", 0.0)  # the client went away while it waited for a replica
    b.decided(kept, "a", 0.0)
    b.accepted(kept, "a", 1.0)
    b.decided(req(), "b", 100.0)  # a later decision sweeps
    assert b.ongoing("a") == 1
    assert ledger.live[(lost.request_id, "a")] == 0 and ledger.live[(kept.request_id, "a")] == 1


ops = st.lists(st.tuples(st.sampled_from(["decide", "accept", "finish", "gone"]),
                         st.integers(0, 5), st.sampled_from(["a", "b", "c"])), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_counts_always_match_what_the_policy_was_told(seq):
    """Whatever order Serve's callbacks arrive in: one booking per request at most, counts never
    negative, and the policy sees each request on at most one replica."""
    ledger = Ledger()
    b = Bookings(ledger)
    requests = [req() for _ in range(6)]
    gone: set[str] = set()
    for t, (op, i, rid) in enumerate(seq):
        r = requests[i]
        if op == "decide":
            b.decided(r, rid, float(t))
        elif op == "accept":
            b.accepted(r, rid, float(t))
        elif op == "finish":
            b.finished(r.request_id, rid, float(t))
        else:
            b.forget_replica(rid)
            gone.add(rid)
            for key in [k for k in ledger.live if k[1] == rid]:
                ledger.live[key] = 0  # the policy forgets a gone replica too
        for rep in "abc":
            live = sum(v for (q, x), v in ledger.live.items() if x == rep)
            assert b.ongoing(rep) == live >= 0
        per_request = Counter(q for (q, _), v in ledger.live.items() if v > 0)
        assert all(v == 1 for v in per_request.values())
        assert all(v in (0, 1) for v in ledger.live.values())
    assert len(b) == sum(1 for v in ledger.live.values() if v > 0)
