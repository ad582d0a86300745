"""Bench workloads: determinism, exact shared prefixes, skew, trace block mapping, arrivals."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserve.arrivals import parse_load_shape, parse_skew, poisson_arrivals, popularity_weights
from bench.prepare import LoadSpec, apply_load, parse_policies
from bench.fake_tokenizer import FakeTokenizer
from bench.tokens import SafeVocab
from bench.workloads import multi_tenant, trace
from tests.shared_files import shared_file



@pytest.fixture(scope="module")
def vocab() -> SafeVocab:
    return SafeVocab(FakeTokenizer())


def _mt(vocab, **kw):
    args = dict(tenants=4, system_tokens=48, question_tokens=8, output_tokens=5, requests=60, zipf_s=None, seed=3)
    args.update(kw)
    return multi_tenant(vocab, **args)


def test_safe_vocab_skips_unsafe_tokens(vocab):
    assert not set(FakeTokenizer.UNSAFE) & set(vocab.ids)
    assert len(vocab.ids) == 500 - len(FakeTokenizer.UNSAFE)


def test_multi_tenant_is_deterministic_per_seed(vocab):
    a, b, c = _mt(vocab), _mt(vocab), _mt(vocab, seed=4)
    assert a.requests == b.requests
    assert [r.prompt_ids for r in a.requests] != [r.prompt_ids for r in c.requests]


def test_tenants_share_exactly_their_system_prefix(vocab):
    wl = _mt(vocab)
    by_tenant: dict[str, list] = {}
    for r in wl.requests:
        assert r.prompt_tokens == 48 + 8 and r.max_tokens == 5
        assert vocab.tok.encode(r.prompt_text) == list(r.prompt_ids)  # text re-tokenizes exactly
        by_tenant.setdefault(r.tenant, []).append(r)
    systems = {t: rs[0].prompt_ids[:48] for t, rs in by_tenant.items()}
    for t, rs in by_tenant.items():
        assert all(r.prompt_ids[:48] == systems[t] for r in rs)
    assert len(set(systems.values())) == len(systems)  # tenants' system prompts differ
    questions = [r.prompt_ids[48:] for r in wl.requests]
    assert len(set(questions)) == len(questions)  # every question is unique


def test_zipf_skew_orders_tenant_popularity(vocab):
    wl = _mt(vocab, tenants=5, system_tokens=2, question_tokens=4, requests=3000, zipf_s=1.1)
    counts = Counter(r.tenant for r in wl.requests)
    ordered = [counts[f"tenant-{t}"] for t in range(5)]
    assert ordered == sorted(ordered, reverse=True) and len(set(ordered)) == 5
    # tenant 0 expects 1/H(5,1.1) ≈ 0.44 of the traffic
    assert abs(ordered[0] / 3000 - popularity_weights(5, 1.1)[0]) < 0.04


@given(n=st.integers(1, 200), s=st.one_of(st.none(), st.floats(0.1, 3.0)))
def test_popularity_weights_are_a_decreasing_distribution(n, s):
    w = popularity_weights(n, s)
    assert abs(sum(w) - 1) < 1e-9
    assert all(a >= b for a, b in zip(w, w[1:]))
    if s is None:
        assert max(w) - min(w) < 1e-12


def _write_trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trace_blocks_map_deterministically(vocab, tmp_path):
    rows = [
        {"timestamp": 1000, "input_length": 2048, "output_length": 50, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 1500, "input_length": 1536, "output_length": 7, "hash_ids": [0, 1, 9]},
        {"timestamp": 3000, "input_length": 1000, "output_length": 3, "hash_ids": [5, 1]},
    ]
    p = _write_trace(tmp_path / "t.jsonl", rows)
    wl = trace(vocab, p, length_scale=1 / 64, time_scale=0.5, max_output_tokens=20, seed=1)
    again = trace(vocab, p, length_scale=1 / 64, time_scale=0.5, max_output_tokens=20, seed=1)
    other = trace(vocab, p, length_scale=1 / 64, time_scale=0.5, max_output_tokens=20, seed=2)
    assert wl.requests == again.requests and wl.requests != other.requests
    a, b, c = (r.prompt_ids for r in wl.requests)
    assert [len(a), len(b), len(c)] == [32, 24, 16]  # round(input_length / 64); blocks of 8 tokens
    assert a[:16] == b[:16] and a[16:24] != b[16:24]  # shared leading ids [0, 1] -> exactly 2 shared blocks
    assert c[8:16] == a[8:16] and c[:8] != a[:8]  # block 1 has the same tokens at any position
    assert [r.max_tokens for r in wl.requests] == [20, 7, 3]
    assert [r.arrival_s for r in wl.requests] == [0.0, 0.25, 1.0]


def test_trace_truncates_to_context(vocab, tmp_path):
    p = _write_trace(tmp_path / "t.jsonl", [{"timestamp": 0, "input_length": 5120, "output_length": 4, "hash_ids": list(range(10))}])
    wl = trace(vocab, p, length_scale=0.1, max_model_len=40)
    assert wl.requests[0].prompt_tokens == 36 and wl.params["truncated_to_context"] == 1


def test_real_mooncake_trace_prefix_sharing(vocab):
    path = shared_file("traces", "mooncake_synthetic_trace.jsonl")
    wl = trace(vocab, path, length_scale=0.02, max_requests=200, max_model_len=2048, seed=0)
    rows = [json.loads(line) for line, _ in zip(open(path), range(200))]
    bl = wl.params["block_tokens"]
    # Whenever two rows' first block ids agree, their first block of tokens agrees, and vice versa.
    first = {}
    for row, req in zip(rows, wl.requests):
        if len(req.prompt_ids) >= bl:
            first.setdefault(row["hash_ids"][0], set()).add(req.prompt_ids[:bl])
    assert all(len(v) == 1 for v in first.values())
    assert len({next(iter(v)) for v in first.values()}) == len(first)
    assert all(len(r.prompt_ids) + r.max_tokens <= 2048 for r in wl.requests)


def test_poisson_arrivals_deterministic_and_rate():
    a = poisson_arrivals(20.0, seed=1, max_requests=2000)
    assert a == poisson_arrivals(20.0, seed=1, max_requests=2000) != poisson_arrivals(20.0, seed=2, max_requests=2000)
    assert all(x < y for x, y in zip(a, a[1:]))
    assert abs(a[-1] - 100.0) < 10.0  # 2000 arrivals at 20/s take ~100 s (sd ~2.2 s)


def test_step_shape_scales_rate_per_step():
    arr = poisson_arrivals(50.0, seed=0, max_requests=None, shape=[1, 4, 1], step_seconds=10)
    per_step = Counter(int(t // 10) for t in arr)
    assert set(per_step) == {0, 1, 2}
    assert 400 < per_step[0] < 600 and 1800 < per_step[1] < 2200 and 400 < per_step[2] < 600
    capped = poisson_arrivals(50.0, seed=0, max_requests=100, shape=[1, 4, 1], step_seconds=10)
    assert capped == arr[:100]


def test_parsers_reject_bad_specs():
    assert parse_skew("uniform") is None and parse_skew("zipf:1.1") == 1.1
    assert parse_load_shape("step:1,4,1") == [1.0, 4.0, 1.0] and parse_load_shape(None) is None
    assert parse_policies("pow2,ray_prefix,kvserve") == ["pow2", "ray_prefix", "kvserve"]
    assert parse_policies(None) == [None]
    for bad in (lambda: parse_skew("zipf:0"), lambda: parse_skew("pareto"), lambda: parse_load_shape("ramp:1"),
                lambda: parse_policies("pow2,nope"), lambda: parse_policies("pow2,pow2")):
        with pytest.raises(ValueError):
            bad()


def test_apply_load_modes(vocab):
    wl = _mt(vocab, requests=10)
    assert apply_load(wl, LoadSpec(concurrency=2), 0).requests[0].arrival_s is None
    opened = apply_load(wl, LoadSpec(rate=5.0), 0)
    assert all(r.arrival_s is not None for r in opened.requests) and len(opened.requests) == 10
    with pytest.raises(ValueError):
        apply_load(wl, LoadSpec(), 0)
    with pytest.raises(ValueError):
        apply_load(wl, LoadSpec(concurrency=2, rate=1.0), 0)


def _model_prepared() -> bool:
    from kvserve.model import is_prepared

    return is_prepared("smollm2-135m-instruct")


# `make test` prepares the model first, so this runs there; a bare `pytest tests/unit` may skip it.
@pytest.mark.skipif(not _model_prepared(), reason="needs the prepared default model (`kvserve model prepare`)")
def test_real_tokenizer_roundtrips():
    from kvserve.config import ModelConfig

    from bench.prepare import load_tokenizer

    v = SafeVocab(load_tokenizer(ModelConfig()))
    wl = multi_tenant(v, tenants=2, system_tokens=1000, question_tokens=30, output_tokens=4, requests=4, seed=0)
    assert all(r.prompt_tokens == 1030 for r in wl.requests)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tenants=st.integers(1, 6))
def test_same_tenant_same_prefix_property(vocab, seed, tenants):
    wl = multi_tenant(vocab, tenants=tenants, system_tokens=16, question_tokens=4, output_tokens=1,
                      requests=20, seed=seed)
    prefix = {}
    for r in wl.requests:
        assert prefix.setdefault(r.tenant, r.prompt_ids[:16]) == r.prompt_ids[:16]
