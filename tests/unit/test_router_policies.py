"""Routing policies: kvserve's cost-based choice and the simulator baselines' documented thresholds."""

from __future__ import annotations

import itertools
import math
import os
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.config import RouterConfig
from router.base import ReplicaLoad, RouteRequest
from router.block_hash import chain_hashes
from router.bookings import Bookings
from router.policies.approx_tree import ApproxTreePolicy, HistoryRadixTree
from router.policies.kvserve import PrefixCostRouter
from router.policies.ray_prefix_sim import RayPrefixSimPolicy
from router.registry import make_policy, policy_names

BS = 16
_ids = itertools.count()


def request(tokens: list[int], tenant: str = "default") -> RouteRequest:
    return RouteRequest(f"q{next(_ids)}", chain_hashes(tokens, BS), len(tokens), tenant=tenant, token_ids=tokens)


def system_prompt(tenant: int, n: int = 1000) -> list[int]:
    return [tenant * 100_000 + i for i in range(n)]


def question(n: int = 30) -> list[int]:
    k = next(_ids)
    return [900_000_000 + k * 1000 + i for i in range(n)]


def idle(*ids: str) -> list[ReplicaLoad]:
    return [ReplicaLoad(r) for r in ids]


def test_registry_builds_every_policy_by_name():
    assert {"round_robin", "pow2", "kvserve", "approx_tree", "ray_prefix"} <= set(policy_names())
    for name in policy_names():
        p = make_policy(name, RouterConfig().params(), seed=1)
        assert p.name == name
        ranked = p.rank(request(question()), idle("a", "b", "c"), now=0.0)
        assert sorted(ranked) == ["a", "b", "c"]  # every replica, once, best first
    with pytest.raises(ValueError):
        make_policy("nope")


# ---- kvserve ---------------------------------------------------------------


def test_kvserve_prefers_the_replica_holding_the_prefix():
    p = PrefixCostRouter(RouterConfig().params(), seed=0, block_size=BS)
    sys_a = system_prompt(1)
    p.on_cache_snapshot("home", chain_hashes(sys_a, BS), now=0.0)
    p.on_cache_snapshot("other", [], now=0.0)
    for _ in range(20):
        assert p.rank(request(sys_a + question()), idle("home", "other"), now=1.0)[0] == "home"


def test_kvserve_near_ties_are_spread_at_random():
    p = PrefixCostRouter(RouterConfig(tie_tolerance=0.1).params(), seed=7, block_size=BS)
    replicas = idle("a", "b", "c", "d")
    firsts = Counter(p.rank(request(question(200)), replicas, now=0.0)[0] for _ in range(2000))
    assert set(firsts) == {"a", "b", "c", "d"}
    # Uniform would be 500 each; 4 sigma is ~ +-77.
    assert all(400 <= n <= 600 for n in firsts.values()), firsts


def test_kvserve_does_not_shuffle_clear_winners():
    p = PrefixCostRouter(RouterConfig(tie_tolerance=0.1).params(), seed=7, block_size=BS)
    replicas = [ReplicaLoad("busy", queued_prefill_tokens=5000), ReplicaLoad("free"), ReplicaLoad("busier", queued_prefill_tokens=9000)]
    for _ in range(50):
        assert p.rank(request(question(200)), replicas, now=0.0) == ["free", "busy", "busier"]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_kvserve_burst_on_one_hot_prefix_does_not_herd(seed):
    """8 requests sharing one prefix arrive before any replica reports: with a light miss charge the
    replicas are near-ties and the seeded shuffle spreads them."""
    cfg = RouterConfig(cache_miss_weight=1.0, home_affinity=0.3, spill_ttft_ms=None)
    p = PrefixCostRouter(cfg.params(), seed=seed, block_size=BS)
    hot = system_prompt(3)
    replicas = ["a", "b", "c", "d"]
    counts: Counter[str] = Counter()
    for _ in range(8):
        loads = [ReplicaLoad(r, ongoing=counts[r]) for r in replicas]
        req = request(hot + question())
        chosen = p.rank(req, loads, now=0.0)[0]
        p.on_routed(req, chosen, now=0.0)
        counts[chosen] += 1
    assert len(counts) >= 2 and max(counts.values()) <= 5, counts


