"""Prompt tokens a replica has accepted but not yet prefilled (pure; no Ray, no vLLM).

vLLM v1 admits requests into the running batch at once, so its `waiting` count
stays near zero while a cold 1,000-token prefill holds up every request behind
it for seconds. The router needs that queued work in tokens: each request counts
its uncached prompt tokens from arrival until the engine emits its first output.
"""

from __future__ import annotations


class PrefillBacklog:
    def __init__(self) -> None:
        self._pending: dict[str, int] = {}
        self.tokens = 0

    def arrived(self, request_id: str, prompt_tokens: int, cached_blocks: int, block_size: int) -> None:
        # At least one token: the engine always computes the last prompt position.
        uncached = max(prompt_tokens - cached_blocks * block_size, 1)
        self.done(request_id)  # a re-used id replaces its entry instead of leaking it
        self._pending[request_id] = uncached
        self.tokens += uncached

    def done(self, request_id: str) -> None:
        """First output (or abort/failure): idempotent, unknown ids are ignored."""
        self.tokens -= self._pending.pop(request_id, 0)

    def __len__(self) -> int:
        return len(self._pending)
