"""What Serve's controller says about the engine deployment: its target replica count and how many serve.

The ingress is bound without the replica count (a resize must not restart it), so the count it
reports comes from here, never from which replicas happen to answer stats at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENGINE_DEPLOYMENT = "LLMReplica"


@dataclass(frozen=True)
class DeploymentState:
    status: str | None  # HEALTHY, UPDATING, UPSCALING, ... (None: not deployed)
    target_replicas: int  # Serve's target: the configured count, or the autoscaler's current decision
    running_replicas: int

    @property
    def ready(self) -> bool:
        """Every replica Serve wants is serving (a deployment still starting or resizing is not ready). A
        deployment scaled to zero (autoscaling.min_replicas 0) is ready: the ingress holds its requests."""
        return self.status == "HEALTHY" and self.running_replicas >= self.target_replicas

    def as_dict(self) -> dict[str, Any]:
        return {"status": "ready" if self.ready else "not ready", "deployment": self.status,
                "target_replicas": self.target_replicas, "running_replicas": self.running_replicas}


def parse_details(details: dict, app_name: str, deployment: str = ENGINE_DEPLOYMENT) -> DeploymentState:
    """Serve's instance details (the controller's JSON dict) -> the engine deployment's state."""
    dep = (((details.get("applications") or {}).get(app_name) or {}).get("deployments") or {}).get(deployment)
    if not dep:
        return DeploymentState(None, 0, 0)
    running = sum(1 for r in dep.get("replicas") or () if _name(r.get("state")) == "RUNNING")
    return DeploymentState(_name(dep.get("status")), int(dep.get("target_num_replicas") or 0), running)


def _name(value: Any) -> str:
    """Serve's enums (str subclasses whose str() is 'DeploymentStatus.HEALTHY') or plain strings -> 'HEALTHY'."""
    return str(getattr(value, "value", value))


async def deployment_state(app_name: str, deployment: str = ENGINE_DEPLOYMENT) -> DeploymentState:
    """Asks the controller without blocking the caller's event loop (`serve.status()` would)."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    details = await client._controller.get_serve_instance_details.remote()
    return parse_details(details, app_name, deployment)
