"""`kvserve bench --sweep batch` against the fake server: one row per batch size with the table's keys,
every request sent, and the plot and JSON written."""

from __future__ import annotations

import json

import pytest

from bench.batch_sweep import ROW_KEYS, parse_batches, plot_batch_sweep, run_batch_sweep, write_sweep
from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
from bench.fake_tokenizer import FakeTokenizer
from bench.runner import ReplayOptions
from bench.tokens import SafeVocab


def test_sweep_rows_and_files(tmp_path):
    server = FakeKVServe(FakeBehaviour(first_token_s=0.02, itl_s=0.002))
    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=1)
        rows = run_batch_sweep(opts, SafeVocab(FakeTokenizer()), [1, 4], question_tokens=8, output_tokens=5, seed=0)
    assert [r["batch"] for r in rows] == [1, 4]
    for r in rows:
        assert set(ROW_KEYS) <= set(r) and r["errors"] == 0 and r["requests"] == max(8, 4 * r["batch"])
        assert r["ttft_p50_ms"] >= 20 and r["itl_p50_ms"] > 0 and r["e2e_p50_ms"] > r["ttft_p50_ms"]
    assert all(r["output_tok_per_s"] > 0 for r in rows)
    # Every point's requests plus one excluded warm-up batch reached the server.
    assert sum(c["num_requests"] for c in server.counters.values()) == (8 + 1) + (16 + 4)
    write_sweep(tmp_path / "s.json", rows, {"sweep": "batch"})
    assert json.loads((tmp_path / "s.json").read_text())["rows"] == rows
    plot_batch_sweep(rows, tmp_path / "s.png", "t")
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("bad", ["", "0,4", "a,b"])
def test_bad_batch_lists(bad):
    with pytest.raises(ValueError, match="--batch"):
        parse_batches(bad)
