"""Cluster simulator: hand-computed two-replica run, determinism and conservation."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.perf_model import EngineProfile
from simulator.cluster import Cluster
from simulator.engine import EngineSettings, SimRequest, blocks_for
from simulator.workloads import SimWorkload, TenantMix, generated
from router.block_hash import chain_ids
from router.registry import make_policy

def _linear_dict() -> dict:
    # prefill_ms(x) = x ms (linear through the two points); a decode step is 10 ms at any batch.
    return {
        "block_size": 4,
        "kv_cache_tokens": 4096,
        "prefill": [{"prompt_tokens": 100, "ttft_ms": 100.0}, {"prompt_tokens": 200, "ttft_ms": 200.0}],
        "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}, {"context_tokens": 512, "batch": 64, "itl_ms": 10.0}],
    }


LINEAR = EngineProfile.from_dict(_linear_dict())


def mk(idx: int, t: float, ids: list[int], out: int, bs: int = 4) -> SimRequest:
    n_in = bs * len(ids)
    return SimRequest(idx, t, n_in, out, chain_ids(ids), blocks_for(n_in + out, bs))


def test_two_replica_scenario_exact_hits_and_event_order() -> None:
    # Round robin: A -> r0000, B -> r0001, C -> r0000 where A's two blocks are cached.
    wl = SimWorkload("hand", [mk(0, 0.0, [1, 2], 2), mk(1, 1.0, [1, 2, 3], 2), mk(2, 2.0, [1, 2, 4], 2)], 4)
    eng = EngineSettings(block_size=4, kv_blocks=16, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(wl, LINEAR, eng, make_policy("round_robin"), replicas=2, trace_events=True).run()
    got = [(round(t, 6), kind, i, rid) for t, kind, i, rid in res.events]
    assert got == [
        (0.0, "routed", 0, "r0000"),
        (0.008, "first_token", 0, "r0000"),  # 8 uncached tokens -> 8 ms
        (0.018, "finished", 0, "r0000"),  # + one 10 ms decode step
        (1.0, "routed", 1, "r0001"),
        (1.012, "first_token", 1, "r0001"),  # other replica: nothing cached, 12 tokens
        (1.022, "finished", 1, "r0001"),
        (2.0, "routed", 2, "r0000"),
        (2.004, "first_token", 2, "r0000"),  # 2 of 3 blocks cached -> 4 tokens
        (2.014, "finished", 2, "r0000"),
    ]
    assert [r.hit_blocks for r in res.requests] == [0, 0, 2]
    hit_rate = sum(r.hit_blocks for r in res.requests) / sum(len(r.block_hashes) for r in res.requests)
    assert hit_rate == 2 / 8
    assert res.replica_seconds == 2 * 2.014 or abs(res.replica_seconds - 2 * 2.014) < 1e-9


def test_request_arriving_mid_step_joins_the_next_step() -> None:
    # A starts alone (8 ms prefill); B, arriving at the same instant, is admitted into the
    # next step next to A's first decode (8 ms prefill + 10 ms decode), then they share steps.
    wl = SimWorkload("hand", [mk(0, 0.0, [1, 2], 3), mk(1, 0.0, [5, 6], 3)], 4)
    eng = EngineSettings(block_size=4, kv_blocks=16, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(wl, LINEAR, eng, make_policy("round_robin"), replicas=1).run()
    assert [round(r.first_token, 6) for r in res.requests] == [0.008, 0.026]
    assert [round(r.finished, 6) for r in res.requests] == [0.036, 0.046]
    assert [round(x, 6) for x in res.itl.ms] == [18.0, 10.0, 10.0] and res.itl.tokens == [1, 2, 1]


def _run(wl: SimWorkload, policy: str, replicas: int, kv: int, seed: int = 0):  # type: ignore[no-untyped-def]
    eng = EngineSettings(block_size=wl.block_size, kv_blocks=kv, max_num_seqs=4, max_batched_tokens=48)
    return Cluster(wl, LINEAR, eng, make_policy(policy, seed=seed), replicas=replicas, trace_events=True).run()


def test_deterministic_with_seed() -> None:
    mix = TenantMix(tenants=4, system_tokens=32, question_tokens=8, output_tokens=5)
    wl = generated("multi-tenant", mix, 4, rate=50.0, requests=60, seed=3)
    a = _run(wl, "pow2", 3, 64, seed=7)
    b = _run(generated("multi-tenant", mix, 4, rate=50.0, requests=60, seed=3), "pow2", 3, 64, seed=7)
    assert a.events == b.events
    assert [(r.replica, r.first_token, r.finished) for r in a.requests] == [(r.replica, r.first_token, r.finished) for r in b.requests]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.floats(0, 2), st.integers(0, 3), st.integers(1, 6), st.integers(1, 9)), min_size=1, max_size=25
    ),
    replicas=st.integers(1, 4),
    policy=st.sampled_from(["round_robin", "pow2", "kvserve", "approx_tree"]),
    spare=st.integers(0, 20),
)
def test_conservation(rows, replicas, policy, spare) -> None:  # type: ignore[no-untyped-def]
    # tenant prefix (3 blocks) + a unique tail of `n` blocks, `out` output tokens
    reqs = []
    for i, (t, tenant, n, out) in enumerate(sorted(rows)):
        reqs.append(mk(i, t, [1000 + 10 * tenant + k for k in range(3)] + [i * 100 + k for k in range(n)], out))
    wl = SimWorkload("prop", reqs, 4)
    kv = wl.max_request_blocks() + spare
    res = _run(wl, policy, replicas, kv)
    finished = [e for e in res.events if e[1] == "finished"]
    assert sorted(e[2] for e in finished) == list(range(len(reqs)))  # each completes exactly once
    for r in res.requests:
        assert not r.failed and r.finished is not None and r.first_token is not None
        assert r.arrival <= r.admitted <= r.first_token <= r.finished
        # tokens in: a preempted request recomputes what it had, less what is still cached (all of its
        # prompt may still be cached, so only its generated tokens are computed again)
        if r.preemptions:
            assert r.hit_tokens + r.prefilled_tokens >= r.prompt_tokens
        else:
            assert r.hit_tokens + r.prefilled_tokens == r.prompt_tokens
        assert r.generated == r.output_tokens  # tokens out
    # every decode token was produced by exactly one step (a resumed request's recompute makes one more)
    decoded = sum(r.output_tokens - 1 for r in res.requests)
    if any(r.preemptions for r in res.requests):
        assert sum(res.itl.tokens) <= decoded
    else:
        assert sum(res.itl.tokens) == decoded
    assert sum(res.routed.values()) == len(reqs)
    assert res.failed_requests == 0 and res.rejected_requests == 0


def test_a_profiles_host_path_comes_before_the_engine_and_counts_as_ongoing() -> None:
    # Host path 20 ms + 5 ms per stream open on the replica (itself included): A finds none open
    # (25 ms to the engine, then its 8 ms prefill); B, routed at 10 ms while A crosses its host path,
    # finds A open (30 ms: the engine sees it at 40 ms, in A's decode step, which ends A at 43 ms), then
    # prefills in the next step.
    host = EngineProfile.from_dict({**_linear_dict(), "host": {"ms": 20.0, "ms_per_stream": 5.0}})
    wl = SimWorkload("hand", [mk(0, 0.0, [1, 2], 2), mk(1, 0.01, [5, 6], 2)], 4)
    eng = EngineSettings(block_size=4, kv_blocks=16, max_num_seqs=8, max_batched_tokens=64)
    res = Cluster(wl, host, eng, make_policy("round_robin"), replicas=1, trace_events=True).run()
    assert [round(r.first_token, 6) for r in res.requests] == [0.025 + 0.008, 0.043 + 0.008]
    plain = Cluster(wl, LINEAR, eng, make_policy("round_robin"), replicas=1).run()
    assert [round(r.first_token, 6) for r in plain.requests] == [0.008, 0.018 + 0.008]  # B waits out A's decode


def test_requests_on_the_host_path_are_lost_with_their_replica() -> None:
    from simulator.engine import Replica

    eng = EngineSettings(block_size=4, kv_blocks=16, max_num_seqs=8, max_batched_tokens=64)
    rep = Replica("r0", LINEAR, eng, created=0.0)
    a, b = mk(0, 0.0, [1], 1), mk(1, 0.0, [2], 1)
    rep.reserve(a)
    rep.enqueue(b)
    assert rep.ongoing == 2 and list(rep.waiting) == [b]
    rep.enqueue(a)  # across its host path: counted once
    assert (rep.ongoing, rep.routed_total, len(rep.waiting)) == (2, 2, 2)
    c = mk(2, 0.0, [3], 1)
    rep.reserve(c)
    assert set(map(id, rep.kill_all())) == {id(a), id(b), id(c)} and rep.ongoing == 0
