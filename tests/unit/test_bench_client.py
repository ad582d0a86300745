"""The bench client, runner and CLI against an in-process fake OpenAI streaming server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from typer.testing import CliRunner

from bench.client import completion_body, is_loopback_url, stream_request
from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
from bench.fake_tokenizer import FakeTokenizer
from bench.report import JSON_KEYS
from bench.runner import ReplayOptions, replay, run_policies
from bench.tokens import SafeVocab
from bench.workloads import BenchRequest, multi_tenant
from kvserve.config import KVServeConfig, dump_config

FIRST_S, ITL_S = 0.15, 0.04


def _cli_app():
    """A typer group holding only `bench`, as cli.app builds it (group even if no other room is present)."""
    import typer

    from cli.bench import register

    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        pass

    register(app)
    return app


@pytest.fixture()
def fake():
    server = FakeKVServe(FakeBehaviour(first_token_s=FIRST_S, itl_s=ITL_S, fail_status={1: 429, 2: 503, 3: 400, 4: 500},
                                       config=dump_config(KVServeConfig())))
    with ServerThread(server.app) as thread:
        yield server, thread.url


def _req(idx=0, max_tokens=5, text=" hello world"):
    return BenchRequest(idx, (1, 2), text, max_tokens, tenant="tenant-0")


async def _one(url, req, **kw):
    async with httpx.AsyncClient() as client:
        return await stream_request(client, f"{url}/v1/completions", completion_body(req, "m"), idx=req.idx, **kw)


def test_stream_measures_ttft_itl_usage_and_replica(fake):
    server, url = fake
    res = asyncio.run(_one(url, _req(max_tokens=5)))
    assert res.ok and res.status == 200 and res.error is None
    assert FIRST_S <= res.ttft_s < FIRST_S + 0.5
    # Chunks may reach us bunched under load, but the last cannot arrive before the server sent it.
    assert len(res.itl_s) == 4 and res.ttft_s + sum(res.itl_s) >= FIRST_S + 4 * ITL_S
    assert sum(res.itl_s) < 4 * ITL_S + 1.0
    assert res.e2e_s >= res.ttft_s + sum(res.itl_s) - 1e-6
    assert (res.output_tokens, res.prompt_tokens, res.cached_tokens) == (5, 2, 1)
    assert res.replica == "replica-a"
    body = server.bodies[0]
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["max_tokens"] == 5


def test_errors_are_counted_by_kind(fake):
    _, url = fake
    kinds = [asyncio.run(_one(url, _req(i))) for i in range(5)]
    assert [r.ok for r in kinds] == [True, False, False, False, False]
    assert [r.error for r in kinds[1:]] == ["http_429", "http_503", "http_4xx", "http_5xx"]
    assert [r.status for r in kinds[1:]] == [429, 503, 400, 500]
    assert kinds[1].replica == "replica-b"  # the header is read on errors too


def test_timeout_and_connection_errors():
    server = FakeKVServe(FakeBehaviour(first_token_s=2.0))
    with ServerThread(server.app) as t:
        res = asyncio.run(_one(t.url, _req(), timeout_s=0.3))
        assert res.error == "timeout" and not res.ok and res.elapsed_s < 1.5
        dead = t.url
    res = asyncio.run(_one(dead, _req(), timeout_s=2))
    assert res.error == "connect"
    assert res.error_detail and res.error_detail.startswith("ConnectError")  # the socket's own words follow


def test_loop_lag_sees_a_blocked_event_loop():
    """A loop held 300 ms by synchronous work (or by a CPU it waits for) is measured as late."""
    import time

    from bench.loop_lag import LoopLag

    async def scenario() -> tuple[float | None, float | None]:
        lag = LoopLag(interval_s=0.02)
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.1)
        time.sleep(0.3)  # blocks the loop: the monitor's wake-up is due but cannot run
        await asyncio.sleep(0.1)
        lag.stop()
        await task
        return lag.summary()

    p99, worst = asyncio.run(scenario())
    assert worst is not None and 250.0 <= worst < 1000.0
    assert p99 is not None and p99 <= worst
    assert LoopLag().summary() == (None, None)


def test_api_key_is_sent():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0, api_key="s3cret"))
    with ServerThread(server.app) as t:
        assert asyncio.run(_one(t.url, _req())).status == 401
        assert asyncio.run(_one(t.url, _req(), headers={"Authorization": "Bearer s3cret"})).ok


def test_loopback_guard():
    assert is_loopback_url("http://127.0.0.1:8000") and is_loopback_url("http://localhost:1")
    assert is_loopback_url("http://[::1]:8000")
    assert not is_loopback_url("http://10.0.0.5:8000") and not is_loopback_url("http://example.com")


def _workload(n=12):
    return multi_tenant(SafeVocab(FakeTokenizer()), tenants=3, system_tokens=32, question_tokens=4,
                        output_tokens=3, requests=n, seed=0)


def test_replay_closed_loop_reads_engine_counters():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.02, itl_s=0.005, cached_fraction=0.75, fail_status={5: 503}))
    wl = _workload()
    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=4, timeout_s=30, sample_stats=True)
        warm = _workload(2).requests
        run = asyncio.run(replay(opts, wl.requests, policy="pow2", warmup=warm))
    m = run.metrics
    assert len(server.bodies) == 12 + 2  # warm-up sent but excluded from the stats
    assert (m.requests, m.ok, m.errors, m.errors_by_kind) == (12, 11, 1, {"http_503": 1})
    # prompt 36 words, 27 cached: the engines' counters, after - before (warm-up excluded)
    assert m.prefix_hit_rate == pytest.approx(27 / 36)
    assert sum(m.replica_requests.values()) == 11 and m.share_max_over_mean >= 1.0
    assert [r.idx for r in run.results] == list(range(12))
    assert run.timeline and run.timeline[0].replicas == 2


def test_replay_open_loop_respects_arrivals():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0))
    wl = _workload(4).with_arrivals([0.0, 0.1, 0.2, 0.6])
    with ServerThread(server.app) as t:
        run = asyncio.run(replay(ReplayOptions(base_url=t.url, model="m", timeout_s=30), wl.requests))
    starts = [r.start - run.results[0].start for r in run.results]
    assert all(a - 0.01 <= s < a + 0.25 for s, a in zip(starts, [0.0, 0.1, 0.2, 0.6]))
    assert run.metrics.ok == 4 and run.late_arrivals == 0


def test_run_policies_redeploys_each_policy_with_kv_size():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0))
    deployed = []
    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=2, timeout_s=30)
        runs = run_policies(opts, _workload(4).requests, ["pow2", "kvserve"], base_cfg=KVServeConfig(),
                            kv_cache_tokens=8000, deploy=deployed.append)
    assert [r.policy for r in runs] == ["pow2", "kvserve"]
    assert [(c.router.policy, c.engine.kv_cache_tokens) for c in deployed] == [("pow2", 8000), ("kvserve", 8000)]
    assert len(server.bodies) == 8  # identical workload replayed once per policy
    # Two requests are in flight at once, so arrival order within a policy's run may differ.
    assert sorted(b["prompt"] for b in server.bodies[:4]) == sorted(b["prompt"] for b in server.bodies[4:])


def test_cli_acceptance_flags_against_fake(tmp_path, monkeypatch):
    import bench.prepare
    import bench.runner
    app = _cli_app()
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0, config=dump_config(KVServeConfig())))
    deployed = []
    monkeypatch.setattr(bench.prepare, "load_tokenizer", lambda model_cfg, override=None: FakeTokenizer(3000))
    monkeypatch.setattr(bench.runner, "default_deploy", lambda address, cold_engines=False: deployed.append)
    out = tmp_path / "out.json"
    with ServerThread(server.app) as t:
        result = CliRunner().invoke(app, [
            "bench", "--url", t.url, "--workload", "multi-tenant", "--tenants", "16", "--tenant-skew", "zipf:1.1",
            "--system-tokens", "1000", "--question-tokens", "30", "--output-tokens", "16", "--concurrency", "8",
            "--requests", "30", "--kv-cache-tokens", "8000", "--policies", "pow2,ray_prefix,kvserve",
            "--json", str(out),
        ])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert list(data["policies"]) == ["pow2", "ray_prefix", "kvserve"]
    assert all(tuple(v) == (*JSON_KEYS, "tenants") for v in data["policies"].values())
    for v in data["policies"].values():  # the workload's tenants (no API key), each with every request answered fast
        assert 1 < len(v["tenants"]) <= 16 and sum(t["requests"] for t in v["tenants"].values()) == 30
        assert all(t["slo_attainment"] == 1.0 and t["errors"] == 0 for t in v["tenants"].values())
    assert data["workload"]["tenants"] == 16 and data["workload"]["concurrency"] == 8
    assert [c.router.policy for c in deployed] == ["pow2", "ray_prefix", "kvserve"]
    assert (tmp_path / "out.ttft_cdf.png").stat().st_size > 1000
    assert len(server.bodies) == 3 * (30 + 2)  # 2 warm-up requests per policy


def test_cli_refuses_remote_url():
    app = _cli_app()
    result = CliRunner().invoke(app, ["bench", "--url", "http://10.1.2.3:8000", "--concurrency", "1"])
    assert result.exit_code != 0 and "loopback" in result.output
