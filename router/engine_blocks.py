"""Translate an engine's KV-cache events into our chained block hashes.

vLLM reports BlockStored(block_hashes, parent_block_hash, token_ids, block_size)
and BlockRemoved(block_hashes) with its own hash values (seeded per process, so
they cannot be recomputed elsewhere). We re-derive our hash of every stored
block from its tokens and its parent's hash, and keep engine-hash -> our-hash so
removals can be applied. The result is the exact set of prefix blocks a replica
holds, in the same hash space the ingress computes from a prompt.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from router.block_hash import hash_block, salted_root


class EngineBlockSet:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ours: dict[Hashable, int] = {}  # engine hash -> our chained hash
        self._held: dict[int, int] = {}  # our hash -> engine blocks carrying it (for prefix lookups)
        self.version = 0  # bumps on every change (lets callers skip unchanged snapshots)

    def stored(self, engine_hashes: Sequence[Hashable], parent: Hashable | None, token_ids: Sequence[int],
               salt: str | None = None) -> None:
        """`salt`: the prompt's cache_salt, which vLLM reports with a prompt's first block."""
        if parent is None:
            h = salted_root(salt)
        elif parent in self._ours:
            h = self._ours[parent]
        else:
            return  # parent unknown (e.g. evicted meanwhile): unreachable as a prefix, skip
        bs = self.block_size
        for i, eh in enumerate(engine_hashes):
            toks = token_ids[i * bs : (i + 1) * bs]
            if len(toks) < bs:
                break
            h = hash_block(h, toks)
            if eh not in self._ours:
                self._held[h] = self._held.get(h, 0) + 1
                self._ours[eh] = h
        self.version += 1

    def removed(self, engine_hashes: Sequence[Hashable]) -> None:
        for eh in engine_hashes:
            h = self._ours.pop(eh, None)
            if h is not None:
                left = self._held[h] - 1
                if left:
                    self._held[h] = left
                else:
                    del self._held[h]
        self.version += 1

    def cleared(self) -> None:
        self._ours.clear()
        self._held.clear()
        self.version += 1

    def prefix_blocks(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of a prompt (our chained hashes) are held here."""
        n = 0
        for h in hashes:
            if h not in self._held:
                break
            n += 1
        return n

    def snapshot(self) -> list[int]:
        return list(self._ours.values())

    def __len__(self) -> int:
        return len(self._ours)
