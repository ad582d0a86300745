"""Which prefixes are hot, and which of them a starting replica should pre-fill.

The ingress feeds every routed prompt; a replica that is about to take traffic (scale-up,
restart) pre-fills the warm set (`HotPrefixTracker.warm_set`: the hot prefixes that carry its
share of the traffic) so its first requests hit cache instead of paying cold prefills (issue:
scale-up TTFT spike). The simulator runs the same code. Pure Python.

Per prefix family (`family_key`) two kinds of hot prefix, each a latest-two rule:
- the family's root: what its two latest *fresh* prompts share (a tenant's system prompt);
- its threads: a prompt that re-sends a thread's latest prompt whole and adds to it (a conversation's
  next turn, an agent's next step) continues that thread, whose hot prefix becomes what its latest
  two prompts share, so it grows each turn. A prompt that continues no thread is fresh: it starts one.
Each request counts once, to the thread it continues or else to its family's root (a thread's first
prompt moves from the root to it once it continues), so the scores split the family's traffic
between the prefixes that would serve it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from router.block_hash import chain_hashes


@dataclass
class _Entry:
    tokens: list[int]  # root: the shared prefix; thread: its latest prompt's full blocks but the last
    shared: int  # tokens of `tokens` that the latest two prompts share (the hot prefix)
    score: float
    last: float
    salt: str | None  # the family's vLLM cache_salt: a warm-up must carry it to fill the blocks it will hit
    hashes: list[int]  # root: the latest fresh prompt's block hashes, to compare the next one with


class HotPrefix(NamedTuple):
    key: str
    tokens: list[int]
    score: float  # decayed request count (of requests this prefix serves: see the module doc)
    salt: str | None
    thread: bool = False  # a thread (lives on one replica, moves whole) rather than a family's root


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _common_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    """Leading equal entries of two chained-hash lists (equal at i implies equal before: bisect)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def family_key(tenant: str, block_hashes: Sequence[int]) -> str:
    """A prefix family: the tenant plus the prompt's second block (its first may be a shared preamble)."""
    return f"{tenant}:{block_hashes[1]:x}"


class HotPrefixTracker:
    def __init__(self, block_size: int, half_life_s: float = 120.0, max_tenants: int = 1024,
                 min_blocks: int = 2) -> None:
        self.block_size = block_size
        self.decay = math.log(2) / half_life_s
        self.max_tenants = max_tenants  # families; as many threads (each holds one prompt's tokens)
        self.min_tokens = min_blocks * block_size
        self._roots: dict[str, _Entry] = {}
        self._threads: dict[tuple[str, int], _Entry] = {}  # (family, hash of its latest prompt's last kept block)

    def observe(self, key: str, token_ids: Sequence[int], now: float, salt: str | None = None,
                block_hashes: Sequence[int] | None = None) -> None:
        """One routed prompt of family `key`. `block_hashes`: its chained full-block hashes, when the
        caller has them (else computed here)."""
        bs = self.block_size
        keep = max((len(token_ids) - 1) // bs, 0)  # full blocks but the last: what a next prompt can hit
        hashes = list((chain_hashes(token_ids, bs) if block_hashes is None else block_hashes)[:keep])
        tokens = list(token_ids[: keep * bs])
        for i in range(len(hashes) - 1, -1, -1):  # the longest thread whose latest prompt this one re-sends
            t = self._threads.pop((key, hashes[i]), None)
            if t is not None:
                if not t.shared:  # its first prompt counted to the root as fresh: it was this thread's
                    root = self._roots.get(key)
                    if root is not None:
                        moved = min(self._score(t, now), self._score(root, now))
                        root.score, root.last = self._score(root, now) - moved, now
                t.tokens, t.shared = tokens, (i + 1) * bs
                self._bump(t, now)
                self._threads[(key, hashes[-1])] = t
                return
        root = self._roots.get(key)
        if root is None:
            self._roots[key] = root = _Entry([], 0, 0.0, now, salt, [])
            self._prune(self._roots)
        elif root.hashes:
            root.shared = _common_blocks(root.hashes, hashes) * bs
            root.tokens = tokens[: root.shared]
        root.hashes = hashes
        self._bump(root, now)
        if hashes:
            self._threads[(key, hashes[-1])] = _Entry(tokens, 0, 1.0, now, salt, [])
            self._prune(self._threads)

    def _bump(self, e: _Entry, now: float) -> None:
        e.score = self._score(e, now) + 1.0
        e.last = now

    def _prune(self, table: dict) -> None:
        """Over the cap: drop the coldest quarter at once (one sort, not a scan per insert)."""
        if len(table) <= self.max_tenants:
            return
        now = max(e.last for e in table.values())
        for k in sorted(table, key=lambda k: self._score(table[k], now))[: len(table) - self.max_tenants * 3 // 4]:
            del table[k]

    def _score(self, e: _Entry, now: float) -> float:
        return e.score * math.exp(-self.decay * max(now - e.last, 0.0))

    def hottest(self, n: int, now: float, min_score: float = 0.0) -> list[HotPrefix]:
        """Up to `n` hot prefixes, hottest first, with decayed request counts >= `min_score`."""
        entries = [(k, e, False) for k, e in self._roots.items()]
        entries += [(f"{k}/{h & 0xFFFFFFFF:x}", e, True) for (k, h), e in self._threads.items()]
        ranked = sorted(
            (HotPrefix(k, e.tokens[: e.shared], self._score(e, now), e.salt, thread)
             for k, e, thread in entries if e.shared >= self.min_tokens),
            key=lambda h: -h.score,
        )
        return [h for h in ranked[:n] if h.score >= min_score]

    def warm_set(self, now: float, replicas: int, min_requests: float, max_prefixes: int) -> list[HotPrefix]:
        """What a starting replica (one of `replicas`) pre-fills: `take_share` of the prefixes seen at least
        `min_requests` times recently, each bringing it at least one request (a warm-up costs about what
        one request's miss on the prefix would: it pays back only through requests that hit it)."""
        hot = self.hottest(len(self._roots) + len(self._threads), now, min_requests)
        return take_share(hot, replicas, max_prefixes, min_brings=1.0)


def take_share(hot: Sequence[HotPrefix], replicas: int, max_prefixes: int,
               min_brings: float = 0.0) -> list[HotPrefix]:
    """The prefixes that bring a new replica the most requests, until they carry its share (1 / `replicas`)
    of `hot`'s traffic: at most `max_prefixes`, each bringing >= `min_brings`.

    What a warmed prefix brings: a thread (a conversation) lives on one replica and the router moves it
    whole to one that holds its context at less load, so all its traffic; a root (a tenant's shared
    prompt) is held by the replicas serving that tenant, whose traffic the router spreads by load, so
    1 / `replicas` of it. Each request counts to one prefix, so the shares add up."""
    n = max(replicas, 1)
    brings = lambda h: h.score if h.thread else h.score / n  # noqa: E731
    want, out, carried = sum(h.score for h in hot) / n, [], 0.0
    for h in sorted(hot, key=lambda h: -brings(h))[:max_prefixes]:
        if carried >= want - 1e-9 or brings(h) < min_brings:
            break
        out.append(h)
        carried += brings(h)
    return out
