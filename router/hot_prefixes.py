"""Which prefixes are hot: per tenant, the prefix its recent prompts share, and how often it is used.

The ingress feeds every routed prompt; a replica that is about to take traffic
(scale-up, restart) pre-fills the top entries so its first requests hit cache
instead of paying cold prefills (issue: scale-up TTFT spike). Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple


@dataclass
class _Tenant:
    prefix: list[int]
    score: float
    last: float
    salt: str | None  # the family's vLLM cache_salt: a warm-up must carry it to fill the blocks it will hit


class HotPrefix(NamedTuple):
    key: str
    tokens: list[int]
    score: float  # decayed request count
    salt: str | None


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def family_key(tenant: str, block_hashes: Sequence[int]) -> str:
    """A prefix family: the tenant plus the prompt's second block (its first may be a shared preamble)."""
    return f"{tenant}:{block_hashes[1]:x}"


class HotPrefixTracker:
    def __init__(self, block_size: int, half_life_s: float = 120.0, max_tenants: int = 1024,
                 min_blocks: int = 2) -> None:
        self.block_size = block_size
        self.decay = math.log(2) / half_life_s
        self.max_tenants = max_tenants
        self.min_tokens = min_blocks * block_size
        self._tenants: dict[str, _Tenant] = {}

    def observe(self, tenant: str, token_ids: Sequence[int], now: float, salt: str | None = None) -> None:
        t = self._tenants.get(tenant)
        if t is None:
            if len(self._tenants) >= self.max_tenants:
                coldest = min(self._tenants, key=lambda k: self._score(self._tenants[k], now))
                del self._tenants[coldest]
            # Until a second prompt shows what is shared, assume all full blocks but the last.
            keep = max((len(token_ids) - 1) // self.block_size * self.block_size, 0)
            self._tenants[tenant] = _Tenant(list(token_ids[:keep]), 1.0, now, salt)
            return
        shared = common_prefix_len(t.prefix, token_ids)
        t.prefix = t.prefix[: shared // self.block_size * self.block_size]
        t.score = self._score(t, now) + 1.0
        t.last = now

    def _score(self, t: _Tenant, now: float) -> float:
        return t.score * math.exp(-self.decay * max(now - t.last, 0.0))

    def hottest(self, n: int, now: float, min_score: float = 0.0) -> list[HotPrefix]:
        """Up to `n` families, hottest first, with decayed request counts >= `min_score`."""
        ranked = sorted(
            (HotPrefix(k, t.prefix, self._score(t, now), t.salt)
             for k, t in self._tenants.items() if len(t.prefix) >= self.min_tokens),
            key=lambda h: -h.score,
        )
        return [h for h in ranked[:n] if h.score >= min_score]
