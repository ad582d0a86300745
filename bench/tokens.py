"""Deterministic, round-trip-safe token text for synthetic prompts.

A prompt we build from token ids is sent as *text* (so every router, including
Ray's character-level one, sees the same input). That only measures what we
intend if the server's tokenizer turns the text back into exactly our ids, so
we sample only "safe" tokens: a leading space plus a short lowercase word,
which a BPE pre-tokenizer never merges across, and which encode back to
themselves on their own.
"""

from __future__ import annotations

import random
import re
from typing import Protocol, Sequence

_SAFE_WORD = re.compile(r"^ [a-z]{2,10}$")


class TokenizerLike(Protocol):
    """Anything with HF-style `encode`/`decode` (a real AutoTokenizer or a test fake)."""

    def encode(self, text: str, *args, **kwargs) -> list[int]: ...

    def decode(self, ids: Sequence[int], *args, **kwargs) -> str: ...


def encode_plain(tok: TokenizerLike, text: str) -> list[int]:
    """Encode without BOS/EOS: we compare token runs, not full model inputs."""
    try:
        return list(tok.encode(text, add_special_tokens=False))
    except TypeError:  # simple fakes take no keyword
        return list(tok.encode(text))


def vocab_size(tok: TokenizerLike) -> int:
    for attr in ("vocab_size",):
        n = getattr(tok, attr, None)
        if isinstance(n, int) and n > 0:
            return n
    return len(tok)  # type: ignore[arg-type]


class SafeVocab:
    """The ids of safe tokens of a tokenizer, and seeded sampling over them."""

    def __init__(self, tok: TokenizerLike, max_scan: int = 60_000) -> None:
        self.tok = tok
        ids: list[int] = []
        for i in range(min(vocab_size(tok), max_scan)):
            text = tok.decode([i])
            if _SAFE_WORD.match(text) and encode_plain(tok, text) == [i]:
                ids.append(i)
        if len(ids) < 64:
            raise ValueError(f"tokenizer has only {len(ids)} round-trip-safe word tokens; need >= 64")
        self.ids = ids

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return [self.ids[rng.randrange(len(self.ids))] for _ in range(n)]

    def text(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    def roundtrips(self, ids: Sequence[int]) -> bool:
        return encode_plain(self.tok, self.text(ids)) == list(ids)
