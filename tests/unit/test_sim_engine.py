"""One simulated replica's scheduler: chunked prefill cap, engines sharing a device."""

from __future__ import annotations

import pytest

from simulator.engine import SimRequest


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
