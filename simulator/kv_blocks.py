"""KV block pool of one simulated replica, after vLLM V1's BlockPool and KVCacheManager.

- One free queue in eviction order: unhashed blocks first (never used, or a request's partial last
  block: vLLM reuses those first), then full blocks in the order they were freed. A freed block that
  holds a cached prompt block stays findable by its hash (evictable) until the queue hands it out
  again; a request that hits it takes it back out of the queue.
- A request frees its blocks in reverse (tail first), so a prompt's tail is evicted before its head.
- Only full prompt blocks are cached, when they are scheduled (vLLM caches at allocation, so a request
  scheduled later in the same step already hits them). A block computed while an equal one is cached
  stays private. Full output blocks are private too (vLLM hashes them, but no other request can hit
  them): both join the queue's tail like cached blocks, anonymously.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol


class Holder(Protocol):
    """What the pool keeps on a request: per held block its cached hash, or None for a private block."""

    block_hashes: list[int]
    refs: list[int | None]
    registered: int  # prompt blocks [0, registered) already cached or kept private


class KVCache:
    __slots__ = ("capacity", "unhashed", "free", "refc", "events", "_anon")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.unhashed = capacity  # the free queue's head: blocks with no full block of tokens (never used, or partial)
        # Freed blocks, next to be handed out first: a block hash (cached, evictable) or an anonymous key.
        self.free: OrderedDict[object, None] = OrderedDict()
        self.refc: dict[int, int] = {}  # cached blocks in use -> requests holding them
        self.events: dict[int, bool] = {}  # block -> stored (True) / removed (False) since last flush
        self._anon = itertools.count()

    # ---- lookups --------------------------------------------------------------

    def is_cached(self, h: int) -> bool:
        return h in self.refc or h in self.free

    def cached_prefix(self, hashes: Sequence[int], limit: int | None = None) -> int:
        refc, free, n = self.refc, self.free, 0
        for h in hashes if limit is None else hashes[:limit]:
            if h in refc or h in free:
                n += 1
            else:
                break
        return n

    def free_blocks(self) -> int:
        return self.unhashed + len(self.free)

    @property
    def used(self) -> int:
        return self.capacity - self.free_blocks()

    def usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    # ---- allocation -------------------------------------------------------------

    def admit(self, req: Holder, hits: int, new: int) -> bool:
        """Take the request's first `hits` cached blocks and `new` more; False (nothing changed) if the
        free queue cannot supply the new ones plus the hit blocks it holds (vLLM's allocate_slots check)."""
        prefix = req.block_hashes[:hits]
        free = self.free
        from_free = sum(1 for h in prefix if h in free)
        if new + from_free > self.free_blocks():
            return False
        refc = self.refc
        for h in prefix:
            if h in free:
                del free[h]
                refc[h] = 1
            else:
                refc[h] += 1
        req.refs = list(prefix)
        req.registered = hits
        self.allocate(req, new)
        return True

    def allocate(self, req: Holder, n: int) -> None:
        """`n` private blocks from the head of the free queue (evicting cached ones); the caller checked room."""
        take = min(n, self.unhashed)
        self.unhashed -= take
        free, events = self.free, self.events
        for _ in range(n - take):
            key, _ = free.popitem(last=False)
            if key.__class__ is int:
                events[key] = False
        req.refs.extend([None] * n)

    def cache_full(self, req: Holder, upto: int) -> None:
        """Prompt blocks [registered, upto) are scheduled: cache each unless an equal block is cached."""
        refc, free, refs, events = self.refc, self.free, req.refs, self.events
        hashes = req.block_hashes
        for j in range(req.registered, upto):
            h = hashes[j]
            if h not in refc and h not in free:
                refc[h] = 1
                refs[j] = h
                events[h] = True
        req.registered = max(req.registered, upto)

    def release(self, req: Holder, partial_last: bool = False) -> None:
        """Return the request's blocks tail first: a partial last block to the queue's head, cached ones no
        one else holds stay findable, the other full blocks queue anonymously."""
        refc, free = self.refc, self.free
        refs = req.refs
        if partial_last and refs and refs[-1] is None:
            refs.pop()
            self.unhashed += 1
        for h in reversed(refs):
            if h is None:
                free[(next(self._anon),)] = None
                continue
            n = refc[h] - 1
            if n:
                refc[h] = n
            else:
                del refc[h]
                free[h] = None
        req.refs = []
        req.registered = 0

    def warm(self, hashes: Sequence[int]) -> int:
        """A warm-up request runs alone and finishes: the same admit, cache and release as any request,
        so its blocks join the free queue as newest. Returns blocks added (0 when it cannot fit)."""
        req = _Warm(list(hashes))
        hits = self.cached_prefix(req.block_hashes)
        if not self.admit(req, hits, len(hashes) - hits):
            return 0
        self.cache_full(req, len(hashes))
        self.release(req)
        return len(hashes) - hits

    def take_events(self) -> tuple[list[int], list[int]]:
        ev, self.events = self.events, {}
        stored = [h for h, s in ev.items() if s]
        removed = [h for h, s in ev.items() if not s]
        return stored, removed


class _Warm:
    __slots__ = ("block_hashes", "refs", "registered")

    def __init__(self, hashes: list[int]) -> None:
        self.block_hashes, self.refs, self.registered = hashes, [], 0
