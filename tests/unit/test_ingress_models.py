"""`/v1/models` lists the model once a replica of it serves, before every replica does (`/ready`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

import deployments.serve_state
from deployments.auth import TenantAuth
from deployments.ingress import Ingress
from deployments.serve_state import DeploymentState
from kvserve.config import KVServeConfig


def _models(state: DeploymentState, monkeypatch) -> dict:
    cfg = KVServeConfig.model_validate({"tenants": {"open_mode": True}})

    async def deployment_state(app_name: str) -> DeploymentState:
        return state

    monkeypatch.setattr(deployments.serve_state, "deployment_state", deployment_state)
    ing = SimpleNamespace(cfg=cfg, auth=TenantAuth(cfg.tenants))
    return asyncio.run(Ingress.models(ing, SimpleNamespace(headers={})))


@pytest.mark.parametrize("state, listed", [
    (DeploymentState("UPDATING", 2, 0), False),  # engines still starting
    (DeploymentState("UPSCALING", 2, 1), True),  # one serves: not /ready yet, but it answers
    (DeploymentState("HEALTHY", 2, 2), True),
])
def test_the_model_is_listed_once_a_replica_serves(state, listed, monkeypatch):
    body = _models(state, monkeypatch)
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == (["smollm2-135m-instruct"] if listed else [])
    assert state.ready == (state.running_replicas == 2)
