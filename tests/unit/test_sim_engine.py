"""KV cache of one simulated replica: prefix hits, pinning, tail-first LRU eviction."""

from __future__ import annotations

from kvserve.sim.engine import KVCache, SimRequest


def req(idx: int, hashes: list[int], total: int | None = None) -> SimRequest:
    return SimRequest(idx, 0.0, 4 * len(hashes), 1, hashes, total if total is not None else len(hashes))


def finish(kv: KVCache, r: SimRequest) -> None:
    kv.register(r, len(r.block_hashes))
    kv.release(r)


def test_eviction_frees_capacity_tail_first() -> None:
    kv = KVCache(4)
    a = req(0, [1, 2])
    assert kv.try_admit(a) and kv.used == 2
    finish(kv, a)
    assert kv.used == 0 and list(kv.lru) == [2, 1]  # tail block is the first to go
    kv.take_events()
    b = req(1, [3, 4, 5])
    assert kv.try_admit(b)
    assert kv.used == 3 and list(kv.lru) == [1]
    assert kv.take_events() == ([], [2])
    assert kv.cached_prefix([1, 2]) == 1


def test_pinned_blocks_are_never_evicted_and_full_cache_makes_requests_wait() -> None:
    kv = KVCache(4)
    a = req(0, [1, 2, 3])
    assert kv.try_admit(a)
    kv.register(a, 3)  # computed and cached, still running: pinned
    b = req(1, [7, 8])
    assert not kv.try_admit(b)  # 3 pinned + 2 new > 4: waits, nothing evicted
    assert kv.cached_prefix([1, 2, 3]) == 3 and kv.used == 3
    kv.release(a)
    assert kv.try_admit(b)  # the LRU makes room now
    assert kv.used == 2 and len(kv.lru) == 2


def test_shared_prefix_is_pinned_once_and_hits_count() -> None:
    kv = KVCache(10)
    a = req(0, [1, 2, 3])
    assert kv.try_admit(a)
    kv.register(a, 3)
    b = req(1, [1, 2, 9])
    assert kv.try_admit(b) and b.hit_blocks == 2
    assert kv.used == 4  # 3 of a + 1 new of b; the shared two are counted once
    finish(kv, b)
    assert kv.used == 3 and list(kv.lru) == [9]
    kv.release(a)
    assert kv.used == 0 and set(kv.lru) == {1, 2, 3, 9} and not kv.refc


def test_concurrent_duplicate_block_stays_private() -> None:
    kv = KVCache(10)
    a, b = req(0, [1, 2]), req(1, [1, 2])
    assert kv.try_admit(a) and kv.try_admit(b) and b.hit_blocks == 0
    kv.register(a, 2)
    kv.register(b, 2)  # computed twice at once: b's copy is not the cached one
    assert b.refs == [] and kv.used == 4
    kv.release(b)
    kv.release(a)
    assert kv.used == 0 and list(kv.lru) == [2, 1]
