"""schemathesis against the served OpenAPI schema (vLLM's own request models): valid and invalid
bodies for the OpenAI routes, fixed seed, bounded cases. No 5xx, no hang, and the server still
serves afterwards."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.integration.conftest import KEYS, MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OPERATIONS = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/tokenize"),
              ("GET", "/v1/models")]
CASES = 15  # per operation and mode
HANG_S = 120.0  # a request that takes longer counts as a hang
TOKENS_CAP = 16  # generation length is not what this test explores: keep valid requests short on CPU


def _short(body):  # type: ignore[no-untyped-def]
    """Cap generation lengths the generator picked (a valid 4,096-token answer takes minutes on CPU)."""
    if isinstance(body, dict):
        lengths = [k for k in ("max_tokens", "max_completion_tokens")
                   if isinstance(body.get(k), int) and not isinstance(body[k], bool)]
        for key in lengths:
            body[key] = min(body[key], TOKENS_CAP)
        if not lengths and "model" in body:  # unset: vLLM generates up to the context's end
            body["max_tokens"] = TOKENS_CAP
        if isinstance(body.get("n"), int) and not isinstance(body["n"], bool) and body["n"] > 2:
            body["n"] = 2
    return body


@pytest.mark.timeout(3600)
def test_no_5xx_and_no_hang_on_fuzzed_openai_requests(cluster):
    import schemathesis
    from schemathesis import GenerationMode

    auth = {"Authorization": f"Bearer {KEYS['tenant-a']}"}
    raw = httpx.get(cluster.url + "/openapi.json", timeout=60)
    assert raw.status_code == 200, raw.text
    spec = raw.json()
    assert "ChatCompletionRequest" in spec["components"]["schemas"]  # vLLM's model, not an empty body
    schema = schemathesis.openapi.from_dict(spec)
    failures: list[str] = []
    counts: dict[int, int] = {}
    client = httpx.Client(timeout=HANG_S)
    for method, path in OPERATIONS:
        op = schema[path][method]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @seed(25)
            @settings(max_examples=CASES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy(generation_mode=mode))
            def run(case):  # type: ignore[no-untyped-def]
                case.body = _short(case.body)
                kw = case.as_transport_kwargs(base_url=cluster.url, headers=auth)
                body = {"json": kw["json"]} if "json" in kw else {"content": kw.get("data")}
                try:  # httpx, not schemathesis's requests transport (which urllib3-future breaks here)
                    resp = client.request(kw["method"], kw["url"], headers=kw.get("headers"),
                                          params=kw.get("params") or None, **body)
                except httpx.TimeoutException:
                    failures.append(f"HANG {method} {path} ({mode}): {str(case.body)[:300]}")
                    return
                counts[resp.status_code] = counts.get(resp.status_code, 0) + 1
                if resp.status_code >= 500:
                    failures.append(f"{resp.status_code} {method} {path} ({mode}): {resp.text[:300]} <- "
                                    f"{str(case.body)[:300]}")

            run()
    assert not failures, "\n".join(failures)
    assert sum(counts.values()) >= len(OPERATIONS) * CASES, counts  # the fuzzer really sent them
    assert any(200 <= s < 300 for s in counts) and any(400 <= s < 500 for s in counts), counts
    with cluster.client() as c:  # and the server still serves
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 4})
        assert r.status_code == 200, r.text
