"""`kvserve sim` end to end on tiny inputs: JSON shape, plots, trace capacity default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from simulator.runner import AUTOSCALING_KEYS, PACKAGED_PROFILE, ROUTING_KEYS, default_kv_blocks
from simulator.workloads import load_trace
from kvserve.perf_model import EngineProfile
from tests.shared_files import shared_file

def _shared_trace() -> Path:
    return shared_file("traces", "mooncake_synthetic_trace.jsonl")


def _tiny_trace(path: Path) -> Path:
    rows = [
        {"timestamp": 0, "input_length": 1500, "output_length": 5, "hash_ids": [0, 1, 2]},
        {"timestamp": 100, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 3]},
        {"timestamp": 250, "input_length": 600, "output_length": 4, "hash_ids": [7, 8]},
        {"timestamp": 400, "input_length": 2000, "output_length": 2, "hash_ids": [0, 1, 2, 4]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_routing_json_has_the_agreed_keys(tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out.json"
    r = CliRunner().invoke(app, ["sim", "--trace", str(trace), "--replicas", "2", "--policies", "round_robin,kvserve", "--json", str(out)])
    assert r.exit_code == 0, r.output
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"round_robin", "kvserve"}
    for row in data["policies"].values():
        assert set(row) == set(ROUTING_KEYS)
        assert sum(t["requests"] for t in row["tenants"].values()) == 4  # every request, under its tenant
    assert data["sim_wall_s"] > 0 and data["workload"]["requests"] == 4
    # 7 distinct chained blocks / (0.7 x 2 replicas) -> 5 blocks each (the largest request needs 4)
    assert data["workload"]["kv_blocks_per_replica"] == 4
    assert (tmp_path / "out.png").stat().st_size > 0


def test_requests_jsonl_has_every_simulated_request(tmp_path: Path) -> None:
    trace = _tiny_trace(tmp_path / "t.jsonl")
    out = tmp_path / "req.jsonl"
    r = CliRunner().invoke(app, ["sim", "--trace", str(trace), "--replicas", "2", "--policies", "round_robin,kvserve",
                                 "--requests-jsonl", str(out)])
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(row["policy"], row["idx"]) for row in rows] == [("round_robin", i) for i in range(4)] + [("kvserve", i) for i in range(4)]
    from bench.report import REQUEST_FIELDS

    for row in rows:
        assert tuple(row) == REQUEST_FIELDS  # the same records as a live bench run
        assert row["ok"] and row["replica"] is not None
        assert 0 < row["ttft_ms"] <= row["e2e_ms"]
        assert 0 <= row["cached_tokens"] < row["prompt_tokens"]
    rr = [row for row in rows if row["policy"] == "round_robin"]
    assert [row["sent_s"] for row in rr] == [0.0, 0.1, 0.25, 0.4]
    assert [row["prompt_tokens"] for row in rr] == [1500, 1100, 600, 2000]
    assert [row["output_tokens"] for row in rr] == [5, 3, 4, 2]


def test_unknown_policy_is_refused(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["sim", "--trace", str(_tiny_trace(tmp_path / "t.jsonl")), "--policies", "nope"])
    assert r.exit_code != 0


def test_autoscaler_json_has_the_agreed_keys(tmp_path: Path) -> None:
    out = tmp_path / "as.json"
    args = ["sim", "--workload", "step", "--autoscalers", "fixed_max,serve_default", "--policy", "pow2",
            "--rate", "2", "--phase-s", "20", "--max-replicas", "2", "--system-tokens", "64", "--question-tokens", "16",
            "--output-tokens", "8", "--engine-start-s", "1", "--json", str(out), "--per-minute"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "replicas per minute" in r.output and out.with_suffix(".png").exists()
    data = json.loads(out.read_text())
    for name, row in data["autoscalers"].items():
        assert set(row) == set(AUTOSCALING_KEYS)
        assert [m["minute"] for m in data["details"][name]["per_minute"]] == [0]
        assert row["failed_requests"] == 0 and row["replica_seconds"] > 0
        assert all(0.0 <= t["slo_attainment"] <= 1.0 and t["errors"] == 0 for t in row["tenants"].values())
    assert data["autoscalers"]["fixed_max"]["replica_seconds"] >= data["autoscalers"]["fixed_max"]["oracle_replica_seconds"]


def test_shared_trace_default_capacity_is_seventy_percent_fill() -> None:
    wl = load_trace(_shared_trace())
    assert len(wl.requests) == 3993 and wl.distinct_blocks() == 40148  # full blocks only
    kv = default_kv_blocks(wl, 16, EngineProfile.load(PACKAGED_PROFILE))
    assert 0.69 <= wl.distinct_blocks() / (16 * kv) <= 0.70


def test_shared_trace_capacity_at_1000_replicas_is_the_largest_request() -> None:
    """70% fill would give 58 blocks per replica; the largest request needs 374, so the floor applies."""
    wl = load_trace(_shared_trace())
    kv = default_kv_blocks(wl, 1000, EngineProfile.load(PACKAGED_PROFILE))
    assert wl.distinct_blocks() / (0.7 * 1000) < 58
    assert kv == wl.max_request_blocks() == 374
    assert all(r.total_blocks <= kv for r in wl.requests)  # every request can run


def test_trace_requests_carry_full_blocks_only() -> None:
    """The live ingress hashes full blocks only; a partial last block would be a hash no engine stores."""
    wl = load_trace(_shared_trace())
    assert all(len(r.block_hashes) == r.prompt_tokens // wl.block_size for r in wl.requests)
    assert any(r.prompt_tokens % wl.block_size for r in wl.requests)  # there are partial blocks to leave out
