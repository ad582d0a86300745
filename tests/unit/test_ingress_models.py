"""`/v1/models` lists the model only once a replica of it serves (the ingress's `ready()`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from deployments.auth import TenantAuth
from deployments.ingress import Ingress
from kvserve.config import KVServeConfig


def _models(serving: bool) -> dict:
    cfg = KVServeConfig.model_validate({"tenants": {"open_mode": True}})

    async def ready():  # type: ignore[no-untyped-def]
        return serving, {}

    ing = SimpleNamespace(cfg=cfg, auth=TenantAuth(cfg.tenants), ready=ready)
    return asyncio.run(Ingress.models(ing, SimpleNamespace(headers={})))


@pytest.mark.parametrize("serving", [False, True])
def test_the_model_is_listed_once_a_replica_serves(serving):
    listed = _models(serving)
    assert listed["object"] == "list"
    assert [m["id"] for m in listed["data"]] == (["smollm2-135m-instruct"] if serving else [])
