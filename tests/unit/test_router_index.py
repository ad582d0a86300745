"""PrefixIndex against a brute-force reference, plus block-hash chaining properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from router.block_hash import chain_hashes, chain_ids
from router.index import PrefixIndex

TTL = 3.0
STALE = 5.0
REPLICAS = ["r0", "r1", "r2"]


class ReferenceIndex:
    """The obvious, slow model of what PrefixIndex promises."""

    def __init__(self) -> None:
        self.confirmed: dict[str, set[int]] = {}
        self.spec: dict[str, dict[int, float]] = {}
        self.heard: dict[str, float] = {}

    def snapshot(self, r: str, hashes: set[int], now: float) -> None:
        self.confirmed[r] = set(hashes)
        for h in hashes:
            self.spec.get(r, {}).pop(h, None)
        self.heard[r] = now

    def events(self, r: str, stored: list[int], removed: list[int], now: float) -> None:
        conf = self.confirmed.setdefault(r, set())
        for h in stored:
            conf.add(h)
            self.spec.get(r, {}).pop(h, None)
        for h in removed:
            conf.discard(h)
            self.spec.get(r, {}).pop(h, None)
        self.heard[r] = now

    def routed(self, r: str, chain: list[int], now: float) -> None:
        self.heard.setdefault(r, now)
        conf = self.confirmed.setdefault(r, set())
        for h in chain:
            if h not in conf:
                self.spec.setdefault(r, {})[h] = now + TTL

    def gone(self, r: str) -> None:
        self.confirmed.pop(r, None)
        self.spec.pop(r, None)
        self.heard.pop(r, None)

    def held(self, r: str, now: float) -> set[int]:
        live_spec = {h for h, exp in self.spec.get(r, {}).items() if exp > now}
        return self.confirmed.get(r, set()) | live_spec

    def match(self, chain: list[int], now: float) -> dict[str, int]:
        out = {}
        for r, heard in self.heard.items():
            if now - heard >= STALE:
                continue
            held = self.held(r, now)
            n = 0
            while n < len(chain) and chain[n] in held:
                n += 1
            if n:
                out[r] = n
        return out


hashes = st.integers(0, 11)
replica = st.sampled_from(REPLICAS)
op = st.one_of(
    st.tuples(st.just("snapshot"), replica, st.sets(hashes, max_size=8)),
    st.tuples(st.just("events"), replica, st.lists(hashes, max_size=5), st.lists(hashes, max_size=3)),
    st.tuples(st.just("routed"), replica, st.lists(hashes, max_size=6)),
    st.tuples(st.just("gone"), replica),
    st.tuples(st.just("tick"), st.sampled_from([0.5, 1.0, 2.0, 4.0])),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, max_size=40), queries=st.lists(st.lists(hashes, min_size=1, max_size=6), min_size=1, max_size=5))
def test_longest_prefix_match_equals_brute_force(ops, queries):
    idx, ref, now = PrefixIndex(TTL, STALE), ReferenceIndex(), 0.0
    for o in ops:
        kind = o[0]
        if kind == "snapshot":
            idx.on_cache_snapshot(o[1], o[2], now)
            ref.snapshot(o[1], o[2], now)
        elif kind == "events":
            idx.on_cache_events(o[1], o[2], o[3], now)
            ref.events(o[1], o[2], o[3], now)
        elif kind == "routed":
            idx.on_routed(o[1], o[2], now)
            ref.routed(o[1], o[2], now)
        elif kind == "gone":
            idx.on_replica_gone(o[1])
            ref.gone(o[1])
        else:
            now += o[1]
        for q in queries:
            assert idx.match(q, now) == ref.match(q, now)
        for r in REPLICAS:
            assert idx.blocks_of(r, now) == ref.held(r, now)
        # The global map holds exactly the live per-replica entries: nothing dangles.
        assert idx.num_entries() == sum(len(ref.held(r, now)) for r in REPLICAS)
    for r in REPLICAS:
        idx.on_replica_gone(r)
    assert idx.num_entries() == 0


def test_eviction_event_removes_entries():
    idx = PrefixIndex(TTL, STALE)
    chain = chain_ids(range(6))
    idx.on_cache_events("a", stored=chain, removed=[], now=0.0)
    assert idx.match(chain, 0.0) == {"a": 6}
    idx.on_cache_events("a", stored=[], removed=[chain[3]], now=0.1)
    assert idx.match(chain, 0.1) == {"a": 3}
    idx.on_cache_events("a", stored=[], removed=chain[:3], now=0.2)
    assert idx.match(chain, 0.2) == {}
    assert idx.num_entries() == 2  # blocks 4 and 5 are still cached, just unreachable as a prefix


def test_speculative_entries_expire_unless_confirmed():
    idx = PrefixIndex(speculative_ttl_s=2.0, stale_after_s=100.0)
    a, b = chain_ids([1, 2, 3]), chain_ids([7, 8])
    idx.on_routed("x", a, now=0.0)
    idx.on_routed("x", b, now=0.0)
    idx.on_cache_events("x", stored=b, removed=[], now=1.0)  # the engine confirms b only
    assert idx.match(a, 1.9) == {"x": 3}
    assert idx.match(a, 2.0) == {}
    assert idx.match(b, 50.0) == {"x": 2}


def test_routing_again_refreshes_a_speculative_entry():
    idx = PrefixIndex(speculative_ttl_s=2.0, stale_after_s=100.0)
    a = chain_ids([1, 2])
    idx.on_routed("x", a, now=0.0)
    idx.on_routed("x", a, now=1.5)
    assert idx.match(a, 3.0) == {"x": 2}
    assert idx.match(a, 3.5) == {}


def test_stale_and_gone_replicas_match_nothing():
    idx = PrefixIndex(speculative_ttl_s=100.0, stale_after_s=5.0)
    chain = chain_ids([1, 2, 3])
    idx.on_cache_snapshot("live", chain, now=0.0)
    idx.on_cache_snapshot("silent", chain, now=0.0)
    idx.on_cache_events("live", stored=[], removed=[], now=4.0)  # a heartbeat keeps it fresh
    assert idx.match(chain, 4.9) == {"live": 3, "silent": 3}
    assert idx.match(chain, 5.0) == {"live": 3}
    assert idx.is_stale("silent", 5.0) and not idx.is_stale("live", 5.0)
    idx.on_replica_gone("live")
    assert idx.match(chain, 5.0) == {}
    assert "live" not in idx.replicas()


def test_snapshot_replaces_the_previous_one():
    idx = PrefixIndex(TTL, STALE)
    old, new = chain_ids([1, 2, 3]), chain_ids([4, 5])
    idx.on_cache_snapshot("a", old, now=0.0)
    idx.on_cache_snapshot("a", new, now=1.0)
    assert idx.match(old, 1.0) == {}
    assert idx.match(new, 1.0) == {"a": 2}
    assert idx.num_entries() == 2


@given(tokens=st.lists(st.integers(0, 50_000), max_size=200), cut=st.integers(0, 200), bs=st.sampled_from([1, 4, 16]))
def test_chain_hashes_are_prefix_consistent(tokens, cut, bs):
    full = chain_hashes(tokens, bs)
    prefix = chain_hashes(tokens[:cut], bs)
    assert len(full) == len(tokens) // bs
    assert full[: len(prefix)] == prefix  # a prefix's blocks hash the same inside any longer prompt


@given(a=st.lists(st.integers(0, 9), min_size=1, max_size=12), b=st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_equal_chain_position_means_equal_prefix(a, b):
    ha, hb = chain_ids(a), chain_ids(b)
    for i in range(min(len(a), len(b))):
        assert (ha[i] == hb[i]) == (a[: i + 1] == b[: i + 1])
