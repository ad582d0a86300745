"""One real local Ray cluster with 2 real vLLM CPU replicas for the whole test session."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import httpx
import pytest

from kvserve.config import KVServeConfig, load_config

KEYS = {"tenant-a": "sk-test-tenant-a", "tenant-b": "sk-test-tenant-b",
        # Tenants whose class has one small limit each (tests/integration/test_tenant_limits_live.py).
        "tenant-rpm": "sk-test-tenant-rpm", "tenant-tpm": "sk-test-tenant-tpm", "tenant-conc": "sk-test-tenant-conc"}
LIMITED = {"tenant-rpm": {"requests_per_min": 3}, "tenant-tpm": {"tokens_per_min": 600},
           "tenant-conc": {"max_concurrent": 1}}
MODEL = "smollm2-135m-instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LiveCluster:
    cfg: KVServeConfig
    url: str  # http://127.0.0.1:PORT

    def client(self, tenant: str = "tenant-a", **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {KEYS[tenant]}"}, timeout=120, **kw)

    def openai(self, tenant: str = "tenant-a"):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)

    def stats(self) -> list[dict]:
        return httpx.get(self.url + "/kvserve/stats", timeout=30).json()["replicas"]


def test_config(port: int) -> KVServeConfig:
    from deployments.auth import hash_key

    return load_config(overrides={
        "num_replicas": 2,
        # Tool calling as a deployment would enable it (tests/integration/test_openai_fidelity.py).
        "engine": {"max_num_seqs": 16, "tool_call_parser": "hermes", "enable_auto_tool_choice": True,
                   "chat_template": "chatml-tools"},
        # Small queues so the overload test can fill them with a few dozen requests.
        "server": {"port": port, "max_body_bytes": 262_144, "max_ongoing_requests": 4, "max_queued_requests": 4},
        "router": {"policy": "kvserve"},
        "tenants": {"open_mode": False,
                    "keys": [{"tenant": t, "key_sha256": hash_key(k), "class": t if t in LIMITED else "default"}
                             for t, k in KEYS.items()],
                    "classes": LIMITED},
    }, environ={})


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> LiveCluster:
    from cluster.local import base_url, deploy, shutdown, start_cluster
    from kvserve.model import prepare_model

    prepare_model()  # offline, idempotent
    os.environ.setdefault("KVSERVE_LOG_TO_DRIVER", "0")
    cfg = test_config(_free_port())
    cfg.batch.db_path = str(tmp_path_factory.mktemp("batch") / "batch.sqlite")  # this session's batches only
    cfg.batch.max_file_bytes = 1_048_576  # small enough to send one larger file (413)
    started = start_cluster(cfg, join_existing=False)
    try:
        deploy(cfg, address=None, timeout_s=900)
        yield LiveCluster(cfg, base_url(cfg))
    finally:
        shutdown(started)
