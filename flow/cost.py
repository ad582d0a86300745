"""What a request costs the cluster, in tokens: the unit fair shares are charged in.

Uncached prefill tokens (the router's prefix index says how much of the prompt some replica
already holds; a tenant whose long system prompt is cached is not billed for it) plus the decode
tokens it is expected to generate. `max_tokens` only bounds the decode; most requests stop well
before it, so each tenant's recent completions give the expectation.
"""

from __future__ import annotations

DEFAULT_DECODE_TOKENS = 256  # expected decode of a request without max_tokens, before its tenant has history


def request_cost(uncached_prefill_tokens: int, expected_decode_tokens: float) -> float:
    return float(max(uncached_prefill_tokens, 0)) + max(expected_decode_tokens, 0.0)


class DecodeEstimate:
    """Per-tenant moving average of completion tokens; bounded by the request's own max_tokens."""

    def __init__(self, alpha: float = 0.1, max_tenants: int = 10_000) -> None:
        self.alpha, self.max_tenants = alpha, max_tenants
        self._mean: dict[str, float] = {}

    def expected(self, tenant: str, max_tokens: int | None) -> float:
        mean = self._mean.get(tenant)
        if mean is None:
            return float(max_tokens) if max_tokens else float(DEFAULT_DECODE_TOKENS)
        return min(mean, float(max_tokens)) if max_tokens else mean

    def observe(self, tenant: str, completion_tokens: int) -> None:
        if completion_tokens < 0:
            return
        mean = self._mean.get(tenant)
        if mean is None and len(self._mean) >= self.max_tenants:
            self._mean.pop(next(iter(self._mean)))  # bounded memory: the oldest tenant seen goes
        self._mean[tenant] = completion_tokens if mean is None else mean + self.alpha * (completion_tokens - mean)
