"""The one table of policy names: for each router and autoscaler, what runs live and what the simulator runs.

Entries name implementations by import path ("module:attr"), because they sit in three layers:
the pure policies (`router/`, `autoscaling/`), the Ray Serve adapters (`deployments/`) and Ray's own
classes. The config's allowed names (`kvserve.config`), the Serve app (`deployments.app`) and the
simulator (`router.registry`, `autoscaling.registry`) all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Origin = Literal["kvserve", "ray"]


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    sim: str  # the pure policy class the simulator runs
    live: str | None  # what Ray Serve runs; None: a simulator-only baseline
    live_origin: Origin = "kvserve"  # "ray": live is Ray's own class; `sim` is our re-implementation of it
    doc: str = ""

    @property
    def shared(self) -> bool:
        """Live runs the very policy the simulator runs (inside our Serve adapter)."""
        return self.live in (KVSERVE_REQUEST_ROUTER, KVSERVE_AUTOSCALING_POLICY)


# Our Serve adapters: each runs the entry's `sim` policy object live.
KVSERVE_REQUEST_ROUTER = "deployments.request_router:KVServeRequestRouter"
KVSERVE_AUTOSCALING_POLICY = "deployments.autoscaling_policy:SLOAutoscalingPolicy"

ROUTERS: dict[str, PolicyEntry] = {e.name: e for e in (
    PolicyEntry("round_robin", "router.policies.round_robin:RoundRobinPolicy", KVSERVE_REQUEST_ROUTER),
    PolicyEntry("pow2", "router.policies.pow2:PowerOfTwoPolicy",
                "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter", "ray",
                doc="Serve's default router (power of two choices on queue length)"),
    # Ray's real prefix-aware router, unmodified (loaded without ray.serve.llm's vLLM imports).
    PolicyEntry("ray_prefix", "router.policies.ray_prefix_sim:RayPrefixSimPolicy",
                "deployments.ray_prefix_router:PrefixCacheAffinityRouter", "ray",
                doc="Ray's PrefixCacheAffinityRouter"),
    PolicyEntry("kvserve", "router.policies.kvserve:PrefixCostRouter", KVSERVE_REQUEST_ROUTER,
                doc="prefix index + predicted-TTFT cost (ours)"),
    PolicyEntry("approx_tree", "router.policies.approx_tree:ApproxTreePolicy", None,
                doc="SGLang's approximate radix-tree router (simulator baseline)"),
)}

AUTOSCALERS: dict[str, PolicyEntry] = {e.name: e for e in (
    PolicyEntry("kvserve", "autoscaling.policies.kvserve:SLOAutoscaler", KVSERVE_AUTOSCALING_POLICY,
                doc="SLO error + capacity model (ours)"),
    # Live: no custom policy, so Serve's built-in queue-length rule runs (with our delays).
    PolicyEntry("serve_default", "autoscaling.policies.serve_default:ServeDefaultPolicy",
                "ray.serve.autoscaling_policy:replica_queue_length_autoscaling_policy", "ray",
                doc="Serve's built-in rule"),
    PolicyEntry("fixed_max", "autoscaling.policies.fixed_max:FixedMaxPolicy", None,
                doc="always max_replicas: the cost ceiling (simulator baseline)"),
)}


def live_names(table: dict[str, PolicyEntry]) -> tuple[str, ...]:
    """Names the live cluster can run: the values the config accepts."""
    return tuple(name for name, e in table.items() if e.live is not None)


def sim_names(table: dict[str, PolicyEntry]) -> list[str]:
    return sorted(table)
