"""The ingress answers 503 when no replica takes a request within `server.max_queue_wait_s`."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from types import SimpleNamespace

from deployments.access_log import AccessLog
from deployments.cold_start import ColdStart
from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from deployments.protocol import BODY, META, CompletionWork
from kvserve.config import KVServeConfig


class _Stream:
    """A streaming handle call: `delay` before the replica's first item (its wait at the routers)."""

    def __init__(self, delay: float) -> None:
        self.delay, self.cancelled = delay, False
        self.items = [(META, {"replica_id": "r1"}), (BODY, {"usage": None, "choices": []})]

    async def __anext__(self):  # type: ignore[no-untyped-def]
        if self.delay:
            await asyncio.sleep(self.delay)
            self.delay = 0.0
        return self.items.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


def _dispatch(stream: _Stream, wait_s: float | None, start: float):  # type: ignore[no-untyped-def]
    """`Ingress._dispatch` on just the state it reads (no Serve replica around it)."""
    cfg = KVServeConfig(server={"max_queue_wait_s": wait_s})
    metrics = IngressMetrics()

    async def running() -> int:
        raise AssertionError("min_replicas >= 1: the controller is never asked")

    ing = SimpleNamespace(
        cfg=cfg,
        metrics=metrics,
        cold=ColdStart(cfg, running, metrics.registry),
        access=AccessLog(),
        llm=SimpleNamespace(options=lambda **_: SimpleNamespace(generate=SimpleNamespace(remote=lambda _w: stream))),
    )
    ing._finished = functools.partial(Ingress._finished, ing)
    ing._first_items = functools.partial(Ingress._first_items, ing)
    return asyncio.run(Ingress._dispatch(ing, "completion", _work(), start))


def _work() -> CompletionWork:
    return CompletionWork(request_id="completion-1", body={}, engine_inputs=[], block_hashes=[], num_prompt_tokens=3)


def test_a_request_no_replica_takes_in_time_gets_503_and_leaves_the_queue():
    stream = _Stream(delay=5.0)
    t0 = time.monotonic()
    resp = _dispatch(stream, 0.05, t0)
    assert time.monotonic() - t0 < 2.0
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "5"
    err = json.loads(resp.body)["error"]
    assert "no replica could take the request within 0.05 s" in err["message"]
    assert stream.cancelled


def test_the_wait_counts_from_the_requests_arrival_at_the_ingress():
    stream = _Stream(delay=0.5)
    # Rendering (or a busy event loop) already took 0.9 s of a 1 s bound: 0.5 s more is too long.
    resp = _dispatch(stream, 1.0, time.monotonic() - 0.9)
    assert resp.status_code == 503 and stream.cancelled


def test_a_request_taken_in_time_is_served():
    stream = _Stream(delay=0.01)
    resp = _dispatch(stream, 1.0, time.monotonic())
    assert resp.status_code == 200 and not stream.cancelled
    unbounded = _Stream(delay=0.05)
    assert _dispatch(unbounded, None, time.monotonic()).status_code == 200
