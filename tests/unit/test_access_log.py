"""Access lines: tenant, status, tokens, latency; prompt text only with `logging.prompts`."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from types import SimpleNamespace

import pytest

from deployments.access_log import ACCESS_LOGGER, AccessLog, access_line, stream_usage
from deployments.ingress import Ingress
from deployments.metrics import IngressMetrics
from deployments.protocol import BODY, META, SSE, ChatWork
from deployments.vllm_args import engine_cli_args
from kvserve.config import ConfigError, KVServeConfig, load_config

SECRET = "the launch code is 0000"  # stands for any prompt text
USAGE = {"prompt_tokens": 12, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 8}}


def _work(text: str = SECRET) -> ChatWork:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return ChatWork(request_id="chat-1", body=body, engine_inputs=[], block_hashes=[], num_prompt_tokens=12,
                    tenant="acme", conversation=[], messages=body["messages"])


def test_the_line_carries_tenant_status_tokens_and_latency():
    line = access_line(tenant="acme", kind="chat", status=200, seconds=0.2345, request_id="chat-1",
                       replica="r1", usage=USAGE)
    assert line == ("request_id=chat-1 tenant=acme kind=chat status=200 replica=r1 prompt_tokens=12 "
                    "completion_tokens=5 cached_tokens=8 latency_ms=234")


def test_unknown_values_are_left_out():
    assert access_line(tenant="unknown", kind="completion", status=401, seconds=0.001) == (
        "tenant=unknown kind=completion status=401 latency_ms=1")
    # Before a response has usage, the ingress's own prompt-token count stands in.
    assert "prompt_tokens=7 " in access_line(tenant="t", kind="chat", status=499, seconds=1, prompt_tokens=7)


def _logged(caplog, prompts: bool, **kw) -> str:
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        AccessLog(prompts=prompts).request_done("acme", "chat", 200, 0.1, **kw)
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    return record.getMessage()


def test_no_prompt_text_by_default(caplog):
    line = _logged(caplog, False, work=_work(), usage=USAGE)
    assert SECRET not in line and "tenant=acme" in line and "prompt_tokens=12" in line


def test_the_prompts_switch_adds_the_prompt_on_the_same_line(caplog):
    line = _logged(caplog, True, work=_work("line one\nline two"), usage=USAGE)
    assert "\n" not in line
    prompt = json.loads(line.split(" prompt=", 1)[1])
    assert prompt == [{"role": "user", "content": "line one\nline two"}]


def test_the_prompts_switch_also_logs_a_request_refused_before_rendering(caplog):
    line = _logged(caplog, True, body={"prompt": SECRET})
    assert json.dumps(SECRET) in line


def test_stream_usage_reads_the_chunk_that_has_it():
    assert stream_usage('data: {"choices": [], "usage": ' + json.dumps(USAGE) + "}\n\n") == USAGE
    assert stream_usage('data: {"choices": [{"delta": {"content": "hi"}}]}\n\n') is None
    assert stream_usage('data: {"choices": [], "usage": null}\n\n') is None
    assert stream_usage("data: [DONE]\n\n") is None


# ---------------------------------------------------------------- through the ingress


class _Stream:
    """A replica call's items, as the ingress reads them."""

    def __init__(self, items: list) -> None:
        self.items = [(META, {"replica_id": "r1"}), *items]

    async def __anext__(self):  # type: ignore[no-untyped-def]
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def __aiter__(self):  # type: ignore[no-untyped-def]
        return self

    def cancel(self) -> None:
        pass


def _dispatch(items: list, prompts: bool = False):  # type: ignore[no-untyped-def]
    """`Ingress._dispatch` on just the state it reads, the response's body read to the end."""
    stream = _Stream(items)
    ing = SimpleNamespace(
        cfg=KVServeConfig(), metrics=IngressMetrics(), access=AccessLog(prompts),
        llm=SimpleNamespace(options=lambda **_: SimpleNamespace(generate=SimpleNamespace(remote=lambda _w: stream))),
    )
    ing._finished = functools.partial(Ingress._finished, ing)
    ing._first_items = functools.partial(Ingress._first_items, ing)

    async def run():  # type: ignore[no-untyped-def]
        resp = await Ingress._dispatch(ing, "chat", _work(), 0.0)
        if hasattr(resp, "body_iterator"):
            return resp, "".join([c async for c in resp.body_iterator])
        return resp, resp.body.decode()

    return asyncio.run(run())


@pytest.mark.parametrize("streamed", [False, True], ids=["body", "stream"])
def test_the_ingress_writes_one_line_per_request_without_the_prompt(caplog, streamed):
    reply = "the answer is 42"
    if streamed:
        items = [(SSE, 'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n' % reply),
                 (SSE, 'data: {"choices": [], "usage": %s}\n\n' % json.dumps(USAGE)), (SSE, "data: [DONE]\n\n")]
    else:
        items = [(BODY, {"choices": [{"message": {"content": reply}}], "usage": USAGE})]
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        resp, body = _dispatch(items)
    assert resp.status_code == 200 and reply in body
    (line,) = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert SECRET not in line and reply not in line
    for field in ("request_id=chat-1", "tenant=acme", "status=200", "replica=r1", "prompt_tokens=12",
                  "completion_tokens=5", "cached_tokens=8", "latency_ms="):
        assert field in line


# ---------------------------------------------------------------- vLLM's own request log


def test_vllm_request_logging_is_off_unless_prompts_are_logged():
    base = {"model": {"source": "org/model"}}  # not an embedded model: no prepared weights needed
    assert "--no-enable-log-requests" in engine_cli_args(KVServeConfig.model_validate(base))
    on = engine_cli_args(KVServeConfig.model_validate({**base, "logging": {"prompts": True}}))
    assert "--enable-log-requests" in on and "--no-enable-log-requests" not in on


@pytest.mark.parametrize("flag", ["enable_log_requests", "enable-log-outputs"])
def test_vllm_request_logging_cannot_come_in_through_extra_args(flag):
    with pytest.raises(ConfigError, match="logging.prompts"):
        load_config(overrides={"engine": {"extra_args": {flag: True}}}, environ={})


def test_inside_a_serve_replica_lines_go_to_serves_current_handlers(monkeypatch):
    """Serve replaces its logger's handlers when a deployment is reconfigured: follow them."""
    from deployments.access_log import SERVE_LOGGER

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    import deployments.access_log

    serve_log, access = logging.getLogger(SERVE_LOGGER), logging.getLogger(ACCESS_LOGGER)
    first, second = Keep(), Keep()
    monkeypatch.setattr(deployments.access_log, "_in_serve_replica", lambda: True)
    monkeypatch.setattr(serve_log, "handlers", [first])
    monkeypatch.setattr(access, "handlers", [])
    monkeypatch.setattr(access, "propagate", True)
    log = AccessLog()
    log.request_done("acme", "chat", 200, 0.1, work=_work())
    serve_log.handlers = [second]
    log.request_done("acme", "chat", 201, 0.1, work=_work())
    assert ["status=200" in x for x in first.lines] == [True] and ["status=201" in x for x in second.lines] == [True]
