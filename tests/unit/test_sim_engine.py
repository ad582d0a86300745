"""KV cache of one simulated replica: prefix hits, pinning, tail-first LRU eviction."""

from __future__ import annotations

import pytest

from simulator.engine import KVCache, SimRequest


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


def _replica(cap: int):
    from kvserve.perf_model import EngineProfile
    from simulator.engine import EngineSettings, Replica

    linear = EngineProfile.from_dict({
        "block_size": 4, "kv_cache_tokens": 4096,
        "prefill": [{"prompt_tokens": 1, "ttft_ms": 1.0}, {"prompt_tokens": 1000, "ttft_ms": 1000.0}],
        "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}, {"context_tokens": 512, "batch": 64, "itl_ms": 10.0}],
    })
    return Replica("r", linear, EngineSettings(4, 1024, 8, 1000, long_prefill_tokens=cap), created=0.0)


def _run(rep, reqs) -> None:
    now = 0.0
    for r in reqs:
        rep.enqueue(r)
    while rep.has_work():
        now = rep.plan_step(now)
        rep.end_step(now)


def test_long_prefill_cap_lets_a_short_prompt_past_a_long_one() -> None:
    """vLLM's long_prefill_token_threshold: with another request scheduled, a long prompt prefills
    at most `cap` tokens a step, so a short prompt admitted with it gets its first token after one short
    step instead of after the long prompt's whole prefill."""
    for cap, short_ttft, long_ttft in ((0, 840, 840), (200, 240, 840)):
        rep = _replica(cap)
        long, short = SimRequest(0, 0.0, 800, 1, [], 200), SimRequest(1, 0.0, 40, 1, [], 10)
        _run(rep, [long, short])
        assert (round(short.first_token * 1000), round(long.first_token * 1000)) == (short_ttft, long_ttft), cap


def test_long_prefill_cap_does_not_apply_to_a_request_alone() -> None:
    rep = _replica(200)
    alone = SimRequest(0, 0.0, 800, 1, [], 200)
    _run(rep, [alone])
    assert round(alone.first_token * 1000) == 800  # one step: nobody to let through


def _gpu_replicas(n: int, engines_per_device: int):
    from kvserve.perf_model import EngineProfile
    from simulator.engine import Device, EngineSettings, Replica

    prof = EngineProfile(16, 10_000, [1.0, 1000.0], [1.0, 100.0], {512: ([1.0, 64.0], [10.0, 10.0])})
    settings = EngineSettings(16, 100, 8, 2048, engines_per_device=engines_per_device)
    device = Device()
    return [Replica(f"r{i}", prof, settings, 0.0, device) for i in range(n)]


def test_engines_sharing_a_device_take_turns() -> None:
    """The profile is one engine alone on its device; two busy at once each step at half speed."""
    a, b = _gpu_replicas(2, 2)
    for i, rep in enumerate((a, b)):
        rep.enqueue(SimRequest(i, 0.0, 1000, 4, [], 0))
    alone = a.plan_step(0.0)
    shared = b.plan_step(0.0)
    assert alone is not None and shared is not None and shared == 2 * alone
    a.end_step(alone)
    b.end_step(shared)
    assert a.device.busy == 0
    # b idle: a's three remaining decode steps run at the profile's 10 ms each
    assert a.plan_step(1.0) == pytest.approx(1.0 + 3 * 0.010)