def test_kvserve_cold_burst_gathers_at_home_then_spreads_with_defaults():
    """Default costs: followers of a cold burst wait for the leader's prefill at home (one prefill instead
    of one per replica) until home's queue costs more than re-prefilling elsewhere; then they spread."""
    p = PrefixCostRouter(RouterConfig().params(), seed=0, block_size=BS)
    hot = system_prompt(4)
    replicas = ["a", "b", "c", "d"]
    placed: list[str] = []
    for _ in range(24):
        req = request(hot + question())
        chosen = p.rank(req, [ReplicaLoad(r) for r in replicas], now=0.0)[0]
        p.on_routed(req, chosen, now=0.0)
        placed.append(chosen)
    counts = Counter(placed)
    home = placed[0]
    assert placed[:4] == [home] * 4  # the cheapest place for the first followers is behind the leader
    assert len(counts) >= 3 and counts[home] < 24 // 2, counts


def test_kvserve_hot_prefix_spills_when_its_home_is_overloaded():
    p = PrefixCostRouter(RouterConfig().params(), seed=0, block_size=BS)
    hot = system_prompt(5)
    p.on_cache_snapshot("home", chain_hashes(hot, BS), now=0.0)
    p.on_cache_snapshot("spare", [], now=0.0)
    req = hot + question()
    light = [ReplicaLoad("home", running=4, queued_prefill_tokens=200), ReplicaLoad("spare", running=4)]
    # Spilling re-prefills ~1,000 tokens and evicts as much (cache_miss_weight 3): worth it once home's
    # queue is several prompts deep.
    heavy = [ReplicaLoad("home", running=30, queued_prefill_tokens=9000), ReplicaLoad("spare", running=4)]
    assert p.rank(request(req), light, now=1.0)[0] == "home"  # cache wins while home keeps up
    assert p.rank(request(req), heavy, now=1.0)[0] == "spare"  # re-prefilling elsewhere is cheaper now
    costs = p.costs(request(req), heavy, now=1.0)
    assert costs["spare"] < costs["home"]


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_kvserve_two_tenants_stick_to_separate_replicas(seed):
    """Balanced, concurrent load from two tenants: each tenant's prefix settles on its own replica."""
    p = PrefixCostRouter(RouterConfig().params(), seed=seed, block_size=BS)
    prompts = {"t0": system_prompt(10), "t1": system_prompt(11)}
    inflight: list[tuple[RouteRequest, str]] = []
    placed: dict[str, list[str]] = {"t0": [], "t1": []}
    now = 0.0
    for i in range(40):
        tenant = f"t{i % 2}"
        # The engines see every request in flight (running), so load is balanced and known.
        n = {r: sum(1 for _, x in inflight if x == r) for r in ("a", "b")}
        loads = [ReplicaLoad(r, ongoing=n[r], running=n[r]) for r in ("a", "b")]
        req = request(prompts[tenant] + question(), tenant)
        chosen = p.rank(req, loads, now)[0]
        p.on_routed(req, chosen, now)
        placed[tenant].append(chosen)
        inflight.append((req, chosen))
        if len(inflight) > 2:  # concurrency 2: the oldest request completes, its engine reports the blocks
            done, where = inflight.pop(0)
            p.on_finished(done, where, now)
            p.on_cache_events(where, stored=done.block_hashes, removed=[], now=now)
        now += 1.5  # a cold 1,030-token prefill is predicted at ~2.6 s with the default CPU slope
    assert len(set(placed["t0"])) == 1 and len(set(placed["t1"])) == 1, placed
    assert placed["t0"][0] != placed["t1"][0]


