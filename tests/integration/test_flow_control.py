"""Flow control on a real cluster (1 vLLM CPU replica, one slot): a flooding tenant waits in the fair
queue, a victim arriving behind it goes first, and the flood past its queue bound gets 503 + Retry-After."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.integration.conftest import KEYS, MODEL

pytestmark = pytest.mark.integration

ROLES = {"flood": "tenant-a", "victim": "tenant-b"}  # two of the session's tenants, both in class `default`
QUEUE_BOUND = 3


@pytest.fixture(scope="module")
def flow_cluster(cluster):
    """The session's cluster redeployed with 1 replica, one slot and flow control on; restored after."""
    from cluster.local import deploy

    cfg = cluster.cfg.model_copy(deep=True)
    cfg.num_replicas = 1
    cfg.flow = cfg.flow.model_validate({"enabled": True, "slots_per_replica": 1, "max_queued_per_tenant": QUEUE_BOUND})
    try:
        deploy(cfg, address=None, timeout_s=900)
        yield cluster.url
    finally:
        deploy(cluster.cfg, address=None, timeout_s=900)  # back to the session's config


def _ask(url: str, tenant: str, done: list, lock: threading.Lock, n: int = 0) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Write a long story about ship {n}."}],
            "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEYS[ROLES[tenant]]}"},
                   timeout=300)
    with lock:
        done.append((tenant, n, r.status_code, time.monotonic()))
    return r


def test_a_victim_goes_before_a_queued_flood_and_the_flood_gets_the_503s(flow_cluster: str) -> None:
    done: list = []
    lock = threading.Lock()
    first_503 = threading.Event()
    with ThreadPoolExecutor(8) as pool:
        def flood(i: int) -> httpx.Response:
            r = _ask(flow_cluster, "flood", done, lock, i)
            if r.status_code == 503:
                first_503.set()
            return r

        # One slot: one flood request runs, QUEUE_BOUND wait, the rest are turned away at once.
        floods = [pool.submit(flood, i) for i in range(QUEUE_BOUND + 2)]
        assert first_503.wait(120), "the flood past its queue bound was not turned away"
        victim = pool.submit(_ask, flow_cluster, "victim", done, lock, 99)
        responses = [f.result() for f in floods]
        v = victim.result()

    assert v.status_code == 200, v.text
    assert v.json()["choices"][0]["message"]["content"]
    rejected = [r for r in responses if r.status_code == 503]
    assert len(rejected) == 1, [r.status_code for r in responses]
    r = rejected[0]
    assert int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["type"] == "server_error" and "queued" in r.json()["error"]["message"]
    served = [d for d in done if d[2] == 200]
    order = [d[0] for d in sorted(served, key=lambda d: d[3])]
    assert len(order) == QUEUE_BOUND + 2  # every flood request that was queued was served, and the victim
    # The flood request already running finishes first; the victim, queued behind all of the flood's
    # queued requests, is dispatched next.
    assert order[:2] == ["flood", "victim"], order
