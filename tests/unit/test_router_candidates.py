"""Candidate replicas (router.candidates) and the kvserve policy scoring only them.

The property that matters: whenever the prefix holders and the sample together can
reach every replica, the sampled policy decides exactly as the exhaustive one, over
a whole run of decisions with their feedback (homes, in-flight work, speculation).
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.config import RouterConfig
from router.base import ReplicaLoad, RouteRequest
from router.block_hash import chain_ids
from router.candidates import candidate_ids, prefix_holders
from router.policies.kvserve import PrefixCostRouter

BS = 16


def ids(n: int) -> list[str]:
    return [f"r{i:04d}" for i in range(n)]


# ---- candidate_ids ---------------------------------------------------------------------------


def test_every_replica_while_they_are_few_or_sampling_is_off():
    reps = ids(10)
    rng = random.Random(0)
    assert sorted(candidate_ids({}, reps, set(reps), 10, rng)) == reps
    assert sorted(candidate_ids({"r0003": 4}, reps, set(reps), None, rng)) == reps
    # 2 holders + 8 others = everyone: nothing is drawn, all are scored.
    state = rng.getstate()
    assert sorted(candidate_ids({"r0001": 2, "r0002": 5}, reps, set(reps), 8, rng)) == reps
    assert rng.getstate() == state


def test_holders_home_and_a_bounded_sample():
    reps = ids(1000)
    matches = {"r0500": 7, "r0007": 3, "gone": 9}  # "gone" is not routable: ignored
    got = candidate_ids(matches, reps, set(reps), 16, random.Random(1), always=("r0999", "missing"))
    assert set(got[:2]) == {"r0500", "r0007"}
    assert "r0999" in got and "gone" not in got and "missing" not in got
    assert len(got) == len(set(got)) == 2 + 1 + 16


def test_holder_cap_keeps_the_longest_and_draws_among_ties_at_the_cut():
    matches = {f"r{i:04d}": (9 if i < 3 else 4) for i in range(40)}
    routable = set(matches)
    seen: Counter[str] = Counter()
    for seed in range(200):
        got = prefix_holders(matches, routable, 8, random.Random(seed))
        assert len(got) == 8
        assert {"r0000", "r0001", "r0002"} <= set(got)  # longer matches always kept
        seen.update(got)
    assert len(seen) == 40  # the tied holders take turns


def test_the_sample_reaches_every_replica_evenly():
    reps = ids(200)
    rng = random.Random(3)
    counts = Counter(r for _ in range(2000) for r in candidate_ids({}, reps, set(reps), 16, rng))
    assert set(counts) == set(reps)
    # Each draw takes 16 of 200: 160 expected per replica; 5 sigma is ~ +-60.
    assert all(100 <= c <= 220 for c in counts.values()), counts.most_common(3)


# ---- the kvserve policy on candidates --------------------------------------------------------


def chain(prefix: int, length: int, tail: int) -> list[int]:
    return chain_ids([prefix * 1000 + i for i in range(length)] + [-(tail * 100 + i) - 1 for i in range(2)])


def test_the_prefix_holder_wins_among_a_thousand():
    p = PrefixCostRouter(RouterConfig().params(), seed=0, block_size=BS)
    reps = ids(1000)
    hashes = chain(1, 30, 0)
    p.on_cache_snapshot("r0637", hashes[:30], now=0.0)
    for r in reps:
        p.on_cache_events(r, (), (), now=0.0)
    loads = {r: ReplicaLoad(r, kv_capacity_tokens=100_000) for r in reps}
    req = RouteRequest("q", hashes, len(hashes) * BS)
    assert p.rank(req, loads, now=1.0)[0] == "r0637"
    assert len(p.costs(req, loads, now=1.0)) <= 1 + 16 + 1


request_plans = st.lists(
    st.tuples(st.integers(0, 5), st.integers(1, 12), st.integers(0, 3)),  # family, shared blocks, tail id
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    n_rep=st.integers(1, 9),
    sample=st.integers(1, 12),
    plan=request_plans,
    loads_seed=st.integers(0, 10_000),
    snapshot=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 5), st.integers(1, 12)), max_size=8),
    finish_every=st.integers(1, 4),
)
def test_sampled_decides_as_exhaustive_while_the_sample_covers_every_replica(
    n_rep, sample, plan, loads_seed, snapshot, finish_every
):
    reps = ids(n_rep)
    exhaustive = PrefixCostRouter(RouterConfig(sample_replicas=None).params(), seed=5, block_size=BS)
    sampled = PrefixCostRouter(RouterConfig(sample_replicas=sample).params(), seed=5, block_size=BS)
    for p in (exhaustive, sampled):
        for r_idx, fam, length in snapshot:
            if r_idx < n_rep:
                p.on_cache_events(reps[r_idx], chain(fam, length, 99)[:length], (), now=0.0)
    rng = random.Random(loads_seed)
    in_flight: list[tuple[RouteRequest, str]] = []
    for n, (fam, length, tail) in enumerate(plan):
        now = 0.5 + 0.3 * n
        loads = {
            r: ReplicaLoad(r, running=rng.randrange(8), queued_prefill_tokens=rng.choice([0, 0, 64, 900]),
                           kv_usage=rng.random(), kv_capacity_tokens=rng.choice([0, 160, 4000]))
            for r in reps
        }
        hashes = chain(fam, length, tail)
        req = RouteRequest(f"q{n}", hashes, len(hashes) * BS + 5, expected_output_tokens=8)
        ranked_sampled = sampled.rank(req, loads, now)
        if len(ranked_sampled) < n_rep:
            return  # this decision's sample did not cover every replica: the runs may part from here
        ranked_exhaustive = exhaustive.rank(req, list(loads.values()), now)
        assert ranked_sampled == ranked_exhaustive
        for p in (exhaustive, sampled):
            p.on_routed(req, ranked_exhaustive[0], now)
        in_flight.append((req, ranked_exhaustive[0]))
        if n % finish_every == 0 and in_flight:
            done, rid = in_flight.pop(0)
            for p in (exhaustive, sampled):
                p.on_finished(done, rid, now)
