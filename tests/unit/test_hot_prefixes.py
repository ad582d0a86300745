import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.hot_prefixes import HotPrefix, HotPrefixTracker, common_prefix_len, take_share


def test_shared_system_prompt_is_found_and_block_aligned():
    t = HotPrefixTracker(block_size=4, min_blocks=1)
    system = list(range(100, 118))  # 18 tokens
    t.observe("acme", system + [1, 2, 3], now=0)
    t.observe("acme", system + [7, 8], now=1)
    [hot] = t.hottest(5, now=1)
    assert hot.key == "acme" and hot.tokens == system[:16] and hot.score > 1.9 and hot.salt is None
    assert not hot.thread  # a family's root: what its fresh prompts share


def test_ranking_by_decayed_popularity():
    t = HotPrefixTracker(block_size=2, half_life_s=10, min_blocks=1)
    for i in range(5):
        t.observe("old", [9, 9, 9, 9, i], now=0)
    for i in range(3):
        t.observe("new", [5, 5, 5, 5, i], now=100)
    assert [x.key.split("/")[0] for x in t.hottest(2, now=100)] == ["new", "old"]


def test_short_prefixes_are_not_worth_warming():
    t = HotPrefixTracker(block_size=16, min_blocks=2)
    t.observe("x", list(range(20)), now=0)
    t.observe("x", list(range(20)), now=0)
    assert t.hottest(3, now=0) == []


def test_tables_are_bounded():
    t = HotPrefixTracker(block_size=1, max_tenants=3, min_blocks=1)
    for i in range(10):
        t.observe(f"t{i}", [i, i, i], now=i)
        t.observe(f"t{i}", [i, i, i, 7], now=i)
    assert len(t._roots) <= 3 and len(t._threads) <= 3
    assert len(t.hottest(100, now=10)) <= 6


def _conversation(system: list[int], sid: int, turns: int, block: int) -> list[list[int]]:
    """Each turn re-sends the whole conversation so far plus a new message (a few blocks)."""
    out, ctx = [], list(system)
    for k in range(turns):
        ctx = ctx + [sid * 1000 + k * 10 + j for j in range(2 * block + 1)]
        out.append(list(ctx))
    return out


