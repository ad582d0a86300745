"""vLLM V1's allocation in the simulated replica: blocks per scheduled token, recompute preemption of the
latest admitted request, resumed requests first in the queue, and decode stretches cut where it matters."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.perf_model import EngineProfile
from simulator.engine import EngineSettings, Replica, SimRequest, blocks_for

# prefill_ms(x) = x ms; a decode step is 10 ms at any batch.
PROF = EngineProfile.from_dict({
    "block_size": 4, "kv_cache_tokens": 4096,
    "prefill": [{"prompt_tokens": 1, "ttft_ms": 1.0}, {"prompt_tokens": 1000, "ttft_ms": 1000.0}],
    "decode": [{"context_tokens": 512, "batch": 1, "itl_ms": 10.0}, {"context_tokens": 512, "batch": 64, "itl_ms": 10.0}],
})


def rq(idx: int, hashes: list[int], out: int, t: float = 0.0, extra_tokens: int = 0) -> SimRequest:
    prompt = 4 * len(hashes) + extra_tokens
    return SimRequest(idx, t, prompt, out, hashes, blocks_for(prompt + out, 4))


def drive(rep: Replica, reqs: list[SimRequest], *, single_steps: bool = False,
          check: Callable[[Replica], None] | None = None) -> list[int]:
    """Run the replica over `reqs` as the cluster does (arrivals cut decode stretches short); with
    `single_steps` every step is cut to one token. Returns the requests of each prefill chunk, in order."""
    pending = sorted(reqs, key=lambda r: (r.arrival, r.idx))
    i, now, end, prefills = 0, 0.0, None, []

    def plan(t: float) -> float | None:
        e = rep.plan_step(t)
        if e is not None and single_steps:
            e = rep.cut_segment(t) or e
        if e is not None:
            prefills.extend(r.idx for r, _, prefill in rep.seg_chunks if prefill)
        return e

    while True:
        if end is None:
            if i == len(pending):
                break
            now = max(now, pending[i].arrival)
            while i < len(pending) and pending[i].arrival <= now:
                rep.enqueue(pending[i])
                i += 1
            end = plan(now)
        elif i < len(pending) and pending[i].arrival < end:
            now = pending[i].arrival
            rep.enqueue(pending[i])
            i += 1
            end = rep.cut_segment(now) or end
        else:
            now = end
            rep.end_step(now)
            if check is not None:
                check(rep)
            end = plan(now) if rep.has_work() else None
    return prefills


def test_preempted_request_resumes_on_its_own_cached_blocks() -> None:
    """6 blocks of 4 tokens, two 8-token prompts with 9 output tokens each. Both run (2 blocks each, then a
    third at token 9); at 13 tokens A needs a fourth block and none is free: B, admitted last, is preempted.
    A finishes; B comes back, hits its own two prompt blocks, recomputes only the 5 tokens it had
    generated, and its first token and hit count stay those of its first admission."""
    rep = Replica("r", PROF, EngineSettings(4, 6, 8, 64), 0.0)
    a, b = rq(0, [1, 2], 9), rq(1, [3, 4], 9)
    drive(rep, [a, b])
    assert (a.preemptions, b.preemptions) == (0, 1)
    assert a.first_token == b.first_token == pytest.approx(0.016)  # 16 prompt tokens in one step
    assert a.finished == pytest.approx(0.096)  # 8 decode steps, one cut short by the preemption
    assert b.prefilled_tokens == 8 + 5  # its prompt, then only the 5 generated tokens again
    assert b.finished == pytest.approx(0.096 + 0.005 + 0.030)  # 5-token recompute, 3 decode steps
    assert (a.hit_blocks, b.hit_blocks) == (0, 0)  # the resume's hit is not a prefix-cache hit
    assert rep.kv.used == 0 and rep.kv.cached_prefix([3, 4]) == 2


def test_resumed_requests_keep_their_order_ahead_of_newer_ones() -> None:
    """9 blocks, three requests of 17 output tokens, D arriving at 50 ms. C is preempted first, then B
    (preempting itself: it is last in the running list), so the queue reads B, C, D: they resume in that
    order, and D is admitted only after both."""
    rep = Replica("r", PROF, EngineSettings(4, 9, 8, 64), 0.0)
    reqs = [rq(0, [1, 2], 17), rq(1, [3, 4], 17), rq(2, [5, 6], 17), rq(3, [7, 8], 2, t=0.05)]
    prefills = drive(rep, reqs)
    assert [r.preemptions for r in reqs] == [0, 1, 2, 0]
    assert prefills == [0, 1, 2, 1, 2, 2, 3]  # first admissions, B and C back, C again, then D
    assert all(r.finished is not None and r.generated == r.output_tokens for r in reqs)


def _workload(rows: list[tuple[int, int, int, int, int]]) -> list[SimRequest]:
    # (arrival ms, tenant, unique blocks, output tokens, extra prompt tokens): tenant prefix of 2 blocks.
    # Each arrival gets its own fraction of a millisecond, so none ties with a step's end (this profile's
    # steps are whole milliseconds from some arrival): a stretch and single steps may order those two
    # simultaneous events differently.
    return [rq(i, [100 + 10 * tenant, 101 + 10 * tenant] + [1000 * (i + 1) + k for k in range(n)], out,
               (t + (0.618034 * (i + 1)) % 1.0) / 1000.0, extra) for i, (t, tenant, n, out, extra) in enumerate(rows)]


ROWS = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 2), st.integers(0, 4), st.integers(1, 30),
                          st.integers(0, 3)), min_size=1, max_size=12)


def _pool_accounts(rep: Replica) -> None:
    """Each block is one of: free (unhashed or queued), cached and held, or a running request's private block."""
    kv = rep.kv
    private = sum(h is None for r in rep.batch for h in r.refs)
    assert kv.unhashed + len(kv.free) + len(kv.refc) + private == kv.capacity
    assert kv.refc == {h: sum(h in r.refs for r in rep.batch) for h in kv.refc}
    assert all(len(r.refs) == blocks_for(r.computed, 4) for r in rep.batch)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, spare=st.integers(0, 6), seqs=st.integers(1, 6), budget=st.integers(8, 48))
