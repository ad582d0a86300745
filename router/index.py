"""Which replica holds which KV-cache blocks: the prefix-aware router's index.

Blocks are identified by chained hashes (`router.block_hash`), so a block hash
at position i stands for the whole prefix up to block i. The index answers one
question fast: for a request's hash chain, how many *leading* blocks does each
replica hold?

Three feeds, merged per replica:
- confirmed blocks: authoritative snapshots (`on_cache_snapshot`, replaces the
  replica's set) and incremental engine events (`on_cache_events`);
- speculative blocks: recorded when the router sends a request (`on_routed`),
  since the engine will cache that prompt shortly; they expire after `ttl_s`
  unless an event or snapshot confirms them, so a wrong guess heals itself.

Liveness: a replica whose last snapshot/event is older than `stale_after_s`
matches nothing (routing falls back to load); `on_replica_gone` forgets it.
A replica first seen through `on_routed` starts its clock then, so a freshly
added replica is not stale before its first report arrives.

Layout (why it is fast): one global dict `hash -> set(replica ids holding it)`.
A query walks the chain narrowing a candidate set with C-level set
intersections, so a decision costs O(chain length + replicas), independent of
how many blocks each replica caches. Expired speculative entries are purged
eagerly from a heap (one entry per routed request, not per block), so the
global dict never needs per-entry time checks.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence


class PrefixIndex:
    def __init__(self, speculative_ttl_s: float = 10.0, stale_after_s: float = 10.0) -> None:
        self.ttl_s = speculative_ttl_s
        self.stale_after_s = stale_after_s
        self._where: dict[int, set[str]] = {}  # hash -> replicas holding it (confirmed or live speculative)
        self._confirmed: dict[str, set[int]] = {}
        self._speculative: dict[str, dict[int, float]] = {}  # replica -> hash -> expiry time
        self._expiry_heap: list[tuple[float, int, str, list[int]]] = []  # (expiry, seq, replica, hashes)
        self._seq = 0
        self._last_heard: dict[str, float] = {}

    # ---- feeds -------------------------------------------------------------

    def on_cache_snapshot(self, replica_id: str, block_hashes: Iterable[int], now: float) -> None:
        """Replace `replica_id`'s confirmed blocks with exactly `block_hashes`."""
        new = set(block_hashes)
        old = self._confirmed.get(replica_id, set())
        self._confirmed[replica_id] = new
        spec = self._speculative.get(replica_id, {})
        for h in old - new:
            if h not in spec:
                self._unlink(replica_id, h)
        for h in new - old:
            self._link(replica_id, h)
        for h in new & spec.keys():
            del spec[h]  # confirmed now; its heap entry is skipped when popped
        self._last_heard[replica_id] = now

    def on_cache_events(
        self, replica_id: str, stored: Iterable[int], removed: Iterable[int], now: float
    ) -> None:
        """Apply engine KV events: `stored` blocks become confirmed, `removed` ones are gone.

        A removal also drops a speculative entry: eviction is newer news than our guess.
        """
        confirmed = self._confirmed.setdefault(replica_id, set())
        spec = self._speculative.get(replica_id, {})
        for h in stored:
            if h not in confirmed:
                confirmed.add(h)
                self._link(replica_id, h)
            spec.pop(h, None)
        for h in removed:
            was_held = h in confirmed or h in spec
            confirmed.discard(h)
            spec.pop(h, None)
            if was_held:
                self._unlink(replica_id, h)
        self._last_heard[replica_id] = now

    def on_routed(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """Assume `replica_id` will cache `block_hashes` soon (speculative, expires after ttl_s)."""
        self._expire(now)
        self._last_heard.setdefault(replica_id, now)
        confirmed = self._confirmed.setdefault(replica_id, set())
        spec = self._speculative.setdefault(replica_id, {})
        where = self._where
        expiry = now + self.ttl_s
        noted: list[int] = []
        for h in block_hashes:  # the hot path of every decision: _link inlined
            if h in confirmed:
                continue
            if h not in spec:
                holders = where.get(h)
                if holders is None:
                    where[h] = {replica_id}
                else:
                    holders.add(replica_id)
            spec[h] = expiry
            noted.append(h)
        if noted:
            self._seq += 1
            heapq.heappush(self._expiry_heap, (expiry, self._seq, replica_id, noted))

    def on_replica_gone(self, replica_id: str) -> None:
        for h in self._confirmed.pop(replica_id, set()) | self._speculative.pop(replica_id, {}).keys():
            self._unlink(replica_id, h)
        self._last_heard.pop(replica_id, None)

    # ---- queries -----------------------------------------------------------

    def match(self, block_hashes: Sequence[int], now: float) -> dict[str, int]:
        """Leading blocks of `block_hashes` held by each live replica (replicas with 0 omitted)."""
        self._expire(now)
        if not block_hashes:
            return {}
        first = self._where.get(block_hashes[0])
        if not first:
            return {}
        cutoff = now - self.stale_after_s
        cand = {r for r in first if self._last_heard.get(r, cutoff) > cutoff}
        result: dict[str, int] = {}
        depth = 1
        for h in block_hashes[1:]:
            if not cand:
                break
            holders = self._where.get(h)
            nxt = cand & holders if holders else set()
            if len(nxt) != len(cand):
                for r in cand - nxt:
                    result[r] = depth
            cand = nxt
            depth += 1
        for r in cand:
            result[r] = depth
        return result

    def confirms(self, replica_id: str, block_hash: int | None) -> bool:
        """The engine reported `block_hash` cached on `replica_id` (not merely our speculation)."""
        return block_hash is not None and block_hash in self._confirmed.get(replica_id, ())

    def is_stale(self, replica_id: str, now: float) -> bool:
        heard = self._last_heard.get(replica_id)
        return heard is None or now - heard >= self.stale_after_s

    def replicas(self) -> set[str]:
        return set(self._last_heard)

    def blocks_of(self, replica_id: str, now: float) -> set[int]:
        """Every block currently attributed to `replica_id` (for tests and debugging)."""
        self._expire(now)
        return self._confirmed.get(replica_id, set()) | self._speculative.get(replica_id, {}).keys()

    def num_entries(self) -> int:
        """Total (hash, replica) pairs in the global map; 0 once every replica is gone."""
        return sum(len(s) for s in self._where.values())

    # ---- internals ---------------------------------------------------------

    def _link(self, replica_id: str, h: int) -> None:
        holders = self._where.get(h)
        if holders is None:
            self._where[h] = {replica_id}
        else:
            holders.add(replica_id)

    def _unlink(self, replica_id: str, h: int) -> None:
        holders = self._where.get(h)
        if holders is not None:
            holders.discard(replica_id)
            if not holders:
                del self._where[h]

    def _expire(self, now: float) -> None:
        heap = self._expiry_heap
        while heap and heap[0][0] <= now:
            expiry, _, replica_id, hashes = heapq.heappop(heap)
            spec = self._speculative.get(replica_id)
            if spec is None:
                continue  # the replica is gone
            confirmed = self._confirmed.get(replica_id, ())
            for h in hashes:
                # Skip entries refreshed by a later on_routed or already confirmed.
                if spec.get(h) != expiry:
                    continue
                del spec[h]
                if h not in confirmed:
                    self._unlink(replica_id, h)
