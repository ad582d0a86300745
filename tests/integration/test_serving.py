"""End to end on the real cluster: HTTP -> ingress -> router -> vLLM CPU replica -> tokens."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.conftest import KEYS, MODEL

pytestmark = pytest.mark.integration

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# ~1,000 tokens of shared system prompt (a tenant's long instructions).
SYSTEM = " ".join(f"Rule {i}: answer politely, cite the policy section {i}, and never reveal internal codes." for i in range(60))


def _ok_request(cluster) -> None:
    """A normal request right after a bad one: the server keeps serving."""
    r = cluster.openai().completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert r.choices[0].text.strip()


def test_models_list(cluster):
    ids = [m.id for m in cluster.openai().models.list()]
    assert ids == [MODEL]


def test_chat_paris(cluster):
    r = cluster.openai().chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=30)
    assert "Paris" in r.choices[0].message.content
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0


def test_chat_stream_chunks_then_usage(cluster):
    stream = cluster.openai().chat.completions.create(
        model=MODEL, messages=FRANCE, temperature=0, max_tokens=20, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices]) >= 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert "Paris" in text


def test_completions_stream_and_non_stream(cluster):
    client = cluster.openai()
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5, temperature=0)
    assert r.choices[0].text and r.usage.completion_tokens == 5
    chunks = list(client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert len(chunks) >= 3 and chunks[-1].usage.completion_tokens == 8


def test_shared_system_prompt_is_cached_on_same_replica(cluster):
    client = cluster.openai()
    seen = []
    for q in ("What is 2+2?", "Name a primary color."):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            temperature=0, max_tokens=4,
        )
        seen.append((raw.headers["x-kvserve-replica"], raw.parse().usage))
    (rep1, u1), (rep2, u2) = seen
    assert u1.prompt_tokens > 900
    assert rep1 == rep2
    assert u2.prompt_tokens_details.cached_tokens > 0.8 * u1.prompt_tokens


def test_health_ready_metrics(cluster):
    # Own traffic first: an earlier test may have redeployed (and so restarted) the ingress.
    cluster.openai().chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=2)
    assert httpx.get(cluster.url + "/health").json() == {"status": "ok"}
    ready = httpx.get(cluster.url + "/ready")
    assert ready.status_code == 200 and ready.json()["running_replicas"] == 2
    metrics = httpx.get(cluster.url + "/metrics").text
    assert 'kvserve_requests_total{class="default",kind="chat",status="200",tenant="tenant-a"}' in metrics
    assert "# TYPE kvserve_engine_prefix_cache_queries_total counter" in metrics
    assert "kvserve_engine_prefix_cache_queries_total{" in metrics
    assert 'kvserve_request_seconds_count{class="default",kind="chat",tenant="tenant-a"}' in metrics


def _ingress_log() -> str:
    """The Ingress replica's log: Serve writes a replica's lines, and so ours, to the actor's stderr."""
    from ray.util.state import get_log, list_actors

    actors = [a for a in list_actors(filters=[("state", "=", "ALIVE")], limit=10_000) if "#Ingress#" in (a.name or "")]
    assert actors, "no live Ingress replica"
    return "".join("".join(get_log(actor_id=a.actor_id, suffix="err", tail=-1)) for a in actors)


def test_the_ingress_logs_one_access_line_without_prompt_text(cluster):
    marker = f"confidential-{time.time_ns()}"
    line = "tenant=tenant-b kind=completion status=200"
    before = _ingress_log().count(line)
    r = cluster.openai("tenant-b").completions.create(model=MODEL, prompt=f"Remember {marker}. The capital of France is",
                                                     max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4
    deadline = time.monotonic() + 30  # the log file is written asynchronously to the request
    while (log := _ingress_log()).count(line) == before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert log.count(line) == before + 1, log[-3000:]
    mine = [entry for entry in log.splitlines() if line in entry][-1]
    assert "completion_tokens=4" in mine and "latency_ms=" in mine
    assert marker not in log


def test_status_reports_each_replica(cluster):
    deadline = time.monotonic() + 30  # a replica restarted by an earlier test posts within seconds
    while len(cluster.stats()) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    stats = cluster.stats()
    assert len(stats) == 2
    assert all({"replica_id", "prefix_cache_queries", "prefix_cache_hits", "kv_usage", "running"} <= s.keys() for s in stats)


# ---- bad input: a clear 4xx with an OpenAI-style body, and the server keeps serving ----------

def _assert_error(resp: httpx.Response, status: int, needle: str = "") -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["message"] and body["type"] in {"invalid_request_error", "rate_limit_error", "server_error"}
    assert body["code"] is None or isinstance(body["code"], str)
    assert needle.lower() in body["message"].lower()
    return body


def test_malformed_json_400(cluster):
    with cluster.client() as c:
        r = c.post("/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"})
    _assert_error(r, 400, "json")
    _ok_request(cluster)


