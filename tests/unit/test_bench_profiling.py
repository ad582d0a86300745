"""bench.profiling: process roles, CPU per role and per token; bench.overhead_load.chunks_per_token."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.client import RequestResult
from bench.overhead_load import chunks_per_token
from bench.profiling import cpu_by_role, per_token_us, role_of


@pytest.mark.parametrize("title, role", [
    ("ray::ProxyActor.receive_asgi_messages", "proxy"),
    ("ray::ServeReplica:kvserve:Ingress.handle_request_with_rejection", "ingress"),
    ("ray::ServeReplica:kvserve:LLMReplica", "replica"),
    ("ray::ServeController.listen_for_change", "controller"),
    ("VLLM::EngineCore", "engine"),
    ("VLLM::Worker_TP0", "engine"),
    ("/usr/bin/raylet --flag", "other"),
])
def test_role_of_titles(title, role):
    assert role_of(title) == role


def test_per_token_us_is_the_cpu_delta_per_token():
    got = per_token_us({"proxy": 1.0, "replica": 2.0}, {"proxy": 1.5, "replica": 2.25, "engine": 0.1}, 1000)
    assert got == {"engine": 100.0, "proxy": 500.0, "replica": 250.0}
    assert per_token_us({}, {"proxy": 1.0}, 0) == {}


def test_cpu_by_role_covers_the_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; sum(range(3_000_000)); time.sleep(30)"])
    try:
        import psutil

        psutil.Process(child.pid).cpu_percent(interval=0.5)  # let it burn a little
        roles = cpu_by_role(child.pid)
        assert set(roles) == {"server"} and roles["server"] > 0
    finally:
        child.kill()
        child.wait()


def _res(tokens: int, chunks: int, ok: bool = True) -> RequestResult:
    return RequestResult(idx=0, start=0.0, ok=ok, output_tokens=tokens, itl_s=[0.01] * (chunks - 1))


def test_chunks_per_token():
    assert chunks_per_token([_res(10, 10), _res(10, 5)]) == pytest.approx(15 / 20)
    assert chunks_per_token([_res(10, 3, ok=False)]) is None
