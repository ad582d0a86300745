"""Per-tenant KV-cache isolation through vLLM's `cache_salt`.

The threat: engines share prefix-cache blocks between any requests with equal tokens, so a tenant
who times its own TTFT can tell whether some prompt prefix is already cached -- and so probe
another tenant's system prompt or documents a block at a time. With isolation the ingress salts
every prompt with its tenant: salted blocks are shared only within the tenant, so another tenant's
cache state is invisible. The cost is hit rate on prefixes that tenants have in common (a shared
preamble is prefilled once per tenant instead of once per replica).

A client may send its own `cache_salt` (vLLM's field) to split its cache further; under isolation
it is folded into the tenant's salt, so no client can choose a value that lands in another
tenant's blocks. The salt needs no secret: clients never set the final value.
"""

from __future__ import annotations

import hashlib
import json

from deployments.errors import APIError

ISOLATION_MODES = ("tenant", "shared")


def request_salt(tenant: str, client_salt: object, isolation: str) -> str | None:
    """The cache_salt the engine sees for this request (None: unsalted)."""
    if client_salt is not None and (not isinstance(client_salt, str) or not client_salt):
        raise APIError(400, "cache_salt must be a non-empty string if given.", "cache_salt")
    if isolation == "shared":
        return client_salt  # type: ignore[return-value]  # vLLM checks its length and characters
    digest = hashlib.sha256(json.dumps([tenant, client_salt or ""]).encode()).hexdigest()
    return f"kvs-{digest[:40]}"
