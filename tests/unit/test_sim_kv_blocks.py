"""KV block pool of one simulated replica: prefix hits, pinning, free-queue eviction order."""

from __future__ import annotations

from simulator.kv_blocks import KVCache


class Req:
    def __init__(self, hashes: list[int]) -> None:
        self.block_hashes, self.refs, self.registered = hashes, [], 0


def run(kv: KVCache, hashes: list[int], extra: int = 0) -> Req:
    """Admit with whatever is cached, compute the rest (+ `extra` private blocks), cache it; still holding."""
    r = Req(hashes)
    hits = kv.cached_prefix(hashes)
    assert kv.admit(r, hits, len(hashes) - hits + extra)
    kv.cache_full(r, len(hashes))
    return r


def test_tail_is_evicted_first_and_evictions_are_reported() -> None:
    kv = KVCache(4)
    kv.release(run(kv, [1, 2]))
    assert kv.used == 0 and list(kv.free) == [2, 1]  # freed tail first: the tail goes first
    kv.take_events()
    b = run(kv, [3, 4, 5])  # 2 never-used blocks, then evicts block 2
    assert kv.used == 3 and list(kv.free) == [1]
    assert kv.take_events() == ([3, 4, 5], [2])
    assert kv.cached_prefix([1, 2]) == 1 and b.refs == [3, 4, 5]


def test_held_blocks_are_never_evicted_and_a_request_that_does_not_fit_is_refused() -> None:
    kv = KVCache(4)
    a = run(kv, [1, 2, 3])
    b = Req([7, 8])
    assert not kv.admit(b, 0, 2)  # 3 held + 2 new > 4: refused, nothing changed
    assert b.refs == [] and kv.used == 3 and kv.cached_prefix([1, 2, 3]) == 3
    kv.release(a)
    assert kv.admit(b, 0, 2)  # the free queue makes room now
    assert kv.used == 2 and kv.free_blocks() == 2


def test_a_hit_on_a_free_block_takes_it_out_of_the_queue_and_counts_against_room() -> None:
    kv = KVCache(4)
    kv.release(run(kv, [1, 2, 3]))
    kv.take_events()
    c = Req([1, 2, 9])
    assert not kv.admit(c, 2, 3)  # 2 hit blocks leave the queue + 3 new = 5 > 4 free
    assert kv.admit(c, 2, 2)  # the never-used block, then block 3 (the hits are out of the queue)
    assert c.refs == [1, 2, None, None] and not kv.free and kv.refc == {1: 1, 2: 1}
    assert kv.take_events() == ([], [3])


def test_shared_prefix_is_held_once() -> None:
    kv = KVCache(10)
    a = run(kv, [1, 2, 3])
    b = run(kv, [1, 2, 9])
    assert kv.used == 4 and kv.refc == {1: 2, 2: 2, 3: 1, 9: 1}
    kv.release(b)
    assert kv.used == 3 and list(kv.free) == [9]
    kv.release(a)
    assert kv.used == 0 and list(kv.free) == [9, 3, 2, 1] and not kv.refc


def test_concurrent_duplicate_stays_private() -> None:
    kv = KVCache(10)
    a, b = Req([1, 2]), Req([1, 2])
    assert kv.admit(a, 0, 2) and kv.admit(b, 0, 2)
    kv.cache_full(a, 2)
    kv.cache_full(b, 2)  # computed twice at once: b's copy is not the cached one
    assert b.refs == [None, None] and kv.used == 4
    kv.release(b)
    kv.release(a)
    assert kv.used == 0 and [k for k in kv.free if isinstance(k, int)] == [2, 1]


def test_a_partial_last_block_is_reused_before_any_cached_block() -> None:
    kv = KVCache(3)
    a = run(kv, [1, 2], extra=1)  # two cached prompt blocks and a partly filled output block
    kv.release(a, partial_last=True)
    assert kv.unhashed == 1 and list(kv.free) == [2, 1]
    kv.take_events()
    run(kv, [5])  # takes the partial block: nothing evicted
    assert kv.take_events() == ([5], []) and kv.cached_prefix([1, 2]) == 2
