"""API keys -> tenant ids. Keys are only ever held as sha256 digests; comparison is constant-time."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

import yaml

from kvserve.config import TenantsConfig

OPEN_TENANT = "default"


def _load_keys_file(path: str) -> list[tuple[str, str]]:
    data = yaml.safe_load(Path(path).read_text()) or []
    if isinstance(data, dict):  # {tenant: sha256}
        data = [{"tenant": t, "key_sha256": h} for t, h in data.items()]
    out = []
    for entry in data:
        if "key_sha256" in entry:
            digest = entry["key_sha256"]
        else:  # a raw key in a mounted Secret: hash it on read, never keep it
            digest = hashlib.sha256(str(entry["key"]).encode()).hexdigest()
        out.append((str(entry["tenant"]), digest))
    return out


class TenantAuth:
    def __init__(self, cfg: TenantsConfig) -> None:
        self.open_mode = cfg.open_mode
        pairs = [(k.tenant, k.resolved_sha256()) for k in cfg.keys]
        if cfg.keys_file:
            pairs += _load_keys_file(cfg.keys_file)
        self._digests = [(bytes.fromhex(d), t) for t, d in pairs]

    @property
    def requires_key(self) -> bool:
        return not self.open_mode

    def tenant_for(self, authorization: str | None) -> str | None:
        """Tenant id for an `Authorization` header value, or None if it grants nothing."""
        if self.open_mode:
            return OPEN_TENANT
        if not authorization or not authorization.lower().startswith("bearer "):
            return None
        digest = hashlib.sha256(authorization[7:].strip().encode()).digest()
        found = None
        for known, tenant in self._digests:  # no early exit: timing does not reveal which key matched
            if hmac.compare_digest(known, digest):
                found = tenant
        return found


def hash_key(raw: str) -> str:
    """The sha256 hex to put in config (`kvserve config hash-key`)."""
    return hashlib.sha256(raw.encode()).hexdigest()



