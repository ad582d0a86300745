"""The ingress re-sends a request that never started on a replica that lost its engine or died,
and ends a stream cut mid-way with an SSE error event."""

from __future__ import annotations

import asyncio
import functools
import json
from types import SimpleNamespace

from ray.exceptions import ActorDiedError

from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from deployments.access_log import AccessLog
from deployments.protocol import BODY, META, RETRY, SSE, ChatWork
from kvserve.config import KVServeConfig

BODY_OK = {"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


class _Call:
    """One replica call: its items in order; an exception item is raised when reached."""

    def __init__(self, replica: str, items: list) -> None:
        self.items = [(META, {"replica_id": replica}), *items]
        self.cancelled = False

    async def __anext__(self):  # type: ignore[no-untyped-def]
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self

    def cancel(self) -> None:
        self.cancelled = True


def _ingress(calls: list[_Call], retries: int = 2):  # type: ignore[no-untyped-def]
    sent: list[list[str]] = []

    def remote(work):  # type: ignore[no-untyped-def]
        sent.append(list(work.avoid_replicas))  # what the router was told to avoid on this send
        return calls.pop(0)

    cfg = KVServeConfig.model_validate({"server": {"replica_retries": retries}})
    ing = SimpleNamespace(cfg=cfg, metrics=IngressMetrics(), access=AccessLog(False),
                          llm=SimpleNamespace(options=lambda **_: SimpleNamespace(
                              generate=SimpleNamespace(remote=remote))))
    ing._finished = functools.partial(Ingress._finished, ing)
    ing._first_items = functools.partial(Ingress._first_items, ing)
    return ing, sent


def _run(ing):  # type: ignore[no-untyped-def]
    work = ChatWork(request_id="chat-1", body={}, engine_inputs=[], block_hashes=[], num_prompt_tokens=3)

    async def run():  # type: ignore[no-untyped-def]
        resp = await Ingress._dispatch(ing, "chat", work, 0.0)
        if hasattr(resp, "body_iterator"):
            return resp, "".join([c async for c in resp.body_iterator])
        return resp, resp.body.decode()

    return asyncio.run(run())


def test_a_request_on_a_dead_engine_is_resent_to_another_replica_avoiding_it():
    ing, sent = _ingress([_Call("r1", [(RETRY, {"reason": "engine_dead"})]), _Call("r2", [(BODY, BODY_OK)])])
    resp, body = _run(ing)
    assert resp.status_code == 200 and resp.headers["x-kvserve-replica"] == "r2"
    assert sent == [[], ["r1"]]


def test_a_replica_lost_before_output_is_retried():
    ing, sent = _ingress([_Call("r1", [ActorDiedError()]), _Call("r2", [(BODY, BODY_OK)])])
    resp, _ = _run(ing)
    assert resp.status_code == 200 and sent == [[], ["r1"]]


def test_retries_are_bounded_and_end_in_a_clear_503():
    ing, sent = _ingress([_Call(f"r{i}", [(RETRY, {"reason": "engine_dead"})]) for i in range(2)], retries=1)
    resp, body = _run(ing)
    assert resp.status_code == 503 and len(sent) == 2
    err = json.loads(body)["error"]
    assert err["code"] == "engine_dead" and err["type"] == "server_error"


def test_no_retries_when_the_knob_is_zero():
    ing, sent = _ingress([_Call("r1", [ActorDiedError()])], retries=0)
    resp, body = _run(ing)
    assert resp.status_code == 503 and json.loads(body)["error"]["code"] == "replica_lost" and len(sent) == 1


def test_a_stream_cut_mid_way_ends_with_an_sse_error_event():
    chunk = 'data: {"choices": [{"text": "a"}]}\n\n'
    call = _Call("r1", [(SSE, chunk), (SSE, chunk), ActorDiedError()])
    ing, sent = _ingress([call])
    resp, body = _run(ing)
    assert resp.status_code == 200 and len(sent) == 1  # output was sent: never re-run
    events = [e for e in body.split("\n\n") if e]
    assert events[:2] == [chunk.strip()] * 2
    err = json.loads(events[-1].removeprefix("data: "))["error"]
    assert err["code"] == "replica_lost" and "incomplete" in err["message"]
