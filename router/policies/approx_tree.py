"""Baseline: SGLang's cache-aware router -- OUR RE-IMPLEMENTATION of its documented behaviour.

Not SGLang's code. Behaviour per the SGLang router docs/source (cache_aware policy):
- an approximate radix tree per replica ("tenant"), fed ONLY by routing
  history (the router inserts each prompt under the replica it chose; the
  engines' real evictions are never seen), each replica's share capped at
  `max_tree_size` units with LRU eviction of its least recently used leaves;
- if load is imbalanced -- (max - min) in-flight > `balance_abs` (64) AND
  max > `balance_rel` (1.5) x min -- route to the shortest queue;
- else, if the longest prefix match covers more than `cache_threshold` (0.3)
  of the prompt, route to a replica holding that match;
- else route to the replica with the smallest tree.

Units: the prompt's text if the request carries it (SGLang matches characters),
else its token ids, else its block hashes (the simulator's Mooncake trace has
only block ids). `HistoryRadixTree` is shared with the Ray baseline.

Where SGLang leaves a choice open we take the fair option: among several
holders of the best match, the least loaded; SGLang evicts on a timer, we evict
on insert down to 90% of the cap (same steady state, no clock).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Sequence

from router.base import ReplicaLoad, RouteRequest, RoutingPolicy

Units = str | tuple


def request_units(request: RouteRequest) -> Units:
    """The sequence a history tree indexes for `request`: text, else tokens, else block hashes."""
    if request.text is not None:
        return request.text
    if request.token_ids is not None:
        return tuple(request.token_ids)
    return tuple(request.block_hashes)


class _Node:
    __slots__ = ("key", "parent", "children", "owners")

    def __init__(self, key: Units, parent: _Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[object, _Node] = {}  # first unit of child's key -> child
        self.owners: dict[str, float] = {}  # replica -> last access time


class HistoryRadixTree:
    """Radix tree of routed prompts; each node records which replicas it was routed to.

    Ownership is prefix-closed: a replica owning a node owns all its ancestors.
    `size(replica)` counts the units of every node it owns.
    """

    def __init__(self) -> None:
        self.root = _Node((), None)
        self._size: dict[str, int] = {}

    def size(self, replica_id: str) -> int:
        return self._size.get(replica_id, 0)

    def sizes(self) -> dict[str, int]:
        return dict(self._size)

    def add_replica(self, replica_id: str) -> None:
        self._size.setdefault(replica_id, 0)

    def insert(self, units: Units, replica_id: str, now: float) -> None:
        self._size.setdefault(replica_id, 0)
        node, i = self.root, 0
        while i < len(units):
            child = node.children.get(units[i])
            if child is None:
                child = _Node(units[i:], node)
                node.children[units[i]] = child
            else:
                shared = len(os.path.commonprefix([child.key, units[i:]]))
                if shared < len(child.key):
                    child = self._split(child, shared)
            if replica_id not in child.owners:
                self._size[replica_id] += len(child.key)
            child.owners[replica_id] = now
            i += len(child.key)
            node = child

    def match(self, units: Units, allowed: set[str]) -> tuple[int, dict[str, float]]:
        """(matched units, {holder: last access}) of the longest prefix held by any `allowed` replica."""
        node, i = self.root, 0
        holders: dict[str, float] = {}
        while i < len(units):
            child = node.children.get(units[i])
            if child is None:
                break
            owners = {r: t for r, t in child.owners.items() if r in allowed}
            if not owners:
                break
            shared = len(os.path.commonprefix([child.key, units[i : i + len(child.key)]]))
            i += shared
            holders = owners
            node = child
            if shared < len(child.key):
                break
        return i, holders

    def remove_replica(self, replica_id: str) -> None:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.owners.pop(replica_id, None) is not None:
                stack.extend(node.children.values())
                if not node.owners:
                    self._detach(node)
        self._size.pop(replica_id, None)

    def evict_lru(self, replica_id: str, target_size: int) -> None:
        """Drop `replica_id`'s least recently used leaves until its size <= target_size."""
        if self.size(replica_id) <= target_size:
            return
        heap: list[tuple[float, int, _Node]] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            if replica_id in node.owners:
                owned = [c for c in node.children.values() if replica_id in c.owners]
                if owned:
                    stack.extend(owned)
                else:
                    heap.append((node.owners[replica_id], id(node), node))
        heapq.heapify(heap)
        while heap and self._size[replica_id] > target_size:
            _, _, node = heapq.heappop(heap)
            del node.owners[replica_id]
            self._size[replica_id] -= len(node.key)
            parent = node.parent
            if not node.owners:
                self._detach(node)
            if parent is not None and parent is not self.root and replica_id in parent.owners:
                if not any(replica_id in c.owners for c in parent.children.values()):
                    heapq.heappush(heap, (parent.owners[replica_id], id(parent), parent))

    def _split(self, node: _Node, at: int) -> _Node:
        """Split `node` so its first `at` units become a new parent; returns that parent."""
        parent = node.parent
        assert parent is not None
        top = _Node(node.key[:at], parent)
        top.owners = dict(node.owners)
        parent.children[node.key[0]] = top
        node.key = node.key[at:]
        node.parent = top
        top.children[node.key[0]] = node
        return top

    def _detach(self, node: _Node) -> None:
        # A node nobody owns has no owned descendants (prefix-closed), so drop the whole subtree.
        if node.parent is not None:
            node.parent.children.pop(node.key[0], None)


def least_loaded(ids: Iterable[str], loads: dict[str, ReplicaLoad]) -> str:
    return min(ids, key=lambda rid: (loads[rid].ongoing, rid))


class ApproxTreePolicy(RoutingPolicy):
    """SGLang cache-aware routing (re-implementation; see module docstring)."""

    name = "approx_tree"

    def __init__(
        self,
        cache_threshold: float = 0.3,
        balance_abs: int = 64,
        balance_rel: float = 1.5,
        max_tree_size: int = 2**24,
    ) -> None:
        self.cache_threshold = cache_threshold
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.max_tree_size = max_tree_size
        self.tree = HistoryRadixTree()

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaLoad]) -> str:
        loads = {r.replica_id: r for r in replicas}
        counts = [r.ongoing for r in replicas]
        hi, lo = max(counts), min(counts)
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            return least_loaded(loads, loads)
        units = request_units(request)
        matched, holders = self.tree.match(units, set(loads))
        if units and matched / len(units) > self.cache_threshold and holders:
            return least_loaded(holders, loads)
        return min(loads, key=lambda rid: (self.tree.size(rid), loads[rid].ongoing, rid))

    def rank(self, request: RouteRequest, replicas: Sequence[ReplicaLoad], now: float) -> list[str]:
        chosen = self.choose(request, replicas)
        rest = sorted((r for r in replicas if r.replica_id != chosen), key=lambda r: (r.ongoing, r.replica_id))
        return [chosen] + [r.replica_id for r in rest]

    def on_routed(self, request: RouteRequest, replica_id: str, now: float) -> None:
        self.tree.insert(request_units(request), replica_id, now)
        if self.tree.size(replica_id) > self.max_tree_size:
            self.tree.evict_lru(replica_id, int(self.max_tree_size * 0.9))

    def on_replica_gone(self, replica_id: str) -> None:
        self.tree.remove_replica(replica_id)