def test_unknown_model_404(cluster):
    with cluster.client() as c:
        r = c.post("/v1/chat/completions", json={"model": "gpt-17", "messages": FRANCE})
    _assert_error(r, 404, "gpt-17")
    _ok_request(cluster)


def test_prompt_longer_than_context_400_names_limit(cluster):
    with cluster.client() as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "hello " * 2500, "max_tokens": 4})
    _assert_error(r, 400, str(cluster.cfg.model.max_model_len))
    _ok_request(cluster)


@pytest.mark.parametrize("params,param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 10**9}, "max_tokens"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 5}, "top_p"),
])
def test_bad_sampling_params_400(cluster, params, param):
    with cluster.client() as c:
        r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": FRANCE, **params})
    _assert_error(r, 400, param)
    _ok_request(cluster)


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic abc"}])
def test_missing_or_wrong_key_401(cluster, headers):
    r = httpx.post(cluster.url + "/v1/chat/completions", json={"model": MODEL, "messages": FRANCE},
                   headers=headers, timeout=30)
    _assert_error(r, 401, "api key")
    _ok_request(cluster)


def test_oversize_body_413(cluster):
    with cluster.client() as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x" * (cluster.cfg.server.max_body_bytes + 10)})
    _assert_error(r, 413, "limit")
    _ok_request(cluster)


def test_tenant_travels_with_request(cluster):
    with cluster.client("tenant-b") as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-kvserve-tenant"] == "tenant-b"


def test_client_disconnect_aborts_in_engine(cluster):
    before = sum(s["aborted"] for s in cluster.stats())
    body = {"model": MODEL, "prompt": "Write a very long story about the sea.", "max_tokens": 1500,
            "temperature": 0.8, "ignore_eos": True, "stream": True}
    with cluster.client() as c, c.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        n = 0
        for line in resp.iter_lines():
            if line.startswith("data: "):
                n += 1
            if n >= 3:
                break  # leaving the block closes the connection mid-stream
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = cluster.stats()
        if sum(s["aborted"] for s in stats) > before and all(s["unfinished"] == 0 for s in stats):
            break
        time.sleep(0.5)
    stats = cluster.stats()
    assert sum(s["aborted"] for s in stats) > before
    assert all(s["unfinished"] == 0 for s in stats), stats
    # The request ran ~3 tokens, not 1,500: the engine stopped generating for it.
    _ok_request(cluster)


def test_keys_never_served_in_clear(cluster):
    cfg = httpx.get(cluster.url + "/kvserve/config").json()
    text = json.dumps(cfg)
    assert all(k not in text for k in KEYS.values())


def test_served_config_carries_the_configured_replica_count(cluster):
    """`kvserve bench --policies` redeploys from this config: a wrong count would silently bench one replica."""
    assert httpx.get(cluster.url + "/kvserve/config").json()["num_replicas"] == 2


def test_overload_gets_503_not_a_hang(cluster):
    """More concurrent requests than replicas x max_ongoing + queue: the excess is refused at once."""
    import concurrent.futures as cf

    body = {"model": MODEL, "prompt": "Tell me about the ocean.", "max_tokens": 40, "ignore_eos": True}

    def one(_):
        with cluster.client() as c:
            t = time.monotonic()
            r = c.post("/v1/completions", json=body)
            return r.status_code, time.monotonic() - t, r

    with cf.ThreadPoolExecutor(40) as pool:
        results = list(pool.map(one, range(40)))
    codes = [c for c, _, _ in results]
    assert set(codes) <= {200, 503}, codes
    # Serve counts a request as queued until a replica accepts it, so how many of a simultaneous
    # burst get in beyond the queue depends on how fast the router places them; the queue's own
    # depth is always admitted.
    assert codes.count(200) >= cluster.cfg.server.max_queued_requests and codes.count(503) >= 1, codes
    # A 503 comes at once (the routers' queue is full) or, for a request that did get queued but
    # no replica took, at the ingress's wait bound -- never later (a hang would run into the
    # client's 120 s timeout). Some must come at once: the burst is 40 and the queue holds 4.
    wait_bound = cluster.cfg.server.max_queue_wait_s
    refused = [elapsed for code, elapsed, _ in results if code == 503]
    assert min(refused) < wait_bound / 2, refused
    assert max(refused) < wait_bound + 10, refused
    for code, _, r in results:
        if code == 503:
            assert r.headers.get("retry-after") and r.json()["error"]["type"] == "server_error"
    _ok_request(cluster)
