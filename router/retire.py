"""Which replica to retire when the fleet shrinks: the one whose cached prefixes are worth least.

A cached block is worth to the fleet what losing it costs. If another replica holds it too, nothing: the
router sends its family there and it still hits. If no other replica holds it, the re-prefill of every
request that would have hit it -- estimated by how recently it was hit (its worth halves every
`half_life_s` since the last hit). A replica's loss is the worth of the blocks only it holds. Retiring
the replica of least loss keeps the most hits; among equal losses (say, all duplicated), the one with the
least recent traffic on its blocks goes first. Pure Python, fed by the router's own routing decisions and
the engines' KV events (the same feeds as `router.index.PrefixIndex`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

Holdings = Mapping[str, Mapping[int, float]]  # replica -> block hash -> when it was last hit


def block_worth(last_hit: float, now: float, half_life_s: float) -> float:
    return 0.5 ** (max(now - last_hit, 0.0) / half_life_s)


def losses(holdings: Holdings, now: float, half_life_s: float = 60.0) -> dict[str, float]:
    """Each replica's loss: the worth of the blocks no other replica holds."""
    holders = Counter(h for blocks in holdings.values() for h in blocks)
    return {rid: sum(block_worth(t, now, half_life_s) for h, t in blocks.items() if holders[h] == 1)
            for rid, blocks in holdings.items()}


def retire_order(holdings: Holdings, now: float, half_life_s: float = 60.0, n: int | None = None) -> list[str]:
    """The first `n` (None: all) replicas of `holdings`, the cheapest to lose first. Greedy: once one is
    picked, the blocks it shared count as unique to their remaining holders, so two copies of one hot
    prefix are not both lost."""
    left = {rid: blocks for rid, blocks in holdings.items()}
    order: list[str] = []
    while left and (n is None or len(order) < n):
        loss = losses(left, now, half_life_s)
        activity = {rid: sum(block_worth(t, now, half_life_s) for t in b.values()) for rid, b in left.items()}
        victim = min(left, key=lambda r: (loss[r], activity[r], r))
        order.append(victim)
        del left[victim]
    return order


class CacheRecency:
    """Per replica, the blocks it holds and when each was last hit, from the router's feeds."""

    def __init__(self) -> None:
        self._blocks: dict[str, dict[int, float]] = {}

    def on_routed(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """A request went to `replica_id`: its prompt's blocks are hit there, or cached there now."""
        blocks = self._blocks.setdefault(replica_id, {})
        for h in block_hashes:
            blocks[h] = now

    def on_cache_events(self, replica_id: str, stored: Iterable[int], removed: Iterable[int], now: float) -> None:
        blocks = self._blocks.setdefault(replica_id, {})
        for h in stored:
            blocks.setdefault(h, now)  # a warm-up or a prefill: cached, not yet hit again
        for h in removed:
            blocks.pop(h, None)

    def on_replica_gone(self, replica_id: str) -> None:
        self._blocks.pop(replica_id, None)

    def holdings(self, replicas: Iterable[str]) -> dict[str, dict[int, float]]:
        """Blocks and last hits of `replicas` (one with no report holds nothing)."""
        return {rid: self._blocks.get(rid, {}) for rid in replicas}
