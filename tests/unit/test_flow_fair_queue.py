"""flow.fair_queue: fair share on work within a level, priority with a starvation bound, bounded, work-conserving."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow.fair_queue import FairQueue, FlowParams, QueueFull

BIG = FlowParams(max_per_tenant=10_000, max_total=100_000, starvation_limit=8, burst_tokens=500.0)


def test_a_cheap_tenant_overtakes_a_backlog_of_expensive_ones() -> None:
    q = FairQueue(BIG)
    for i in range(20):
        q.push("aggressor", 1000, float(i))
    q.push("victim", 100, 20.0)
    order = [q.pop().tenant for _ in range(3)]
    assert "victim" in order[:2]  # not behind the 20 queued aggressor requests


def test_a_tenant_below_its_share_is_served_ahead_within_its_burst() -> None:
    q = FairQueue(BIG)  # burst 500 tokens
    for _ in range(50):
        q.push("flood", 100, 0.0)
    for _ in range(20):
        q.pop()  # the flood has been served 2000 tokens; the victim nothing
    for _ in range(8):
        q.push("victim", 100, 1.0)
    served = [q.pop().tenant for _ in range(8)]
    assert served[:5] == ["victim"] * 5  # 500 tokens of credit, then turns with the flood again
    assert served.count("victim") < 8


def test_cost_not_count_decides_the_share() -> None:
    # Same weight, one tenant's requests cost 4x: it gets ~1/4 as many dispatches while both are backlogged.
    q = FairQueue(BIG)
    for i in range(200):
        q.push("cold", 400, 0.0)
        q.push("cached", 100, 0.0)
    served = [q.pop().tenant for _ in range(100)]
    assert 75 <= served.count("cached") <= 85


def test_weights_scale_the_share() -> None:
    q = FairQueue(BIG)
    for _ in range(600):
        q.push("gold", 10, 0.0, weight=3.0)
        q.push("bronze", 10, 0.0, weight=1.0)
    for _ in range(100):
        q.pop()  # both start with their burst allowance; after it the weights rule
    served = [q.pop().tenant for _ in range(200)]
    assert 148 <= served.count("gold") <= 152


def test_higher_priority_goes_first() -> None:
    q = FairQueue(BIG)
    q.push("batch", 1, 0.0, priority=-10)
    q.push("interactive", 1000, 1.0, priority=0)
    assert q.pop().tenant == "interactive"
    assert q.pop().tenant == "batch"
    assert q.pop() is None


def test_per_tenant_bound_rejects_and_total_bound_pushes_out_the_longest_queue() -> None:
    q = FairQueue(FlowParams(max_per_tenant=3, max_total=4, starvation_limit=8))
    for _ in range(3):
        q.push("flood", 1, 0.0)
    with pytest.raises(QueueFull):
        q.push("flood", 1, 0.0)
    q.push("victim", 1, 0.0)  # total now 4 = max_total
    _, evicted = q.push("victim2", 1, 0.0)  # full: the longest queue (flood) loses its newest
    assert evicted is not None and evicted.tenant == "flood"
    assert q.queued("flood") == 2 and len(q) == 4
    q.push("victim3", 1, 0.0)
    with pytest.raises(QueueFull):  # flood 1 = victims 1 each: nobody longer to push out
        q.push("victim4", 1, 0.0)


def test_removed_tickets_are_never_popped() -> None:
    q = FairQueue(BIG)
    a, _ = q.push("a", 1, 0.0)
    q.push("b", 1, 0.0)
    assert q.remove(a) and not q.remove(a)
    assert q.pop().tenant == "b" and q.pop() is None and len(q) == 0


ops = st.lists(st.tuples(st.sampled_from(["push", "push", "push", "pop"]), st.integers(0, 3),
                         st.integers(1, 500), st.sampled_from([0, 0, 1, 2])), max_size=300)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_work_conserving_and_bounded(seq: list) -> None:
    p = FlowParams(max_per_tenant=20, max_total=40, starvation_limit=4)
    q = FairQueue(p)
    for op, tenant, cost, prio in seq:
        if op == "push":
            try:
                q.push(f"t{tenant}", cost, 0.0, priority=prio)
            except QueueFull:
                pass
        else:
            had = len(q)
            t = q.pop()
            assert (t is None) == (had == 0)  # never idle while anyone waits
        assert len(q) <= p.max_total and all(q.queued(f"t{i}") <= p.max_per_tenant for i in range(4))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=6), st.lists(st.sampled_from([1.0, 2.0, 0.5]), min_size=6, max_size=6),
       st.integers(0, 10_000))
def test_backlogged_tenants_share_within_the_scfq_bound(costs: list[int], weights: list[float], seed: int) -> None:
    """While every tenant stays backlogged, served work / weight differs between any two tenants by at
    most max cost_i / w_i + max cost_j / w_j (self-clocked fair queuing's bound) plus each one's burst
    allowance, burst_tokens / w (what a tenant below its share may be served ahead)."""
    import random

    rng = random.Random(seed)
    q = FairQueue(BIG)
    n = len(costs)
    tenant_costs = {f"t{i}": [max(1, int(costs[i] * rng.uniform(0.2, 1.0))) for _ in range(400)] for i in range(n)}
    for i in range(400):
        for t, cs in tenant_costs.items():
            q.push(t, cs[i], 0.0, weight=weights[int(t[1:])])
    served = {t: 0.0 for t in tenant_costs}
    for _ in range(300):  # far fewer than queued: everyone stays backlogged
        t = q.pop()
        served[t.tenant] += t.cost
        for a in served:
            for b in served:
                wa, wb = weights[int(a[1:])], weights[int(b[1:])]
                bound = (max(tenant_costs[a]) + BIG.burst_tokens) / wa + (max(tenant_costs[b]) + BIG.burst_tokens) / wb
                assert abs(served[a] / wa - served[b] / wb) <= bound + 1e-6


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 2)), min_size=1, max_size=200),
       st.integers(1, 6), st.integers(0, 10_000))
def test_a_waiting_level_is_served_within_the_starvation_bound(pushes: list, limit: int, seed: int) -> None:
    import random

    rng = random.Random(seed)
    q = FairQueue(FlowParams(max_per_tenant=10_000, max_total=100_000, starvation_limit=limit))
    levels = {p for _, p in pushes}
    for tenant, prio in pushes:  # register every level up front, then keep them all backlogged
        q.push(f"t{tenant}", 1, 0.0, priority=prio)
    bound = q.starvation_bound()
    assert bound == limit + len(levels) - 1
    since = {p: 0 for p in levels}
    for _ in range(300):
        for p in levels:  # top every level back up: all stay non-empty
            q.push(f"t{rng.randrange(4)}", rng.randint(1, 100), 0.0, priority=p)
        t = q.pop()
        for p in levels:
            since[p] = 0 if p == t.priority else since[p] + 1
            assert since[p] < bound, (p, since)


def test_requests_that_never_waited_still_count_against_their_tenant() -> None:
    q = FairQueue(BIG)
    q.charge("flood", 100)  # it took a free slot
    for _ in range(3):
        q.push("flood", 100, 0.0)
    q.push("victim", 100, 1.0)
    assert q.pop().tenant == "victim"
