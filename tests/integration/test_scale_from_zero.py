"""Scale to zero with hold: with `autoscaling.min_replicas: 0` and no replica running, the first requests
wait at the ingress while Serve starts a replica, and get real answers, not 5xx; the cold start's time to
first token is exported (`kvserve_cold_start_ttft_seconds`)."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.integration.conftest import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _metric(url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_first_requests_wait_for_the_cold_start_and_get_real_answers(cluster):
    from cluster.local import deploy

    cfg = cluster.cfg.model_copy(deep=True)
    cfg.autoscaling = cfg.autoscaling.model_validate({
        "enabled": True, "policy": "kvserve", "min_replicas": 0, "max_replicas": 1, "initial_replicas": 0,
        "downscale_delay_s": 600, "profile": "kvserve/profiles/cpu-smollm2-135m-2026-12-03.json"})
    # The overload bound is shorter than any engine start here: only the cold-start bound lets them through.
    cfg.server.max_queue_wait_s = 5.0
    cfg.server.cold_start_wait_s = 600.0
    try:
        deploy(cfg, address=None, timeout_s=600)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and cluster.stats():
            time.sleep(1)  # the old replicas drain away
        ready = httpx.get(cluster.url + "/ready", timeout=30)
        assert ready.status_code == 200 and ready.json()["running_replicas"] == 0, ready.text
        assert _metric(cluster.url, "kvserve_cold_start_ttft_seconds_count") == 0

        def ask(i: int) -> tuple[int, float, dict]:
            with cluster.client() as c:
                c.timeout = httpx.Timeout(700)
                t = time.monotonic()
                r = c.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 8, "temperature": 0,
                                                         "messages": [{"role": "user", "content": f"Say hello {i}."}]})
                return r.status_code, time.monotonic() - t, r.json()

        with cf.ThreadPoolExecutor(3) as pool:
            results = list(pool.map(ask, range(3)))
        for status, _, body in results:
            assert status == 200, body
            assert body["choices"][0]["message"]["content"].strip(), body
        waited = [s for _, s, _ in results]
        held = _metric(cluster.url, "kvserve_cold_start_ttft_seconds_count")
        last = _metric(cluster.url, "kvserve_cold_start_last_ttft_seconds")
        print(f"\ncold start: client-side latency {min(waited):.1f}-{max(waited):.1f} s; ingress: {held:.0f} held "
              f"requests, last time to first token {last:.1f} s")
        assert min(waited) > cfg.server.max_queue_wait_s  # they really waited for the engine's start
        assert held == 3 and last is not None and cfg.server.max_queue_wait_s < last <= max(waited) + 1
        assert httpx.get(cluster.url + "/ready", timeout=30).json()["running_replicas"] == 1
    finally:
        deploy(cluster.cfg, address=None, timeout_s=900)  # back to the session's two replicas
