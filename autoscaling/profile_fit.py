"""The engine profile of a model nobody measured: a conservative estimate, fitted online.

The estimate is a measured profile (`conservative_base`: the packaged CPU profile of the small
embedded model) with its prefill and decode times multiplied by `unprofiled_scale` -- slow, so
a fresh fleet over-provisions rather than misses. Each decision then moves the two factors
towards what the replicas report (exponentially, `FIT_WEIGHT` per report):
- prefill: a replica with nothing waiting reports its p90 TTFT; over the profile's prefill time
  of its mean uncached prompt that is an upper estimate of the factor (a p90 is above the mean);
- decode: its p90 ITL over the profile's step time at its running batch.
Both read high rather than low, so the fitted profile stays on the conservative side.
`kvserve profile` measures a real one; with it (or the embedded model's) nothing is fitted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kvserve.profiles
from autoscaling.base import ReplicaMetrics
from kvserve.perf_model import EngineProfile

FIT_WEIGHT = 0.1  # per report: ~10 reports (a look-back window's pushes) to move most of the way
REBUILD_AT = 0.05  # a factor that moved this much (relative) rebuilds the effective profile


def conservative_base() -> EngineProfile:
    return EngineProfile.load(Path(kvserve.profiles.__file__).resolve().parent / "cpu-smollm2-135m.json")


def scaled(p: EngineProfile, prefill: float, decode: float) -> EngineProfile:
    return dataclasses.replace(
        p, prefill_ms=[y * prefill for y in p.prefill_ms], cached_token_ms=p.cached_token_ms * prefill,
        decode={c: (list(xs), [y * decode for y in ys]) for c, (xs, ys) in p.decode.items()},
        source=f"{p.source} x prefill {prefill:.3g}, decode {decode:.3g} (fitted online)")


class OnlineProfile:
    def __init__(self, scale: float, base: EngineProfile | None = None) -> None:
        self.base = base or conservative_base()
        self.prefill = self.decode = scale
        self._built: tuple[float, float] = (scale, scale)
        self.profile = scaled(self.base, scale, scale)

    def observe(self, metrics: Sequence[ReplicaMetrics]) -> EngineProfile:
        for m in metrics:
            if m.waiting == 0 and m.ttft_p90_ms is not None and m.requests_per_s > 0:
                uncached = m.mean_prompt_tokens * (1.0 - min(max(m.cache_hit_rate, 0.0), 1.0))
                model = self.base.prefill_ms_for(uncached)
                if model > 0:
                    self.prefill += FIT_WEIGHT * (min(max(m.ttft_p90_ms / model, 0.01), 100.0) - self.prefill)
            if m.itl_p90_ms is not None and m.running > 0:
                model = self.base.decode_step_ms(m.running, m.mean_prompt_tokens + m.mean_output_tokens / 2)
                self.decode += FIT_WEIGHT * (min(max(m.itl_p90_ms / model, 0.01), 100.0) - self.decode)
        bp, bd = self._built
        if abs(self.prefill / bp - 1) > REBUILD_AT or abs(self.decode / bd - 1) > REBUILD_AT:
            self._built = (self.prefill, self.decode)
            self.profile = scaled(self.base, self.prefill, self.decode)
        return self.profile

    def get_state(self) -> dict[str, Any]:
        return {"prefill": self.prefill, "decode": self.decode}

    def set_state(self, st: dict[str, Any]) -> None:
        self.prefill = float(st.get("prefill", self.prefill))
        self.decode = float(st.get("decode", self.decode))
        self._built = (self.prefill, self.decode)
        self.profile = scaled(self.base, self.prefill, self.decode)
