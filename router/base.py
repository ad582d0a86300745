"""The contract every routing policy implements, live and in the simulator.

A policy sees replicas only through `ReplicaLoad` snapshots and requests only
through `RouteRequest`; adapters (Ray Serve's RequestRouter, the simulator)
translate their world into these and call the same methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from kvserve.policy_params import RouterParams


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's live load, as the router knows it at decision time."""

    replica_id: str
    ongoing: int = 0  # requests routed there and not finished (router's own count)
    waiting: int = 0  # requests queued in the engine (from the replica's stats)
    running: int = 0  # sequences in the engine's running batch
    queued_prefill_tokens: int = 0  # prompt tokens admitted but not yet prefilled
    kv_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    kv_capacity_tokens: int = 0  # the replica's whole KV cache in tokens (0: unknown)
    draining: bool = False  # chosen for removal: must get no new requests


@dataclass
class RouteRequest:
    request_id: str
    block_hashes: Sequence[int]  # chained hashes of the prompt's full blocks (router.block_hash)
    num_prompt_tokens: int
    tenant: str = "default"
    token_ids: Sequence[int] | None = None  # for approximate (token-tree) baselines
    text: str | None = None  # for character-level baselines
    expected_output_tokens: int = 0
    extra: dict = field(default_factory=dict)


class RoutingPolicy(ABC):
    """Ranks candidate replicas for a request. Pure: no Ray, no I/O, no clocks of its own."""

    name: ClassVar[str]
    # True: `rank` also takes a mapping replica id -> load and reads only the replicas it
    # scores, so a caller that keeps such a mapping (the simulator) need not list every replica.
    takes_load_map: ClassVar[bool] = False

    @classmethod
    def create(cls, params: RouterParams, seed: int) -> RoutingPolicy:
        """The registry's constructor (router.registry.make_policy); a policy takes what it needs."""
        return cls()

    @abstractmethod
    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        """Replica ids, best first. `replicas` is non-empty and holds no draining replica.

        Every replica, or for a policy that scores a bounded candidate set (kvserve, at scale:
        `router.candidates`) those candidates; the caller falls back to load alone past them.
        """

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        """The request was sent to `replica_id` (policies may record a speculative cache entry)."""

    def on_finished(self, request: RouteRequest, replica_id: str, now: float) -> None:
        """The request completed (or failed) on `replica_id`."""

    def on_cache_snapshot(self, replica_id: str, block_hashes: Iterable[int], now: float) -> None:
        """Authoritative full set of blocks cached on `replica_id` (from engine KV events)."""

    def on_cache_events(self, replica_id: str, stored: Iterable[int], removed: Iterable[int], now: float) -> None:
        """Incremental engine KV events: blocks stored on / evicted from `replica_id`."""

    def on_replica_gone(self, replica_id: str) -> None:
        """The replica died, was removed or went silent: forget everything about it."""
