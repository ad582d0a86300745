"""`kvserve bench-overhead`: level parsing, ratio maths, result assembly, server commands, the load
against an in-process fake server, and that a stopped server leaves no process behind."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
from bench.fake_tokenizer import FakeTokenizer
from bench.overhead import (
    HEADLINE,
    VLLM_SERVER_MODULE,
    assemble,
    bare_vllm_command,
    bare_vllm_env,
    compare,
    kvserve_command,
    one_replica_config,
    parse_levels,
    requests_for,
)
from cli.bench_overhead import _portable_args
from bench.overhead_load import level_requests, measure_levels, random_requests
from bench.runner import ReplayOptions
from bench.servers import free_port, port_is_free, running
from bench.tokens import SafeVocab, encode_plain
from deployments.vllm_args import engine_cli_args
from kvserve.config import KVServeConfig


def _m(ttft: float, itl: float, tok: float) -> dict:
    return {"ttft_p50_ms": ttft, "itl_p50_ms": itl, "output_tok_per_s": tok, "errors": 0, "requests": 8, "ok": 8}


# -- levels and request counts ----------------------------------------------------------------


def test_parse_levels_keeps_order():
    assert parse_levels("1,32,128") == [1, 32, 128]
    assert parse_levels(" 4 , 1 ") == [4, 1]


@pytest.mark.parametrize("spec", ["", "0", "1,-2", "1,1", "a,2", ","])
def test_parse_levels_rejects(spec):
    with pytest.raises(ValueError):
        parse_levels(spec)


@given(st.integers(1, 4096), st.integers(1, 16), st.integers(1, 64))
def test_requests_for_is_per_slot_times_c_with_a_floor(c, per_slot, minimum):
    n = requests_for(c, per_slot, minimum)
    assert n >= minimum and n >= per_slot * c
    assert n in (minimum, per_slot * c)


def test_requests_for_defaults():
    assert [requests_for(c) for c in (1, 2, 32, 128)] == [8, 8, 128, 512]


# -- ratios and targets -----------------------------------------------------------------------


def test_compare_is_kvserve_over_bare():
    r = compare(_m(54.0, 19.2, 1311.0), _m(64.9, 26.8, 1012.0), 32)
    assert r["output_tok_per_s"] == pytest.approx(1012.0 / 1311.0)
    assert r["itl_p50"] == pytest.approx(26.8 / 19.2)
    assert r["ttft_p50_added_ms"] == pytest.approx(10.9)
    assert r["meets"] == {"output_tok_per_s": False, "itl_p50": False}  # the TTFT target is c1's only


def test_compare_targets_at_their_bounds():
    ok = compare(_m(50.0, 10.0, 100.0), _m(55.0, 10.5, 97.0), 1)
    assert ok["meets"] == {"output_tok_per_s": True, "itl_p50": True, "ttft_p50_added": True}
    miss = compare(_m(50.0, 10.0, 100.0), _m(55.1, 10.51, 96.9), 1)
    assert miss["meets"] == {"output_tok_per_s": False, "itl_p50": False, "ttft_p50_added": False}


def test_compare_without_data_says_none():
    r = compare(_m(50.0, 10.0, 0.0), {"ttft_p50_ms": None, "itl_p50_ms": None, "output_tok_per_s": 5.0}, 1)
    assert r["output_tok_per_s"] is None and r["itl_p50"] is None and r["ttft_p50_added_ms"] is None
    assert r["meets"] == {"output_tok_per_s": None, "itl_p50": None, "ttft_p50_added": None}


@given(st.floats(1.0, 1e5), st.floats(1.0, 1e5))
def test_throughput_ratio_meets_exactly_at_097(bare_tok, kv_tok):
    r = compare(_m(1.0, 1.0, bare_tok), _m(1.0, 1.0, kv_tok), 8)
    assert r["meets"]["output_tok_per_s"] == (kv_tok / bare_tok >= 0.97)


# -- result assembly --------------------------------------------------------------------------


def test_assemble_has_the_issue_schema():
    res = assemble("H100", "0.24.0", {"input_len": 1024}, {1: _m(54, 19, 51), 32: _m(379, 19.2, 1311)},
                   {1: _m(65, 20, 48.6), 32: _m(493, 26.8, 1012)})
    assert set(res) == {"device", "vllm", "params", "runs"}
    assert (res["device"], res["vllm"], res["params"]) == ("H100", "0.24.0", {"input_len": 1024})
    assert list(res["runs"]) == ["c1", "c32"]
    for run in res["runs"].values():
        assert set(run) == {"bare", "kvserve", "ratio"}
        for target in ("bare", "kvserve"):
            assert tuple(run[target])[: len(HEADLINE)] == HEADLINE
    assert res["runs"]["c32"]["kvserve"]["output_tok_per_s"] == 1012
    assert res["runs"]["c1"]["ratio"]["output_tok_per_s"] == pytest.approx(48.6 / 51)


def test_assemble_one_target_has_no_ratio():
    res = assemble("cpu", "0.32.0", {}, {4: _m(1, 1, 1)}, {})
    assert res["runs"] == {"c4": {"bare": res["runs"]["c4"]["bare"]}}
    assert res["runs"]["c4"]["bare"]["ttft_p50_ms"] == 1


def test_assemble_kv_events_target_is_compared_with_bare():
    res = assemble("cpu", "0.32.0", {}, {1: _m(50, 10, 100)}, {1: _m(60, 11, 90)}, {1: _m(52, 10.2, 98)})
    run = res["runs"]["c1"]
    assert set(run) == {"bare", "kvserve", "ratio", "bare_kv_events", "ratio_kv_events"}
    assert run["ratio_kv_events"]["output_tok_per_s"] == pytest.approx(0.98)
    assert run["ratio"]["output_tok_per_s"] == pytest.approx(0.9)


# -- server commands --------------------------------------------------------------------------


def test_bare_command_passes_the_replicas_engine_flags():
    cfg = KVServeConfig()
    cmd = bare_vllm_command(cfg, 8123, python="py")
    flags = engine_cli_args(cfg)
    assert cmd[:3] == ["py", "-m", VLLM_SERVER_MODULE]
    assert cmd[3 : 3 + len(flags)] == flags
    assert cmd[3 + len(flags) :] == ["--host", "127.0.0.1", "--port", "8123"]
    assert "--kv-events-config" not in cmd  # the publisher is kvserve's cost, not vLLM's
    with_events = bare_vllm_command(cfg, 8123, python="py", kv_events_endpoint="ipc:///tmp/x.sock")
    assert with_events[3:-4] == engine_cli_args(cfg, kv_events_endpoint="ipc:///tmp/x.sock")


def test_bare_env_is_the_replicas_engine_env_on_cpu():
    env = bare_vllm_env(KVServeConfig.model_validate({"engine": {"kv_cache_gib": 3, "omp_threads_bind": "0"}}))
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "3", "VLLM_CPU_OMP_THREADS_BIND": "0"}
    slot = bare_vllm_env(KVServeConfig())["VLLM_CPU_OMP_THREADS_BIND"]
    assert [int(c) for c in slot.split(",")] == sorted(psutil.Process().cpu_affinity())[:1]
    assert bare_vllm_env(KVServeConfig.model_validate({"engine": {"device": "gpu"}})) == {}


def test_one_replica_config_is_the_same_engine_on_one_fixed_replica():
    cfg = KVServeConfig.model_validate({"num_replicas": 4, "engine": {"max_num_seqs": 7},
                                        "autoscaling": {"enabled": True, "max_replicas": 4},
                                        "server": {"host": "0.0.0.0", "port": 8000}})
    data = one_replica_config(cfg, 9123)
    again = KVServeConfig.model_validate(data)
    assert again.num_replicas == 1 and not again.autoscaling.enabled
    assert (again.server.host, again.server.port) == ("127.0.0.1", 9123)
    assert engine_cli_args(again) == engine_cli_args(cfg)
    assert kvserve_command("c.json", python="py") == ["py", "-m", "cli", "serve", "--config", "c.json"]


def test_portable_args_keep_no_paths():
    args = _portable_args(["--model", "/some/dir/model-x", "--tokenizer", "/t/tok", "--dtype", "bfloat16"])
    assert args == ["--model", "model-x", "--tokenizer", "tok", "--dtype", "bfloat16"]


# -- the load ---------------------------------------------------------------------------------


def test_random_requests_are_exact_seeded_and_distinct():
    vocab = SafeVocab(FakeTokenizer())
    a = random_requests(vocab, 6, 40, 5, "s")
    assert a == random_requests(vocab, 6, 40, 5, "s")
    assert len({r.prompt_ids for r in a}) == 6
    for r in a:
        assert len(r.prompt_ids) == 40 and r.max_tokens == 5
        assert encode_plain(vocab.tok, r.prompt_text) == list(r.prompt_ids)
    levels = level_requests(vocab, [1, 4], [3, 8], 10, 2, seed=0)
    assert [len(v) for v in levels.values()] == [3, 8]
    assert not {r.prompt_ids for r in levels[1]} & {r.prompt_ids for r in levels[4]}


def test_measure_levels_against_a_fake_server():
    vocab = SafeVocab(FakeTokenizer())
    server = FakeKVServe(FakeBehaviour(replicas=("r",), first_token_s=0.02, itl_s=0.005))
    levels = level_requests(vocab, [1, 4], [3, 8], 10, 6, seed=0)
    seen: list[int] = []
    with ServerThread(server.app) as thread:
        opts = ReplayOptions(base_url=thread.url, model="m")
        got = asyncio.run(measure_levels(opts, levels, random_requests(vocab, 2, 10, 6, "w"),
                                         lambda c, m: seen.append(c)))
    assert seen == [1, 4] and list(got) == [1, 4]
    assert len(server.bodies) == 2 + 3 + 8
    assert all(b["ignore_eos"] and b["stream"] and b["max_tokens"] == 6 for b in server.bodies)
    for c, n in ((1, 3), (4, 8)):
        m = got[c]
        assert (m.requests, m.ok, m.errors) == (n, n, 0)
        assert m.ttft_p50_ms >= 20.0 and m.itl_p50_ms >= 5.0
        assert m.output_tok_per_s > 0 and m.client_loop_lag_p99_ms is not None


def test_measure_levels_fails_loudly_when_warmup_fails():
    vocab = SafeVocab(FakeTokenizer())
    server = FakeKVServe(FakeBehaviour(fail_status={0: 500}))
    with ServerThread(server.app) as thread:
        with pytest.raises(RuntimeError, match="warm-up"):
            asyncio.run(measure_levels(ReplayOptions(base_url=thread.url, model="m"),
                                       level_requests(vocab, [1], [1], 5, 2, 0), random_requests(vocab, 1, 5, 2, "w")))


# -- process lifecycle ------------------------------------------------------------------------

# A server that answers 200 on /ready and has a child that ignores SIGTERM (as a stuck engine might).
_SERVER = textwrap.dedent("""
    import http.server, signal, subprocess, sys
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    print("child", child.pid, flush=True)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_running_server_is_stopped_with_its_children(tmp_path):
    port = free_port()
    log = tmp_path / "s.log"
    with running([sys.executable, "-c", _SERVER, str(port)], env={}, ready_url=f"http://127.0.0.1:{port}/ready",
                 log=log, timeout_s=60, grace_s=2) as proc:
        assert not port_is_free(port)
        child = int(log.read_text().split()[1])
        assert psutil.pid_exists(child)
    assert proc.poll() is not None
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert port_is_free(port)


def test_running_raises_with_the_log_when_the_server_dies(tmp_path):
    cmd = [sys.executable, "-c", "import sys; print('no engine for you'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="no engine for you"):
        with running(cmd, env={}, ready_url=f"http://127.0.0.1:{free_port()}/ready", log=tmp_path / "x.log",
                     timeout_s=60):
            pytest.fail("never ready")


def test_stop_of_an_already_exited_server_is_quiet(tmp_path):
    from bench.servers import stop

    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    proc.wait()
    stop(proc, 15, grace_s=1)
    assert proc.returncode == 0
