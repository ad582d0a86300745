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


OTHER_DRIVER = """
import sys
from cluster.local import deploy
from kvserve.config import KVServeConfig
cfg = KVServeConfig.model_validate_json(open(sys.argv[1]).read())
deploy(cfg, address=sys.argv[2], cache_epoch="another-driver", timeout_s=600)
"""


def test_a_deploy_from_another_process_keeps_the_engines(cluster, tmp_path):
    """`kvserve bench` is a second Ray driver: its deploy must carry the same job env as the one that
    started the cluster, or Serve sees new actor options and restarts every engine, one by one."""
    import subprocess
    import sys

    import ray

    from bench.cluster_check import verify

    engines = sorted(s["replica_id"] for s in cluster.stats())
    cfg_file = tmp_path / "cluster.json"
    cfg_file.write_text(cluster.cfg.model_dump_json())
    subprocess.run([sys.executable, "-c", OTHER_DRIVER, str(cfg_file), ray.get_runtime_context().gcs_address],
                   check=True, timeout=900)
    served = asyncio.run(verify(cluster.url, None, 2, ready_timeout_s=300, settle_s=60, cache_epoch="another-driver"))
    assert served == engines
