"""`kvserve bench --policies` on a real cluster: a new policy keeps the engines (a GPU engine takes
minutes to start) but starts on empty prefix caches, so no policy inherits another's cache."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.integration.conftest import MODEL

pytestmark = pytest.mark.integration

PROMPT = "You are the policy-switch test's assistant. " + "Answer briefly and cite the manual. " * 40 + "Hello?"


def _ask(cluster) -> int:
    """One completion of PROMPT; the prompt tokens the engine found cached for it (vLLM's usage)."""
    with cluster.client() as c:
        r = c.post("/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    return (r.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def test_a_new_policy_keeps_the_engines_and_starts_on_empty_caches(cluster):
    from bench.cluster_check import verify
    from bench.runner import default_deploy
    from cluster.local import deploy

    _ask(cluster)
    assert _ask(cluster) > 0  # the prompt is cached now
    engines = sorted(s["replica_id"] for s in cluster.stats())
    pow2 = cluster.cfg.model_copy(deep=True)
    pow2.router.policy = "pow2"
    try:
        epoch = default_deploy(None)(pow2)
        served = asyncio.run(verify(cluster.url, None, 2, ready_timeout_s=300, settle_s=60, cache_epoch=epoch))
        assert served == engines  # the same replicas: no engine restarted
        assert httpx.get(cluster.url + "/kvserve/config", timeout=30).json()["router"]["policy"] == "pow2"
        deadline = time.monotonic() + 30  # vLLM's AllBlocksCleared reaches each replica's block index
        while any(s["cached_blocks"] for s in cluster.stats()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert [s["cached_blocks"] for s in cluster.stats()] == [0, 0]
        assert _ask(cluster) == 0  # the engines' caches were emptied
    finally:
        deploy(cluster.cfg, address=None, timeout_s=900)  # back to the session's policy
    assert httpx.get(cluster.url + "/kvserve/config", timeout=30).json()["router"]["policy"] == "kvserve"
