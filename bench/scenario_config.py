"""The cluster's config with one scenario preset in charge: every field some preset sets is cleared
first, so the preset (not the running cluster's resolved values) decides it. Pure."""

from __future__ import annotations

from kvserve.config import KVServeConfig
from kvserve.scenarios import SCENARIOS, preset


def preset_paths() -> set[str]:
    return {c.path for s in SCENARIOS for d in ("cpu", "gpu") for c in preset(s, d)}


def scenario_config(base: KVServeConfig, scenario: str) -> KVServeConfig:
    raw = base.model_dump(mode="json")
    for path in preset_paths():
        section, field = path.split(".")
        if isinstance(raw.get(section), dict):
            raw[section].pop(field, None)
    raw.setdefault("engine", {})["scenario"] = scenario
    return KVServeConfig.model_validate(raw)