@pytest.mark.parametrize("weight, expect_spread", [(0.5, True), (0.0, False)])
def test_kvserve_committed_context_spreads_a_cached_tenant(weight, expect_spread):
    """Engines report every request (no unseen work); only the in-flight context term can move the tenant."""
    p = PrefixCostRouter(RouterConfig(active_token_weight=weight).params(), seed=0, block_size=BS)
    hot = system_prompt(4)
    p.on_cache_snapshot("home", chain_hashes(hot, BS), now=0.0)
    p.on_cache_snapshot("spare", [], now=0.0)
    counts: Counter[str] = Counter()
    for _ in range(12):
        loads = [ReplicaLoad(r, ongoing=counts[r], running=counts[r]) for r in ("home", "spare")]
        req = RouteRequest(f"q{next(_ids)}", chain_hashes(hot + question(), BS), 1030, expected_output_tokens=16)
        chosen = p.rank(req, loads, now=1.0)[0]
        p.on_routed(req, chosen, now=1.0)
        counts[chosen] += 1
    if expect_spread:
        # home takes the first couple; once spare holds the prefix too, the two share it evenly.
        assert min(counts.values()) >= 5, counts
    else:
        assert counts == {"home": 12}  # pure TTFT: 12 decodes barely slow a cached prefill


def test_kvserve_counts_its_own_unreported_requests():
    """Stats say both replicas are idle, but this router just sent a cold prompt to one of them."""
    cfg = RouterConfig(tie_tolerance=0.0, active_token_weight=0.0, prefill_ms_per_token=2.5, decode_ms_per_seq=5.0)
    p = PrefixCostRouter(cfg.params(), seed=0, block_size=BS)
    first = request(question(800))
    p.rank(first, idle("a", "b"), now=0.0)
    p.on_routed(first, "a", now=0.0)  # predicted prefill: 800 * 2.5 ms = 2 s
    nxt = request(question(800))
    stale = [ReplicaLoad("a", ongoing=1), ReplicaLoad("b")]
    assert p.rank(nxt, stale, now=0.1)[0] == "b"
    costs = p.costs(nxt, stale, now=0.1)
    assert costs["a"] - costs["b"] == pytest.approx(800 * 2.5)
    # When the stats do show it, it is not counted twice.
    shown = [ReplicaLoad("a", ongoing=1, waiting=1, queued_prefill_tokens=800), ReplicaLoad("b")]
    assert p.costs(nxt, shown, now=0.1) == costs
    # After its predicted prefill it counts as a running sequence only.
    later = p.costs(nxt, stale, now=2.5)
    assert later["a"] - later["b"] == pytest.approx(cfg.decode_ms_per_seq)
    p.on_finished(first, "a", now=3.0)
    after = p.costs(nxt, idle("a", "b"), now=3.0)
    assert after["a"] == after["b"]


def test_kvserve_falls_back_to_load_for_gone_or_silent_replicas():
    p = PrefixCostRouter(RouterConfig(stale_after_s=5.0).params(), seed=0, block_size=BS)
    sys_a = system_prompt(1)
    p.on_cache_snapshot("home", chain_hashes(sys_a, BS), now=0.0)
    p.on_cache_snapshot("other", [], now=0.0)
    loads = [ReplicaLoad("home", queued_prefill_tokens=500), ReplicaLoad("other")]
    assert p.rank(request(sys_a + question()), loads, now=4.0)[0] == "home"  # cache outweighs its queue
    p.on_cache_snapshot("other", [], now=6.0)
    assert p.rank(request(sys_a + question()), loads, now=6.0)[0] == "other"  # home is silent: load decides
    p.on_replica_gone("home")
    assert p.index.num_entries() == 0


# ---- SGLang-style approximate tree -----------------------------------------


def _tree_with(prompt: list[int], on: str, policy) -> None:
    policy.on_routed(request(prompt), on, now=0.0)


def test_approx_tree_match_rate_threshold_is_0_3():
    p = ApproxTreePolicy()
    base = list(range(1000))
    _tree_with(base, "a", p)
    loads = [ReplicaLoad("a", ongoing=3), ReplicaLoad("b", ongoing=0)]
    above = base[:350] + question(650)  # 35% of the prompt matched
    below = base[:250] + question(750)  # 25%
    assert p.rank(request(above), loads, now=1.0)[0] == "a"
    assert p.rank(request(below), loads, now=1.0)[0] == "b"  # smallest tree (b holds nothing)


