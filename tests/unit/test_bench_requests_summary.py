"""Per-request summaries: cold/hit split, share and placement, against hand-computed values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.requests_summary import is_cold, read_rows, summarize_rows


def _row(idx, tenant, replica, ttft, cached, prompt=1000, sent=0.0, ok=True, policy="kvserve"):
    return {"policy": policy, "idx": idx, "tenant": tenant, "replica": replica, "sent_s": sent, "ttft_ms": ttft,
            "e2e_ms": None if ttft is None else ttft + 100.0, "prompt_tokens": prompt, "cached_tokens": cached,
            "output_tokens": 2, "ok": ok, "error": None if ok else "http_503"}


def test_cold_is_less_than_half_the_prompt_cached():
    assert is_cold(_row(0, "t", "a", 1.0, 499)) and not is_cold(_row(0, "t", "a", 1.0, 500))
    assert not is_cold(_row(0, "t", "a", 1.0, None))  # unknown: not counted as cold


def test_summary_hand_computed(tmp_path: Path):
    rows = [
        _row(0, "t0", "a", 3000.0, 0, sent=0.0),  # cold
        _row(1, "t0", "a", 100.0, 992, sent=1.0),
        _row(2, "t1", "b", 200.0, 960, sent=2.0),
        _row(3, "t0", "b", 300.0, 960, sent=3.0),  # t0 now on two replicas
        _row(4, "t1", "a", None, None, ok=False),  # failed: left out
    ]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows + [_row(0, "t0", "a", 5.0, 0, policy="pow2")]))
    by = read_rows(path)
    assert list(by) == ["kvserve", "pow2"] and len(by["kvserve"]) == 5
    s = summarize_rows(by["kvserve"])
    assert s["requests"] == 4 and s["cold"] == 1
    assert s["cold_ttft_p50_ms"] == 3000.0
    assert s["hit_ttft_p50_ms"] == 200.0 and s["hit_ttft_p90_ms"] == pytest.approx(280.0)
    assert s["ttft_p50_ms"] == 250.0
    assert s["share_max_over_mean"] == 1.0  # 2 and 2
    assert s["tenants_on_several_replicas"] == 1
    assert s["duration_s"] == pytest.approx(3.4)
