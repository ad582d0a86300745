"""The OpenAI Batch API on the real cluster, through the official `openai` client: a 200-line batch
survives its ingress being killed mid-run (Serve starts a new one, which resumes from SQLite) and
answers every line exactly once; bad input gets its 4xx or its line's error record."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration
LINES = 200


def _line(cid: str, model: str = MODEL) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "temperature": 0, "max_tokens": 4,
                     "messages": [{"role": "user", "content": f"Say the number {cid}."}]}}


def _upload(client, lines: list) -> str:
    raw = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines).encode()
    return client.files.create(file=("in.jsonl", io.BytesIO(raw)), purpose="batch").id


def _kill_ingress() -> str:
    import ray
    from ray.util.state import list_actors

    alive = list_actors(filters=[("state", "=", "ALIVE")], limit=10_000)
    name = next(a.name for a in alive if a.name and "#Ingress#" in a.name)
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    return name


def _retrieve(client, bid: str):
    """The batch, retrying while the ingress is down (connection refused, 5xx from Serve's proxy)."""
    while True:
        try:
            return client.batches.retrieve(bid)
        except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError) as e:
            if getattr(e, "status_code", 500) < 500:
                raise
            time.sleep(1)


def test_a_batch_survives_its_ingress_being_killed_and_answers_each_line_once(cluster):
    client = cluster.openai()
    fid = _upload(client, [_line(f"n{i}") for i in range(LINES)])
    batch = client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"test": "restart"})
    assert batch.status == "in_progress" and batch.request_counts.total == LINES
    deadline = time.monotonic() + 1200
    while (b := _retrieve(client, batch.id)).request_counts.completed < 20:
        assert time.monotonic() < deadline and b.status == "in_progress", b
        time.sleep(0.5)
    killed = _kill_ingress()
    done_at_kill = b.request_counts.completed
    assert done_at_kill < LINES, "the batch finished before the kill: nothing was tested"
    while (b := _retrieve(client, batch.id)).status not in ("completed", "failed", "cancelled"):
        assert time.monotonic() < deadline, f"batch stuck after killing {killed}: {b}"
        time.sleep(1)
    assert b.status == "completed", b
    assert b.request_counts.completed == LINES and b.request_counts.failed == 0, b.request_counts
    assert b.error_file_id is None and b.metadata == {"test": "restart"}
    records = [json.loads(x) for x in client.files.content(b.output_file_id).content.splitlines()]
    ids = [r["custom_id"] for r in records]
    assert len(ids) == LINES and set(ids) == {f"n{i}" for i in range(LINES)}  # each line exactly once
    for r in records:
        assert r["response"]["status_code"] == 200 and r["error"] is None
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert body["usage"]["completion_tokens"] <= 4


def test_bad_batch_input(cluster):
    client = cluster.openai()
    # A malformed line and a line for another endpoint: their own error records; the rest run.
    fid = _upload(client, [_line("ok-1"), "{this is not json", {**_line("wrong-url"), "url": "/v1/completions"},
                           _line("ok-2")])
    bid = client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h").id
    deadline = time.monotonic() + 600
    while (b := client.batches.retrieve(bid)).status != "completed":
        assert time.monotonic() < deadline, b
        time.sleep(0.5)
    assert (b.request_counts.completed, b.request_counts.failed) == (2, 2)
    out = [json.loads(x)["custom_id"] for x in client.files.content(b.output_file_id).content.splitlines()]
    err = [json.loads(x) for x in client.files.content(b.error_file_id).content.splitlines()]
    assert sorted(out) == ["ok-1", "ok-2"]
    assert [(e["custom_id"], e["error"]["code"]) for e in err] == [(None, "invalid_json"), ("wrong-url", "invalid_url")]

    with pytest.raises(openai.BadRequestError, match="'dup'"):  # duplicate custom_id: 400 naming it
        client.batches.create(input_file_id=_upload(client, [_line("dup"), _line("dup")]),
                              endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="no-such-model"):  # unknown model: 400 at creation
        client.batches.create(input_file_id=_upload(client, [_line("x", model="no-such-model")]),
                              endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.APIStatusError) as big:  # over batch.max_file_bytes: 413
        _upload(client, [_line("y" * 1000)] * 1200)
    assert big.value.status_code == 413
    with pytest.raises(openai.NotFoundError):  # another tenant's batch does not exist for you
        cluster.openai("tenant-b").batches.retrieve(bid)
    cancelled = client.batches.cancel(client.batches.create(
        input_file_id=_upload(client, [_line(f"c{i}") for i in range(50)]), endpoint="/v1/chat/completions",
        completion_window="24h").id)
    assert cancelled.status in ("cancelling", "cancelled")
    while (c := client.batches.retrieve(cancelled.id)).status == "cancelling":
        assert time.monotonic() < deadline, c
        time.sleep(0.5)
    assert c.status == "cancelled" and c.request_counts.completed < 50