def test_approx_tree_imbalance_needs_both_abs_64_and_rel_1_5():
    p = ApproxTreePolicy()
    base = list(range(1000))
    _tree_with(base, "a", p)
    req = request(base[:900] + question(100))

    def first(a: int, b: int) -> str:
        return p.rank(req, [ReplicaLoad("a", ongoing=a), ReplicaLoad("b", ongoing=b)], now=1.0)[0]

    assert first(100, 10) == "b"  # diff 90 > 64 and 100 > 1.5 * 10: shortest queue
    assert first(70, 10) == "a"  # diff 60 <= 64: cache affinity
    assert first(300, 230) == "a"  # diff 70 > 64 but 300 < 1.5 * 230: still affinity


def test_approx_tree_evicts_least_recently_used_history():
    p = ApproxTreePolicy(max_tree_size=1500)
    old, new = list(range(1000)), list(range(10_000, 11_000))
    p.on_routed(request(old), "a", now=0.0)
    p.on_routed(request(new), "a", now=1.0)
    assert p.tree.size("a") <= 1500
    loads = idle("a", "b")
    assert p.rank(request(new[:900] + question(100)), loads, now=2.0)[0] == "a"
    assert p.rank(request(old[:900] + question(100)), loads, now=2.0)[0] == "b"  # forgotten: smallest tree


# ---- Ray PrefixCacheAffinityRouter logic -----------------------------------


def test_ray_prefix_match_rate_threshold_is_0_1():
    p = RayPrefixSimPolicy(seed=0)
    base = list(range(1000))
    _tree_with(base, "a", p)
    loads = [ReplicaLoad("a", ongoing=2), ReplicaLoad("b", ongoing=0)]
    assert p.rank(request(base[:150] + question(850)), loads, now=1.0)[0] == "a"
    assert p.rank(request(base[:50] + question(950)), loads, now=1.0)[0] == "b"


def test_ray_prefix_ignores_load_by_default_and_never_sees_evictions():
    p = RayPrefixSimPolicy(seed=0)
    base = list(range(1000))
    _tree_with(base, "a", p)
    req = request(base[:900] + question(100))
    swamped = [ReplicaLoad("a", ongoing=1000), ReplicaLoad("b", ongoing=0)]
    assert p.imbalanced_threshold == math.inf
    assert p.rank(req, swamped, now=1.0)[0] == "a"
    p.on_cache_events("a", stored=[], removed=req.block_hashes, now=1.0)  # the engine evicted it
    assert p.rank(req, swamped, now=1.0)[0] == "a"  # routing history only


def test_ray_prefix_with_finite_threshold_falls_back_to_pow2():
    p = RayPrefixSimPolicy(seed=0, imbalanced_threshold=10)
    base = list(range(1000))
    _tree_with(base, "a", p)
    req = request(base[:900] + question(100))
    assert p.rank(req, [ReplicaLoad("a", ongoing=50), ReplicaLoad("b", ongoing=0)], now=1.0)[0] == "b"
    assert p.rank(req, [ReplicaLoad("a", ongoing=5), ReplicaLoad("b", ongoing=0)], now=1.0)[0] == "a"


def test_ray_prefix_uses_text_when_present():
    p = RayPrefixSimPolicy(seed=0)
    p.on_routed(RouteRequest("x", [], 10, text="You are a helpful pirate. Hi"), "a", now=0.0)
    loads = idle("a", "b")
    assert p.rank(RouteRequest("y", [], 10, text="You are a helpful pirate. Bye"), loads, 1.0)[0] == "a"
    assert p.rank(RouteRequest("z", [], 10, text="Translate this sentence now"), loads, 1.0)[0] == "b"


# ---- the shared history tree ------------------------------------------------


def _lcp(a, b) -> int:
    return len(os.path.commonprefix([a, b]))


seqs = st.lists(st.integers(0, 3), min_size=1, max_size=10).map(tuple)


