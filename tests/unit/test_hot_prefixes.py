from hypothesis import given
from hypothesis import strategies as st

from router.hot_prefixes import HotPrefixTracker, common_prefix_len


def test_shared_system_prompt_is_found_and_block_aligned():
    t = HotPrefixTracker(block_size=4, min_blocks=1)
    system = list(range(100, 118))  # 18 tokens
    t.observe("acme", system + [1, 2, 3], now=0)
    t.observe("acme", system + [7, 8], now=1)
    [(tenant, prefix, score, salt)] = t.hottest(5, now=1)
    assert tenant == "acme" and prefix == system[:16] and score > 1.9 and salt is None


def test_ranking_by_decayed_popularity():
    t = HotPrefixTracker(block_size=2, half_life_s=10, min_blocks=1)
    for i in range(5):
        t.observe("old", [9, 9, 9, 9, i], now=0)
    for i in range(3):
        t.observe("new", [5, 5, 5, 5, i], now=100)
    assert [x[0] for x in t.hottest(2, now=100)] == ["new", "old"]


def test_short_prefixes_are_not_worth_warming():
    t = HotPrefixTracker(block_size=16, min_blocks=2)
    t.observe("x", list(range(20)), now=0)
    t.observe("x", list(range(20)), now=0)
    assert t.hottest(3, now=0) == []


def test_tenant_table_is_bounded():
    t = HotPrefixTracker(block_size=1, max_tenants=3, min_blocks=1)
    for i in range(10):
        t.observe(f"t{i}", [i, i, i], now=i)
    assert len(t.hottest(100, now=10)) <= 3


@given(st.lists(st.lists(st.integers(0, 3), max_size=30), min_size=1, max_size=8))
def test_prefix_is_common_to_every_observed_prompt(prompts):
    t = HotPrefixTracker(block_size=2, min_blocks=1)
    for p in prompts:
        t.observe("x", p, now=0)
    for _, prefix, *_ in t.hottest(1, now=0):
        assert len(prefix) % 2 == 0
        assert all(common_prefix_len(prefix, p) == len(prefix) for p in prompts[1:])


def test_min_score_leaves_out_rarely_seen_prefixes():
    t = HotPrefixTracker(block_size=1, half_life_s=120.0, min_blocks=1)
    for _ in range(5):
        t.observe("hot", [1, 2, 3, 9], now=0)
    for _ in range(2):
        t.observe("rare", [4, 5, 6, 9], now=0)
    assert [h.key for h in t.hottest(4, now=0, min_score=4.0)] == ["hot"]
    # The count decays: two minutes later the hot family counts 2.5, under the floor too.
    assert t.hottest(4, now=120.0, min_score=4.0) == []
    assert [h.key for h in t.hottest(4, now=120.0, min_score=2.0)] == ["hot"]


def test_a_family_keeps_its_cache_salt_for_warm_up():
    t = HotPrefixTracker(block_size=2, min_blocks=1)
    t.observe("acme:1", [1, 2, 3, 4, 5], now=0, salt="kvs-acme")
    t.observe("acme:1", [1, 2, 3, 4, 6], now=0, salt="kvs-acme")
    (hot,) = t.hottest(1, now=0)
    assert hot.salt == "kvs-acme" and hot.tokens == [1, 2, 3, 4]
