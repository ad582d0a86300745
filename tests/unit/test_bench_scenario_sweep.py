"""`kvserve bench --sweep scenario`: the deploy plan, each workload's shape, the row metrics (TPOT from
first token to last, the chats' gaps only), who wins, the preset-in-charge config, and a run against
the fake server with a recording deploy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.client import RequestResult
from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
from bench.fake_tokenizer import FakeTokenizer
from bench.runner import ReplayOptions
from bench.scenario_config import scenario_config
from bench.scenario_sweep import (SHORT_TOKENS, WORKLOADS, build_requests, plan, run_scenario_sweep, summarize_run,
                                  verdicts)
from bench.tokens import SafeVocab
from kvserve.config import KVServeConfig
from kvserve.scenarios import SCENARIOS


def test_plan_deploys_each_preset_once_and_runs_every_workload_under_owner_and_contrast():
    p = plan()
    assert [preset for preset, _ in p] == list(SCENARIOS)  # every preset once
    runs = {(preset, name) for preset, names in p for name in names}
    for w in WORKLOADS:
        assert w.owner != w.contrast
        assert (w.owner, w.name) in runs and (w.contrast, w.name) in runs
    assert len(runs) == 2 * len(WORKLOADS)


def test_workload_shapes():
    vocab = SafeVocab(FakeTokenizer())
    edge = build_requests("edge", vocab, 0)
    for r in edge:  # a passage repeated: the output can copy it
        period = r.prompt_ids[:48]
        assert r.prompt_ids == period * 4 and r.max_tokens == 64
    long = build_requests("long-document", vocab, 0)
    docs = [r for r in long if r.prompt_tokens > SHORT_TOKENS]
    assert len(docs) == 5 and all(r.prompt_tokens == 1800 for r in docs)
    assert all(r.prompt_tokens <= SHORT_TOKENS for r in long if r not in docs)
    chat = build_requests("chat", vocab, 0)
    assert sorted(r.prompt_tokens for r in chat if r.prompt_tokens > SHORT_TOKENS) == [600] * 5  # the pastes
    assert len(build_requests("offline-batch", vocab, 0)) == 128
    assert build_requests("chat", vocab, 1) != build_requests("chat", vocab, 2)  # seeded
    with pytest.raises(ValueError, match="unknown"):
        build_requests("nope", vocab, 0)


def _res(idx, start, ttft, e2e, n, gaps=()):
    return RequestResult(idx=idx, start=start, ok=True, status=200, ttft_s=ttft, e2e_s=e2e, elapsed_s=e2e,
                         itl_s=list(gaps), output_tokens=n)


def test_summarize_run_tpot_and_chats_gaps():
    results = [_res(0, 0.0, 0.5, 1.5, 11, [0.1] * 10),  # TPOT (1.5-0.5)/10 = 100 ms
               _res(1, 1.0, 0.2, 3.2, 4, [2.0, 0.5, 0.5]),  # a document: its gaps are not the chats'
               RequestResult(idx=2, start=0.5, ok=False, status=503, elapsed_s=0.1)]
    row = summarize_run(results, {0: 100, 1: 2000, 2: 100})
    assert row["requests"] == 3 and row["errors"] == 1
    assert row["tpot_p50_ms"] == pytest.approx((100 + 1000) / 2)
    assert row["short_gap_max_ms"] == pytest.approx(100)
    assert row["output_tok_per_s"] == pytest.approx(15 / 4.2)  # first send to last answer


@given(st.floats(1, 1000), st.floats(1, 1000), st.booleans())
def test_verdict_owner_wins_exactly_when_its_metric_is_better(a, b, higher):
    w = WORKLOADS[0].__class__("w", "x", "y", "m", higher, 1, "why")
    rows = [{"workload": "w", "preset": "x", "m": a, "errors": 0}, {"workload": "w", "preset": "y", "m": b, "errors": 0}]
    v = verdicts(rows, [w])[0]
    assert v["owner_wins"] == ((a > b) if higher else (a < b))
    assert v["owner_advantage"] == pytest.approx(a / b if higher else b / a)


def test_verdict_missing_or_failed_rows_do_not_win():
    w = WORKLOADS[1]
    assert verdicts([], [w])[0]["owner_wins"] is False
    rows = [{"workload": w.name, "preset": w.owner, w.metric: 99.0, "errors": 3},
            {"workload": w.name, "preset": w.contrast, w.metric: 1.0, "errors": 0}]
    assert verdicts(rows, [w])[0]["owner_wins"] is False  # an owner with errors does not win


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_config_puts_the_preset_in_charge(scenario):
    # A running cluster's config carries resolved values; the preset must still decide its fields.
    base = KVServeConfig.model_validate({"engine": {"max_num_seqs": 3, "speculative_decoding": "ngram"},
                                         "num_replicas": 2, "server": {"port": 8123}})
    cfg = scenario_config(base, scenario)
    want = KVServeConfig.model_validate({"engine": {"scenario": scenario}})
    assert cfg.engine.scenario == scenario
    assert cfg.engine.max_num_seqs == want.engine.max_num_seqs
    assert cfg.engine.speculative_decoding == want.engine.speculative_decoding
    assert cfg.num_replicas == 2 and cfg.server.port == 8123  # what no preset sets is kept


def test_sweep_against_fake_server_deploys_each_preset_and_writes_every_row():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.005, itl_s=0.0005))
    deployed = []
    small = [w.__class__(w.name, w.owner, w.contrast, w.metric, w.higher_is_better, min(w.concurrency, 8), w.why)
             for w in WORKLOADS]
    with ServerThread(server.app) as t:
        rows = run_scenario_sweep(ReplayOptions(base_url=t.url, model="m"), SafeVocab(FakeTokenizer()),
                                  deployed.append, seed=0, workloads=small)
    assert deployed == list(SCENARIOS)
    assert len(rows) == 2 * len(WORKLOADS) and all(r["errors"] == 0 for r in rows)
    assert {r["role"] for r in rows} == {"owner", "contrast"}
    assert all(r["output_tok_per_s"] > 0 and r["tpot_p50_ms"] is not None for r in rows)


def test_scenario_cli_deploys_each_preset_restores_the_cluster_and_writes_verdicts(tmp_path, monkeypatch):
    import json

    from rich.console import Console

    import bench.prepare
    import bench.runner
    from bench.scenario_cli import run_scenario

    deployed: list[KVServeConfig] = []
    monkeypatch.setattr(bench.runner, "default_deploy", lambda address, cold_engines=False: deployed.append)
    monkeypatch.setattr(bench.prepare, "load_tokenizer", lambda model, tok=None: FakeTokenizer())
    base = KVServeConfig.model_validate({"num_replicas": 1})
    server = FakeKVServe(FakeBehaviour(first_token_s=0.002, itl_s=0.0002, replicas=["r0"]))
    out = tmp_path / "s.json"
    with ServerThread(server.app) as t:
        run_scenario(base, address="auto", url=t.url, api_key=None, tokenizer=None, seed=0, json_out=out,
                     timeout=30, connect_timeout=5, console=Console(file=open(tmp_path / "log", "w")))
    assert [c.engine.scenario for c in deployed] == [*SCENARIOS, None]  # then the cluster's own config again
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 2 * len(WORKLOADS)
    assert [v["workload"] for v in doc["params"]["verdicts"]] == [w.name for w in WORKLOADS]