@settings(max_examples=200, deadline=None)
@given(
    inserts=st.lists(st.tuples(seqs, st.sampled_from("abc")), max_size=15),
    query=seqs,
    allowed=st.sets(st.sampled_from("abc"), min_size=1),
    gone=st.sets(st.sampled_from("abc")),
)
def test_history_tree_match_equals_brute_force(inserts, query, allowed, gone):
    tree = HistoryRadixTree()
    for t, (s, r) in enumerate(inserts):
        tree.insert(s, r, float(t))
    for r in gone:
        tree.remove_replica(r)
    live = [(s, r) for s, r in inserts if r in allowed and r not in gone]
    best = max((_lcp(s, query) for s, _ in live), default=0)
    holders = {r for s, r in live if _lcp(s, query) == best} if best else set()
    matched, got = tree.match(query, allowed)
    assert matched == best
    assert set(got) == holders
    # Sizes count each replica's distinct prefix units exactly.
    for r in "abc":
        if r in gone:
            assert tree.size(r) == 0
            continue
        mine = [s for s, x in inserts if x == r]
        assert tree.size(r) == len({s[:i] for s in mine for i in range(1, len(s) + 1)})


@settings(max_examples=100, deadline=None)
@given(inserts=st.lists(seqs, min_size=1, max_size=15), target=st.integers(0, 20))
def test_history_tree_lru_eviction_keeps_recent_and_respects_target(inserts, target):
    tree = HistoryRadixTree()
    for t, s in enumerate(inserts):
        tree.insert(s, "a", float(t))
    tree.evict_lru("a", target)
    assert tree.size("a") <= target
    # Whatever survives is still prefix-closed and accounted: matching any insert never exceeds its length.
    for s in inserts:
        matched, holders = tree.match(s, {"a"})
        assert matched <= len(s) and (matched == 0) == (not holders)
    if target >= len(inserts[-1]):
        assert tree.match(inserts[-1], {"a"})[0] == len(inserts[-1])  # the most recent one survives


def _brute_known_load(p: PrefixCostRouter, load: ReplicaLoad, now: float) -> tuple[int, int]:
    """The definition `_known_load` keeps incrementally: walk every in-flight request of ours."""
    mine = p._inflight.get(load.replica_id, {})
    waiting = [r for r in mine.values() if r.prefill_done_at > now]
    return (
        max(load.queued_prefill_tokens, sum(r.uncached for r in waiting)),
        max(load.running, len(mine) - len(waiting)),
    )


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["route", "route", "finish", "gone"]),
            st.integers(0, 2),  # replica
            st.integers(1, 900),  # prompt tokens
            st.floats(0.0, 0.6),  # time step before the op
        ),
        min_size=1,
        max_size=60,
    )
)
def test_kvserve_incremental_known_load_equals_brute_force(ops):  # type: ignore[no-untyped-def]
    """Routes, finishes, retries and replica loss in any order: the O(1) totals match a full walk."""
    p = PrefixCostRouter(RouterConfig(prefill_ms_per_token=1.0).params(), seed=0, block_size=BS)
    rids = ["a", "b", "c"]
    reported = [ReplicaLoad(r, running=1, queued_prefill_tokens=50) for r in rids]
    live: list[tuple[RouteRequest, str]] = []
    now = 0.0
    for i, (op, k, tokens, dt) in enumerate(ops):
        now += dt
        if op == "route":
            # Every 5th op re-sends the oldest live request to the same replica (a retry).
            req, rid = live[0] if live and i % 5 == 0 else (request(question(tokens)), rids[k])
            p.rank(req, idle(*rids), now)
            p.on_routed(req, rid, now)
            if (req, rid) not in live:
                live.append((req, rid))
        elif op == "finish" and live:
            req, rid = live.pop(k % len(live))
            p.on_finished(req, rid, now)
        elif op == "gone":
            p.on_replica_gone(rids[k])
            live = [(q, r) for q, r in live if r != rids[k]]
        for load in reported + idle(*rids):
            assert p._known_load(load, now) == _brute_known_load(p, load, now)


def _homed_policy(cfg: RouterConfig, hot: list[int], holders: tuple[str, ...] = ("home",)) -> PrefixCostRouter:
    p = PrefixCostRouter(cfg.params(), seed=0, block_size=BS)
    for r in holders:
        p.on_cache_snapshot(r, chain_hashes(hot, BS), now=0.0)
    first = request(hot + question())
    p.rank(first, idle("home", "other"), now=0.0)
    p.on_routed(first, "home", now=0.0)
    p.on_finished(first, "home", now=1.0)
    return p


