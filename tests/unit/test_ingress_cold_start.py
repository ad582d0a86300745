"""Scale to zero: a request that arrives while no replica serves is held for the first replica's start
(`server.cold_start_wait_s`, not the overload bound), its time to first token is exported, and past the
bound it gets a 503 with Retry-After and OpenAI's error body."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from deployments.access_log import AccessLog
from deployments.cold_start import ColdStart
from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from tests.unit.test_ingress_queue_wait import _Stream, _work
from kvserve.config import KVServeConfig


def _cfg(min_replicas: int = 0, queue_wait_s: float = 0.05, cold_wait_s: float | None = 1.0) -> KVServeConfig:
    return KVServeConfig(autoscaling={"enabled": True, "min_replicas": min_replicas},
                         server={"max_queue_wait_s": queue_wait_s, "cold_start_wait_s": cold_wait_s})


def _ingress(cfg: KVServeConfig, stream: _Stream, running: list[int], asks: list[int]) -> SimpleNamespace:
    metrics = IngressMetrics()

    async def running_replicas() -> int:
        asks.append(1)
        return running[0]

    ing = SimpleNamespace(cfg=cfg, metrics=metrics, access=AccessLog(),
                          cold=ColdStart(cfg, running_replicas, metrics.registry),
                          llm=SimpleNamespace(options=lambda **_: SimpleNamespace(
                              generate=SimpleNamespace(remote=lambda _w: stream))))
    ing._finished = functools.partial(Ingress._finished, ing)
    ing._first_items = functools.partial(Ingress._first_items, ing)
    return ing


def _metric(ing: SimpleNamespace, name: str) -> float | None:
    for line in generate_latest(ing.metrics.registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_a_request_held_for_a_cold_start_waits_past_the_overload_bound_and_is_served():
    stream, asks = _Stream(delay=0.3), []  # the first replica takes it 0.3 s in: 6x max_queue_wait_s
    ing = _ingress(_cfg(), stream, [0], asks)
    resp = asyncio.run(Ingress._dispatch(ing, "completion", _work(), time.monotonic()))
    assert resp.status_code == 200 and not stream.cancelled
    assert _metric(ing, "kvserve_cold_start_ttft_seconds_count") == 1
    assert 0.3 <= _metric(ing, "kvserve_cold_start_last_ttft_seconds") < 2.0
    assert _metric(ing, "kvserve_cold_start_held_requests") == 0  # no longer waiting


def test_past_the_cold_start_bound_a_held_request_gets_a_503_with_retry_after():
    stream = _Stream(delay=5.0)
    ing = _ingress(_cfg(cold_wait_s=0.2), stream, [0], [])
    t0 = time.monotonic()
    resp = asyncio.run(Ingress._dispatch(ing, "completion", _work(), t0))
    assert time.monotonic() - t0 < 2.0
    assert resp.status_code == 503 and resp.headers["Retry-After"]
    err = json.loads(resp.body)["error"]
    assert err["code"] == "cold_start_timeout" and "0.2 s" in err["message"] and err["type"]
    assert stream.cancelled  # left the routers' queue
    assert _metric(ing, "kvserve_cold_start_ttft_seconds_count") == 0


def test_with_a_replica_serving_the_overload_bound_applies():
    stream = _Stream(delay=0.3)
    ing = _ingress(_cfg(), stream, [1], [])
    resp = asyncio.run(Ingress._dispatch(ing, "completion", _work(), time.monotonic()))
    assert resp.status_code == 503 and "within 0.05 s" in json.loads(resp.body)["error"]["message"]
    assert _metric(ing, "kvserve_cold_start_ttft_seconds_count") == 0


def test_the_controller_is_asked_only_when_scaling_to_zero_is_on_and_at_most_once_a_period():
    asks: list[int] = []
    warm = _ingress(_cfg(min_replicas=1), _Stream(0.0), [0], asks)
    assert asyncio.run(warm.cold.no_replica_serving()) is False and not asks
    now = [0.0]
    metrics = IngressMetrics()

    async def running() -> int:
        asks.append(1)
        return 0

    cold = ColdStart(_cfg(), running, metrics.registry, max_age_s=1.0, clock=lambda: now[0])
    for t in (0.0, 0.5, 0.99):
        now[0] = t
        assert asyncio.run(cold.no_replica_serving()) is True
    assert len(asks) == 1
    now[0] = 1.0
    asyncio.run(cold.no_replica_serving())
    assert len(asks) == 2


def test_a_failed_ask_counts_as_warm():
    async def broken() -> int:
        raise RuntimeError("controller unreachable")

    cold = ColdStart(_cfg(), broken, IngressMetrics().registry)
    assert asyncio.run(cold.no_replica_serving()) is False


@pytest.mark.parametrize("queue_wait, cold_wait, expected", [
    (30.0, 300.0, 300.0), (30.0, 10.0, 30.0), (30.0, None, None), (None, 300.0, None)])
def test_the_cold_bound_is_never_shorter_than_the_overload_bound(queue_wait, cold_wait, expected):
    cold = ColdStart(_cfg(queue_wait_s=queue_wait, cold_wait_s=cold_wait) if queue_wait else
                     KVServeConfig(autoscaling={"enabled": True, "min_replicas": 0},
                                   server={"max_queue_wait_s": None, "cold_start_wait_s": cold_wait}),
                     lambda: None, IngressMetrics().registry)  # type: ignore[arg-type,return-value]
    assert cold.wait_s(True) == expected
    assert cold.wait_s(False) == queue_wait


def test_a_deployment_scaled_to_zero_is_ready_one_not_deployed_is_not():
    from deployments.serve_state import DeploymentState

    assert DeploymentState("HEALTHY", 0, 0).ready
    assert not DeploymentState(None, 0, 0).ready
    assert not DeploymentState("UPSCALING", 1, 0).ready
