"""Per-tenant limits on the live cluster: 429 with Retry-After and OpenAI's x-ratelimit-* headers.

Each limited tenant (tests/integration/conftest.py LIMITED) has one small limit, held by the
cluster's LimitBoard actor; each test uses its own tenant, so the order of tests does not matter.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.integration.conftest import KEYS, LIMITED, MODEL

pytestmark = pytest.mark.integration

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


def _chat(cluster, tenant: str, **kw) -> httpx.Response:
    with cluster.client(tenant) as c:
        return c.post("/v1/chat/completions", json={"model": MODEL, "messages": FRANCE, "temperature": 0,
                                                    "max_tokens": 8, **kw})


def _stream(cluster, tenant: str, **kw) -> tuple[httpx.Headers, str]:
    with cluster.client(tenant) as c, c.stream("POST", "/v1/chat/completions", json={
            "model": MODEL, "messages": FRANCE, "temperature": 0, "max_tokens": 8, "stream": True, **kw}) as r:
        assert r.status_code == 200
        return r.headers, r.read().decode()


def test_requests_per_min_429_with_retry_after_and_headers_on_every_answer(cluster):
    tenant, rpm = "tenant-rpm", LIMITED["tenant-rpm"]["requests_per_min"]
    first = _chat(cluster, tenant)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == str(rpm)
    assert first.headers["x-ratelimit-remaining-requests"] == str(rpm - 1)
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    headers, text = _stream(cluster, tenant)  # streams carry them too
    assert headers["x-ratelimit-remaining-requests"] == str(rpm - 2) and "[DONE]" in text
    assert '"usage"' not in text  # the engine's usage chunk (settling) is not shown unless asked
    assert _chat(cluster, tenant).headers["x-ratelimit-remaining-requests"] == "0"
    t0 = time.monotonic()
    refused = _chat(cluster, tenant)
    assert refused.status_code == 429
    err = refused.json()["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "rate_limit_exceeded"
    assert "requests per min (RPM): limit 3" in err["message"]
    retry = int(refused.headers["retry-after"])
    # One request comes back every 20 s; three went in within the last few seconds.
    assert 1 <= retry <= 20 and int(refused.headers["retry-after-ms"]) <= retry * 1000
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # The official client sees its usual exception.
    with pytest.raises(openai.RateLimitError):
        cluster.openai(tenant).chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=2)
    # Retry-After is right within 1 s: just before it still refused, at it admitted.
    if retry > 2:
        time.sleep(max(retry - 1.5 - (time.monotonic() - t0), 0))
        assert _chat(cluster, tenant).status_code == 429
    time.sleep(max(retry - (time.monotonic() - t0), 0))
    assert _chat(cluster, tenant).status_code == 200
    metrics = httpx.get(cluster.url + "/metrics").text
    assert 'kvserve_requests_total{class="tenant-rpm",kind="chat",status="429",tenant="tenant-rpm"}' in metrics


def test_tokens_are_reserved_then_settled_with_real_usage(cluster):
    tenant, tpm = "tenant-tpm", LIMITED["tenant-tpm"]["tokens_per_min"]
    first = _chat(cluster, tenant, max_tokens=400)  # reserves prompt + 400; the answer is a few tokens
    assert first.status_code == 200, first.text
    usage = first.json()["usage"]
    assert usage["completion_tokens"] < 40
    remaining = int(first.headers["x-ratelimit-remaining-tokens"])
    assert remaining <= tpm - usage["prompt_tokens"] - 400 + 20  # the reservation, + a few seconds' refill
    # Settled with its usage: the 400 it did not use came back, so a second such request fits.
    second = _chat(cluster, tenant, max_tokens=400)
    assert second.status_code == 200, second.text
    after = int(second.headers["x-ratelimit-remaining-tokens"])
    used_first = usage["prompt_tokens"] + usage["completion_tokens"]
    assert abs(after - (tpm - used_first - usage["prompt_tokens"] - 400)) <= 30
    # A third cannot: prompt + 400 is more than what is left before the second settles.
    with cluster.client(tenant) as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "x " * 300, "max_tokens": 400})
    assert r.status_code == 429 and "tokens per min (TPM): limit 600" in r.json()["error"]["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 60
    assert r.headers["x-ratelimit-limit-tokens"] == str(tpm)


def test_max_concurrent_429_while_a_stream_runs(cluster):
    tenant = "tenant-conc"
    started, done = threading.Event(), threading.Event()
    status: list[int] = []

    def long_stream() -> None:
        with cluster.client(tenant) as c, c.stream("POST", "/v1/completions", json={
                "model": MODEL, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
            status.append(r.status_code)
            for _ in r.iter_lines():
                started.set()
        done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(120)
    r = _chat(cluster, tenant)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    assert "requests in flight: limit 1" in r.json()["error"]["message"]
    assert "x-ratelimit-limit-requests" not in r.headers  # no per-minute limits in this class
    t.join(300)
    assert done.is_set() and status == [200]
    # The slot comes back when the ingress has sent the stream's end (just after the client read it).
    deadline = time.monotonic() + 10
    while (code := _chat(cluster, tenant).status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert code == 200


def test_unlimited_tenants_get_no_ratelimit_headers(cluster):
    r = _chat(cluster, "tenant-a")
    assert r.status_code == 200 and not any(h.startswith("x-ratelimit") for h in r.headers)
    assert KEYS["tenant-a"] not in r.text