def test_kvserve_family_stays_home_under_the_spill_bound_however_short_other_queues_look():
    """Below spill_ttft_ms a family does not chase a shorter queue where its prefix would miss (under
    saturation that ping-pongs every tenant between replicas); above it, the cost model decides and it moves."""
    hot = system_prompt(6, n=400)
    # No miss surcharge and no affinity margin: only the spill rule keeps the family home.
    cfg = dict(cache_miss_weight=0.0, home_affinity=0.0)
    queued = [ReplicaLoad("home", queued_prefill_tokens=800), ReplicaLoad("other")]  # ~1.5 s at home
    p = _homed_policy(RouterConfig(spill_ttft_ms=2000.0, **cfg), hot)
    assert p.rank(request(hot + question()), queued, now=5.0)[0] == "home"
    p = _homed_policy(RouterConfig(spill_ttft_ms=None, **cfg), hot)
    assert p.rank(request(hot + question()), queued, now=5.0)[0] == "other"
    p = _homed_policy(RouterConfig(spill_ttft_ms=2000.0, **cfg), hot)
    deeper = [ReplicaLoad("home", queued_prefill_tokens=1500), ReplicaLoad("other")]  # ~2.9 s: over the bound
    assert p.rank(request(hot + question()), deeper, now=5.0)[0] == "other"


def test_kvserve_home_gives_way_to_an_idle_replica_holding_the_same_prefix():
    """The spill rule guards against misses only: when another replica holds the prefix too (a warmed
    replica after scale-up), leaving home misses nothing, so the shorter queue wins (issue 5 item 4)."""
    hot = system_prompt(6)
    queued = [ReplicaLoad("home", queued_prefill_tokens=800), ReplicaLoad("other")]  # ~1.5 s at home
    p = _homed_policy(RouterConfig(spill_ttft_ms=2000.0), hot, holders=("home", "other"))
    assert p.rank(request(hot + question()), queued, now=5.0)[0] == "other"
    # Holding less of the prompt than home is a partial miss: the rule still applies.
    p = _homed_policy(RouterConfig(spill_ttft_ms=2000.0), hot, holders=("home",))
    p.on_cache_snapshot("other", chain_hashes(hot, BS)[:20], now=0.0)
    assert p.rank(request(hot + question()), queued, now=5.0)[0] == "home"


def test_kvserve_burst_after_scale_up_reaches_the_warmed_replica():
    """Every tenant's home is the old replica; a new one joins holding the same prefixes (warmed). A
    24-request burst at concurrency 8, booked as the Serve adapter books it, must reach the new one."""
    p = PrefixCostRouter(RouterConfig(spill_ttft_ms=2000.0).params(), seed=0, block_size=BS)
    bookings = Bookings(p)
    prompts = [system_prompt(t) for t in range(4)]
    held = [h for sp in prompts for h in chain_hashes(sp, BS)]
    p.on_cache_snapshot("old", held, now=0.0)
    now = 0.0
    for i in range(12):  # history: each tenant homed on "old"
        r = request(prompts[i % 4] + question(), tenant=str(i % 4))
        rid = p.rank(r, idle("old"), now)[0]
        bookings.decided(r, rid, now)
        bookings.accepted(r, rid, now)
        now += 0.5
        bookings.finished(r.request_id, rid, now)
    now += 15.0
    for rid in ("old", "new"):
        p.on_cache_snapshot(rid, held, now)
    placed: Counter[str] = Counter()
    inflight: list[tuple[str, str]] = []
    for i in range(24):
        r = request(prompts[i % 4] + question(), tenant=str(i % 4))
        loads = [ReplicaLoad(x, ongoing=bookings.ongoing(x), running=bookings.ongoing(x)) for x in ("old", "new")]
        rid = p.rank(r, loads, now)[0]
        bookings.decided(r, rid, now)
        bookings.accepted(r, rid, now)
        placed[rid] += 1
        inflight.append((r.request_id, rid))
        if len(inflight) == 8:
            done, where = inflight.pop(0)
            now += 0.3
            bookings.finished(done, where, now)
        now += 0.01
    assert placed["new"] >= 8, placed