def test_no_block_leaks_under_preemption(rows, spare, seqs, budget) -> None:  # type: ignore[no-untyped-def]
    reqs = _workload(rows)
    rep = Replica("r", PROF, EngineSettings(4, max(r.total_blocks for r in reqs) + spare, seqs, budget), 0.0)
    drive(rep, reqs, check=_pool_accounts)
    assert all(r.generated == r.output_tokens and r.finished is not None for r in reqs)
    kv = rep.kv
    assert kv.used == 0 and not kv.refc and rep.ongoing == 0 and rep.queued_prefill_tokens == 0
    # every block is free: unhashed, or queued, findable by its hash when it holds a cached prompt block
    assert kv.free_blocks() == kv.capacity
    cached = {k for k in kv.free if isinstance(k, int)}
    assert all(kv.is_cached(h) == (h in cached) for r in reqs for h in r.block_hashes)


@settings(max_examples=200, deadline=None)
@given(rows=ROWS, spare=st.integers(0, 6), seqs=st.integers(1, 6), budget=st.integers(8, 48))
def test_decode_stretches_match_one_step_at_a_time(rows, spare, seqs, budget) -> None:  # type: ignore[no-untyped-def]
    runs = []
    for single in (False, True):
        reqs = _workload(rows)
        rep = Replica("r", PROF, EngineSettings(4, max(r.total_blocks for r in reqs) + spare, seqs, budget), 0.0)
        drive(rep, reqs, single_steps=single)
        runs.append([(r.first_token, r.finished, r.preemptions, r.prefilled_tokens) for r in reqs])
    for jumped, stepped in zip(*runs):
        assert jumped[2:] == stepped[2:]
        assert jumped[:2] == pytest.approx(stepped[:2], rel=1e-9, abs=1e-12)
