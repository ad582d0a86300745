"""The replica-side signals behind `queued_prefill_tokens`: the backlog count and the prefix lookup."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from deployments.prefill_backlog import PrefillBacklog
from router.block_hash import chain_hashes
from router.engine_blocks import EngineBlockSet


def test_backlog_counts_uncached_tokens_until_first_output():
    b = PrefillBacklog()
    b.arrived("a", prompt_tokens=1030, cached_blocks=60, block_size=16)  # 1030 - 960 = 70 new tokens
    b.arrived("b", prompt_tokens=500, cached_blocks=0, block_size=16)
    assert (b.tokens, len(b)) == (570, 2)
    b.done("a")
    b.done("a")  # first output and the finally both report: counted once
    b.done("never-seen")
    assert (b.tokens, len(b)) == (500, 1)


def test_a_fully_cached_prompt_still_counts_one_token():
    b = PrefillBacklog()
    b.arrived("a", prompt_tokens=32, cached_blocks=2, block_size=16)
    assert b.tokens == 1


ops = st.lists(st.tuples(st.sampled_from(["arrive", "done"]), st.integers(0, 5),
                         st.integers(1, 3000), st.integers(0, 200)), max_size=60)


@given(ops=ops)
def test_backlog_equals_the_sum_over_pending_requests(ops):
    b, model = PrefillBacklog(), {}
    for kind, rid, prompt, cached in ops:
        if kind == "arrive":
            b.arrived(str(rid), prompt, cached, 16)
            model[rid] = max(prompt - cached * 16, 1)
        else:
            b.done(str(rid))
            model.pop(rid, None)
        assert b.tokens == sum(model.values()) >= 0
        assert len(b) == len(model)


def _store(blocks: EngineBlockSet, tokens: list[int], tag: str) -> list[str]:
    """Store a prompt's full blocks as one engine event; engine hashes are opaque strings."""
    n = len(tokens) // blocks.block_size
    engine = [f"{tag}:{i}" for i in range(n)]
    blocks.stored(engine, None, tokens[: n * blocks.block_size])
    return engine


def test_prefix_blocks_counts_leading_held_blocks_and_follows_evictions():
    blocks = EngineBlockSet(block_size=4)
    system = list(range(100, 112))  # 3 blocks
    engine = _store(blocks, system + [1, 2, 3, 4], "a")
    query = chain_hashes(system + [9, 9, 9, 9, 9], 4)
    assert blocks.prefix_blocks(query) == 3
    blocks.removed([engine[1]])  # a hole in the middle ends the prefix there
    assert blocks.prefix_blocks(query) == 1
    blocks.cleared()
    assert blocks.prefix_blocks(query) == 0


def test_a_block_held_twice_survives_one_removal():
    """Two engine blocks can carry the same content (e.g. stored before and after a reset of its hash seed)."""
    blocks = EngineBlockSet(block_size=4)
    toks = list(range(8))
    first, second = _store(blocks, toks, "x"), _store(blocks, toks, "y")
    blocks.removed(first)
    assert blocks.prefix_blocks(chain_hashes(toks, 4)) == 2
    blocks.removed(second)
    assert blocks.prefix_blocks(chain_hashes(toks, 4)) == 0


prompts = st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=14), min_size=1, max_size=5)


@given(prompts=prompts, evict=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3))), query=st.lists(st.integers(0, 3), max_size=14))
def test_prefix_blocks_equals_brute_force(prompts, evict, query):
    blocks = EngineBlockSet(block_size=2)
    engine = [_store(blocks, p, f"p{i}") for i, p in enumerate(prompts)]
    gone = set()
    for p, i in evict:
        if p < len(engine) and i < len(engine[p]):
            blocks.removed([engine[p][i]])
            gone.add((p, i))
    held = {h for p, hs in enumerate(engine) for i, h in enumerate(chain_hashes(prompts[p], 2)) if (p, i) not in gone}
    want = 0
    for h in chain_hashes(query, 2):
        if h not in held:
            break
        want += 1
    assert blocks.prefix_blocks(chain_hashes(query, 2)) == want
