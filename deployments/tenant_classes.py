"""Each tenant's class (tenants.classes): from its key in the config, or its entry in tenants.keys_file."""

from __future__ import annotations

from pathlib import Path

import yaml

from kvserve.config import TenantsConfig

DEFAULT_CLASS = "default"
UNKNOWN = "unknown"  # requests without a valid key: no tenant, so no class


def tenant_classes(cfg: TenantsConfig) -> dict[str, str]:
    """tenant -> class name. Open mode's tenant (`default`) is in the `default` class."""
    out = {DEFAULT_CLASS: DEFAULT_CLASS} if cfg.open_mode else {}
    out.update(cfg.key_classes())
    if cfg.keys_file:
        data = yaml.safe_load(Path(cfg.keys_file).read_text()) or []
        for i, entry in enumerate(data if isinstance(data, list) else []):
            cls = str(entry.get("class", DEFAULT_CLASS))
            if cls not in cfg.classes:
                raise ValueError(f"{cfg.keys_file}[{i}] (tenant {entry.get('tenant')!r}): unknown class {cls!r}; "
                                 f"known: {sorted(cfg.classes)}")
            out[str(entry["tenant"])] = cls
    return out