def test_a_conversation_s_hot_prefix_grows_each_turn():
    """What its latest two prompts share: the previous turn's whole prompt, not the first turn's."""
    t = HotPrefixTracker(block_size=4, min_blocks=1)
    turns = _conversation(list(range(100, 116)), 1, 4, 4)
    for i, p in enumerate(turns):
        t.observe("acme:1", p, now=i)
        if i:
            (hot,) = t.hottest(5, now=i)
            prev = turns[i - 1]
            assert hot.tokens == prev[: (len(prev) - 1) // 4 * 4] and hot.score > i


def test_conversations_of_one_tenant_each_keep_their_own_prefix():
    """Keyed per tenant, interleaved conversations must not shrink to the system prompt they share."""
    t = HotPrefixTracker(block_size=4, min_blocks=1, half_life_s=1e12)  # no decay: exact counts
    system = list(range(100, 116))
    a, b = _conversation(system, 1, 3, 4), _conversation(system, 2, 3, 4)
    for i, (pa, pb) in enumerate(zip(a, b)):
        t.observe("acme:1", pa, now=i)
        t.observe("acme:1", pb, now=i)
    hot = {tuple(h.tokens): h.score for h in t.hottest(10, now=2)}
    kept = lambda p: tuple(p[: (len(p) - 1) // 4 * 4])  # noqa: E731  (full blocks but the last)
    assert hot[kept(a[1])] == pytest.approx(3) == hot[kept(b[1])]  # each conversation: what its latest two prompts share
    assert tuple(system) in hot  # the root: what the fresh prompts (first turns) share
    # Each request counts once: the first turns moved from the root to their conversations.
    assert sum(hot.values()) == pytest.approx(6) and hot[tuple(system)] == pytest.approx(0)


@given(st.lists(st.tuples(st.sampled_from("ab"), st.lists(st.integers(0, 2), max_size=12)), min_size=1, max_size=12))
def test_hot_prefixes_are_shared_and_requests_counted_once(prompts):
    t = HotPrefixTracker(block_size=2, min_blocks=1)
    for key, p in prompts:
        t.observe(key, p, now=0)
    everything = t.hottest(10**6, now=0)
    for h in everything:  # block-aligned, and shared by two observed prompts (never a one-off's tail)
        mine = [p for key, p in prompts if key == h.key[0]]
        assert len(h.tokens) % 2 == 0 and h.tokens
        assert sum(common_prefix_len(h.tokens, p) == len(h.tokens) for p in mine) >= 2
    assert sum(h.score for h in everything) <= len(prompts) + 1e-9


@given(st.lists(st.tuples(st.floats(0.1, 100.0), st.booleans()), max_size=30), st.integers(1, 8),
       st.integers(1, 40), st.sampled_from([0.0, 1.0, 3.0]))
def test_warm_set_carries_the_new_replica_s_share_of_hot_traffic(entries, replicas, cap, floor):
    """A thread (conversation) moves whole to the new replica; a root (tenant prompt) brings 1 / replicas
    of its traffic. Warm the prefixes that bring most until they carry its share, no more."""
    hot = [HotPrefix(f"f{i}", [i, i], s, None, thread) for i, (s, thread) in enumerate(entries)]
    brings = {h.key: h.score if h.thread else h.score / replicas for h in hot}
    got = take_share(hot, replicas, cap, min_brings=floor)
    order = sorted(hot, key=lambda h: -brings[h.key])
    assert [brings[h.key] for h in got] == [brings[h.key] for h in order[: len(got)]]  # most first
    assert all(brings[h.key] >= floor for h in got)
    want, carried = sum(h.score for h in hot) / replicas, sum(brings[h.key] for h in got)
    rest = order[len(got):]
    assert carried >= want - 1e-6 or len(got) == cap or not rest or brings[rest[0].key] < floor  # its share
    assert not got or carried - brings[got[-1].key] < want  # and no more than it takes


def test_a_new_replica_warms_every_hot_tenant_prompt_but_only_its_share_of_conversations():
    t = HotPrefixTracker(block_size=1, min_blocks=1, half_life_s=1e12)
    for tenant in range(4):  # 4 tenants, each a system prompt and 2 fresh questions
        for q in range(2):
            t.observe(f"t{tenant}:1", [tenant, 1, 2, 3, 100 + q, 0], now=0)
    for s in range(6):  # 6 conversations of 3 turns
        for turn in range(3):
            t.observe(f"s{s}:1", [50 + s, 1, 2] + list(range(200, 202 + 2 * turn)) + [0], now=0)
    got = t.warm_set(now=0, replicas=3, min_requests=1.0, max_prefixes=64)
    # Hot traffic 4 x 2 (roots) + 6 x 3 (threads) = 26; a third is 8.7: three conversations (3 each)
    # carry it. A tenant prompt brings a third of its 2, under one request: not worth its prefill.
    assert sorted(h.key.split(":")[0] for h in got) == ["s0", "s1", "s2"]
    got = t.warm_set(now=0, replicas=1, min_requests=1.0, max_prefixes=64)  # one replica takes it all
    assert len(got) == 10
    assert len(t.warm_set(now=0, replicas=1, min_requests=2.5, max_prefixes=64)) == 6  # the floor: roots out


def test_min_score_leaves_out_rarely_seen_prefixes():
    t = HotPrefixTracker(block_size=1, half_life_s=120.0, min_blocks=1)
    for i in range(5):
        t.observe("hot", [1, 2, 3, 9 + i], now=0)
    for i in range(2):
        t.observe("rare", [4, 5, 6, 9 + i], now=0)
    family = lambda hot: [h.key.split("/")[0] for h in hot]  # noqa: E731
    assert family(t.hottest(4, now=0, min_score=4.0)) == ["hot"]
    # The count decays: two minutes later the hot family counts 2.5, under the floor too.
    assert t.hottest(4, now=120.0, min_score=4.0) == []
    assert family(t.hottest(4, now=120.0, min_score=2.0)) == ["hot"]


def test_a_family_keeps_its_cache_salt_for_warm_up():
    t = HotPrefixTracker(block_size=2, min_blocks=1)
    t.observe("acme:1", [1, 2, 3, 4, 5, 7], now=0, salt="kvs-acme")
    t.observe("acme:1", [1, 2, 3, 4, 6, 7], now=0, salt="kvs-acme")
    (hot,) = t.hottest(1, now=0)
    assert hot.salt == "kvs-acme" and hot.tokens == [1, 2, 3, 4]
