"""Discrete-event cluster simulator (`kvserve sim`): replays traces or generated workloads on
N simulated vLLM replicas, routing and autoscaling through the same pure policy objects
as the live cluster (router.registry, autoscaling.registry), timed by a measured EngineProfile."""

from __future__ import annotations

from simulator.cluster import Cluster, RunResult, ScalingSetup
from simulator.engine import EngineSettings, Replica, SimRequest
from simulator.kv_blocks import KVCache
from simulator.workloads import SimWorkload, TenantMix, generated, load_trace

__all__ = [
    "Cluster", "EngineSettings", "KVCache", "Replica", "RunResult", "ScalingSetup",
    "SimRequest", "SimWorkload", "TenantMix", "generated", "load_trace",
]
