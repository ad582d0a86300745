"""Chained block hashes over token ids (the identity of a KV-cache block).

Block i's hash covers its own tokens and block i-1's hash, so equal hashes at
position i mean equal prefixes up to the end of block i -- the same chaining
vLLM's prefix cache uses. Only full blocks are hashed: a partial block is
never shared by the engine.

Python's tuple-of-int hash is deterministic across processes (ints are not
salted by PYTHONHASHSEED), fast, and 64-bit, so the ingress, the replicas and
the simulator all compute identical values without a shared seed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

ROOT_HASH = 0x6B76_7365_7276_6531  # parent of the first block ("kvserve1")


def salted_root(salt: str | None) -> int:
    """Parent of the first block of a prompt carrying vLLM's `cache_salt`.

    vLLM mixes the salt into block 0's hash only, so every block of a salted prompt differs from the
    unsalted one; chaining from a salt-derived root does the same here. sha256, not hash(str): str
    hashes are salted per process and the ingress and replicas must agree.
    """
    if not salt:
        return ROOT_HASH
    return hash((ROOT_HASH, int.from_bytes(hashlib.sha256(salt.encode()).digest()[:8], "big")))


def hash_block(parent: int, tokens: Sequence[int]) -> int:
    return hash((parent, *tokens))


def chain_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Hashes of every full `block_size` block of `token_ids`, chained from `parent`."""
    out: list[int] = []
    h = parent
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = hash_block(h, token_ids[start : start + block_size])
        out.append(h)
    return out


def chain_ids(block_ids: Sequence[int], parent: int = ROOT_HASH) -> list[int]:
    """Chain opaque per-block ids (e.g. a Mooncake trace's `hash_ids`) into prefix hashes."""
    out: list[int] = []
    h = parent
    for b in block_ids:
        h = hash((h, b))
        out.append(h)
    return out
