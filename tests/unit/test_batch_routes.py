"""The Batch API's HTTP layer with the official `openai` client, in process: the ingress's batch routes
and auth on a plain FastAPI app, batch lines answered by a stand-in for the engines."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import time
import types

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from deployments.auth import TenantAuth, hash_key
from deployments.batch_routes import BatchRoutes, batch_router
from deployments.errors import install_error_handlers
from deployments.ingress import Ingress
from kvserve.config import KVServeConfig

KEYS = {"a": "sk-a", "b": "sk-b"}
MODEL = "smollm2-135m-instruct"


class _Ingress(BatchRoutes):
    """The ingress's auth and body reading; lines answered by `run_batch_line` below."""

    _tenant = Ingress._tenant
    _read_json = Ingress._read_json

    def __init__(self, cfg: KVServeConfig) -> None:
        self.cfg, self.auth, self.seen = cfg, TenantAuth(cfg.tenants), []

    async def run_batch_line(self, kind, body, tenant):
        await asyncio.sleep(0.001)
        self.seen.append(body["messages"][0]["content"])
        text = body["messages"][0]["content"].upper()
        return 200, {"object": "chat.completion", "model": body["model"],
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


@pytest.fixture
def server(tmp_path):
    cfg = KVServeConfig.model_validate({
        "tenants": {"keys": [{"tenant": t, "key_sha256": hash_key(k)} for t, k in KEYS.items()]},
        "batch": {"db_path": str(tmp_path / "b.sqlite"), "max_file_bytes": 4096}})
    ing = _Ingress(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        ing.start_batch()  # in the app's event loop, as the ingress's constructor does
        yield
        await ing.batch_worker.stop()

    app = FastAPI(lifespan=lifespan)
    install_error_handlers(app)
    for route in batch_router.routes:  # the routes bound to this instance (Serve does it with a dependency)
        app.add_api_route(route.path, types.MethodType(route.endpoint, ing), methods=list(route.methods))
    with TestClient(app) as http:
        yield ing, http


def _client(http, tenant="a"):
    return openai.OpenAI(base_url="http://testserver/v1", api_key=KEYS[tenant], http_client=http, max_retries=0)


def _jsonl(lines) -> io.BytesIO:
    return io.BytesIO("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode())


def _line(cid, model=MODEL):
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": cid}]}}


def test_the_openai_client_runs_a_batch_unmodified(server):
    ing, http = server
    client = _client(http)
    f = client.files.create(file=("in.jsonl", _jsonl([_line(f"q{i}") for i in range(20)] + ["{broken"])),
                            purpose="batch")
    assert f.purpose == "batch" and f.filename == "in.jsonl" and f.bytes > 0
    assert client.files.retrieve(f.id).id == f.id
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                              metadata={"job": "t"})
    assert b.status == "in_progress" and b.request_counts.total == 21
    deadline = time.monotonic() + 60
    while (b := client.batches.retrieve(b.id)).status != "completed":
        assert time.monotonic() < deadline, b
        time.sleep(0.05)
    assert (b.request_counts.completed, b.request_counts.failed) == (20, 1) and b.metadata == {"job": "t"}
    out = [json.loads(x) for x in client.files.content(b.output_file_id).content.splitlines()]
    assert sorted(r["custom_id"] for r in out) == sorted(f"q{i}" for i in range(20))
    assert all(r["response"]["body"]["choices"][0]["message"]["content"] == r["custom_id"].upper() for r in out)
    (err,) = [json.loads(x) for x in client.files.content(b.error_file_id).content.splitlines()]
    assert err["error"]["code"] == "invalid_json" and "line 21" in err["error"]["message"]
    assert sorted(ing.seen) == sorted(f"q{i}" for i in range(20))  # each line ran once
    assert [x.id for x in client.batches.list()] == [b.id]


def test_bad_requests_get_openai_errors(server):
    _, http = server
    client = _client(http)
    with pytest.raises(openai.APIStatusError) as big:
        client.files.create(file=("big.jsonl", _jsonl([_line("x" * 2000), _line("y" * 2000), _line("z")])),
                            purpose="batch")
    assert big.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("in.jsonl", _jsonl([_line("a")])), purpose="fine-tune")
    dup = client.files.create(file=("d.jsonl", _jsonl([_line("same"), _line("same")])), purpose="batch").id
    with pytest.raises(openai.BadRequestError, match="'same' is duplicated"):
        client.batches.create(input_file_id=dup, endpoint="/v1/chat/completions", completion_window="24h")
    other = client.files.create(file=("m.jsonl", _jsonl([_line("a", model="gpt-9")])), purpose="batch").id
    with pytest.raises(openai.BadRequestError, match="gpt-9"):
        client.batches.create(input_file_id=other, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="not a file of yours"):
        _client(http, "b").batches.create(input_file_id=dup, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        _client(http, "b").files.content(dup)
    r = http.post("/v1/files", content=b"not multipart", headers={"Authorization": "Bearer sk-a"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/batches", json={}).status_code == 401
