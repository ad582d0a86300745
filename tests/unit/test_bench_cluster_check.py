"""The bench measures the cluster it claims: it waits for /ready, checks the replica count, refuses otherwise."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from bench.cluster_check import ClusterMismatch
from bench.fake_server import FakeBehaviour, FakeKVServe, ServerThread
from bench.fake_tokenizer import FakeTokenizer
from bench.runner import ReplayOptions, run_policies
from bench.tokens import SafeVocab
from bench.workloads import multi_tenant
from deployments.serve_state import DeploymentState, parse_details
from ray.serve._private.common import DeploymentStatus, ReplicaState
from kvserve.config import KVServeConfig, dump_config
from tests.unit.test_bench_client import _cli_app


def _requests(n: int = 4):
    return multi_tenant(SafeVocab(FakeTokenizer(3000)), tenants=2, system_tokens=20, question_tokens=4,
                        output_tokens=2, requests=n, seed=0).requests


def _bench(url: str, *extra: str):
    return CliRunner().invoke(_cli_app(), ["bench", "--url", url, "--tenants", "2", "--system-tokens", "20",
                                           "--question-tokens", "4", "--output-tokens", "2", "--requests", "4",
                                           "--concurrency", "2", "--warmup", "0", *extra])


@pytest.fixture()
def fake_tokenizer(monkeypatch):
    import bench.prepare

    monkeypatch.setattr(bench.prepare, "load_tokenizer", lambda model_cfg, override=None: FakeTokenizer(3000))


def test_bench_waits_until_every_replica_serves_then_records_the_count(tmp_path, fake_tokenizer):
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0, not_ready_polls=3,
                                       config=dump_config(KVServeConfig(num_replicas=2))))
    out = tmp_path / "out.json"
    with ServerThread(server.app) as t:
        result = _bench(t.url, "--json", str(out))
    assert result.exit_code == 0, result.output
    assert server.ready_polls >= 4  # three 503s waited out before anything was read or sent
    assert json.loads(out.read_text())["policies"]["current"]["replicas"] == 2
    assert "replicas" in result.output


def test_bench_refuses_a_cluster_that_never_gets_ready(tmp_path, fake_tokenizer):
    server = FakeKVServe(FakeBehaviour(not_ready_polls=10**9, config=dump_config(KVServeConfig())))
    with ServerThread(server.app) as t:
        result = _bench(t.url, "--ready-timeout", "1", "--json", str(tmp_path / "out.json"))
    assert result.exit_code == 2 and "not measuring" in result.output and "not ready" in result.output
    assert not server.bodies and not (tmp_path / "out.json").exists()


def test_bench_refuses_fewer_replicas_than_configured(fake_tokenizer):
    server = FakeKVServe(FakeBehaviour(replicas=("replica-a",), config=dump_config(KVServeConfig(num_replicas=2))))
    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=2, timeout_s=30, replica_settle_s=0.3)
        with pytest.raises(ClusterMismatch, match="asked for 2 replica"):
            run_policies(opts, _requests(), [None], expected_replicas=2)
    assert not server.bodies


def test_a_redeploy_that_does_not_take_is_refused_and_earlier_results_are_kept():
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0))
    saved: list[list[str]] = []

    def deploy(cfg) -> None:  # the second policy's redeploy leaves one replica of the two asked for
        if cfg.router.policy == "kvserve":
            server.serve_replicas(("replica-a",))

    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=2, timeout_s=30, replica_settle_s=0.3)
        with pytest.raises(ClusterMismatch, match="asked for 2 replica.*1 serve"):
            run_policies(opts, _requests(), ["pow2", "kvserve"], base_cfg=KVServeConfig(num_replicas=2),
                         deploy=deploy, on_done=lambda runs: saved.append([r.policy for r in runs]))
    assert saved == [["pow2"]]  # written as soon as it finished; nothing measured on the wrong cluster
    assert len(server.bodies) == 4


@pytest.mark.parametrize("emptied", [("replica-a", "replica-b"), ("replica-a",)])
def test_a_policy_is_measured_only_once_every_replica_emptied_its_cache(emptied):
    """The default redeploy keeps the engines and empties their prefix caches under a new epoch."""
    server = FakeKVServe(FakeBehaviour(first_token_s=0.0, itl_s=0.0))

    def deploy(cfg) -> str:
        epoch = f"epoch-{cfg.router.policy}"
        server.cache_epochs.update({r: epoch for r in emptied})
        return epoch

    with ServerThread(server.app) as t:
        opts = ReplayOptions(base_url=t.url, model="m", concurrency=2, timeout_s=30, replica_settle_s=0.3)
        if len(emptied) == 2:
            runs = run_policies(opts, _requests(), ["pow2"], base_cfg=KVServeConfig(num_replicas=2), deploy=deploy)
            assert [r.policy for r in runs] == ["pow2"] and len(server.bodies) == 4
        else:
            with pytest.raises(ClusterMismatch, match="replica-b did not empty"):
                run_policies(opts, _requests(), ["pow2"], base_cfg=KVServeConfig(num_replicas=2), deploy=deploy)
            assert not server.bodies


def _details(status, target: int, states: list) -> dict:
    return {"applications": {"kvserve": {"deployments": {"LLMReplica": {
        "status": status, "target_num_replicas": target, "replicas": [{"state": s} for s in states]}}}}}


@pytest.mark.parametrize("details, expected", [
    (_details("HEALTHY", 2, ["RUNNING", "RUNNING"]), DeploymentState("HEALTHY", 2, 2)),
    (_details("UPSCALING", 2, ["RUNNING", "STARTING"]), DeploymentState("UPSCALING", 2, 1)),
    ({"applications": {}}, DeploymentState(None, 0, 0)),
    # The controller hands back Serve's own enums, not strings.
    (_details(DeploymentStatus.HEALTHY, 1, [ReplicaState.RUNNING]), DeploymentState("HEALTHY", 1, 1)),
])
def test_serve_state_reads_the_target_not_who_answers(details, expected):
    state = parse_details(details, "kvserve")
    assert state == expected
    assert state.ready == (expected.status == "HEALTHY")
    assert state.as_dict()["target_replicas"] == expected.target_replicas
