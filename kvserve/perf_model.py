"""Engine performance model from a measured profile (`kvserve profile` or ../shared/profiles).

Used by the router's cost model, the autoscaler's capacity model and the
simulator, so all three predict with the same numbers. Pure Python.

Profile JSON (what `kvserve profile` writes; the shared H200 profile has the same keys):
  block_size, kv_cache_tokens,
  prefill: [{prompt_tokens, cached_fraction, ttft_ms}],
  decode:  [{context_tokens, batch, itl_ms}],
  prefill_ms_per_cached_token (optional; `kvserve profile` fits it, see `fit_cached_token_ms`)
  host: {ms, ms_per_stream} (optional; `python -m bench.host_fit` measures it from a live bench)

`host` is the time a request spends outside the engine before its first token reaches the client
(HTTP proxy, ingress, routing, the Serve hop, the replica's own input and output processing), as
ms + ms_per_stream x the streams open on its replica: on a GPU that shares its host's CPUs among
several replicas it is a large part of TTFT. Profiles without it have none.

With `prefill_ms_per_cached_token`, prefill time = cold curve(new tokens) + that
slope x the cached context the new tokens attend to: a cache hit is cheap, not
free (on this CPU a cached token costs ~1/15 of a new one, which is most of a
hit's TTFT). Without it (older profiles), every point is read as a cost of its
uncached tokens alone.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation, linear extrapolation beyond the ends."""
    if len(xs) == 1:
        return ys[0] * (x / xs[0] if xs[0] else 1.0)
    i = bisect.bisect_left(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y0


@dataclass
class EngineProfile:
    block_size: int
    kv_cache_tokens: int
    # uncached prompt tokens -> prefill ms (fit over cold and cached points alike)
    prefill_tokens: list[float]
    prefill_ms: list[float]
    # batch size -> decode step ms, per context length
    decode: dict[int, tuple[list[float], list[float]]]
    source: str = ""
    cached_token_ms: float = 0.0  # prefill ms per cached context token the new tokens attend to
    host_base_ms: float = 0.0  # a request's time outside the engine before its first token: base ...
    host_ms_per_stream: float = 0.0  # ... plus this per stream open on its replica

    @classmethod
    def from_dict(cls, d: dict, source: str = "") -> EngineProfile:
        cached_ms = float(d.get("prefill_ms_per_cached_token", 0.0))
        points = d["prefill"]
        if cached_ms > 0:  # the curve is the cold points; hits add the context term
            points = [p for p in points if not p.get("cached_fraction")] or points
        pts: dict[float, list[float]] = {}
        for p in points:
            uncached = round(p["prompt_tokens"] * (1.0 - p.get("cached_fraction", 0.0)))
            pts.setdefault(float(uncached), []).append(float(p["ttft_ms"]))
        xs = sorted(pts)
        ys = [sorted(pts[x])[len(pts[x]) // 2] for x in xs]
        # Enforce monotone non-decreasing cost (measurement noise at small sizes).
        for i in range(1, len(ys)):
            ys[i] = max(ys[i], ys[i - 1])
        dec: dict[int, tuple[list[float], list[float]]] = {}
        for p in d["decode"]:
            bx, by = dec.setdefault(int(p["context_tokens"]), ([], []))
            bx.append(float(p["batch"]))
            by.append(float(p["itl_ms"]))
        for ctx, (bx, by) in list(dec.items()):
            order = sorted(range(len(bx)), key=bx.__getitem__)
            dec[ctx] = ([bx[i] for i in order], [by[i] for i in order])
        host = d.get("host") or {}
        return cls(int(d.get("block_size", 16)), int(d["kv_cache_tokens"]), xs, ys, dec, source, cached_ms,
                   float(host.get("ms", 0.0)), float(host.get("ms_per_stream", 0.0)))

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        return cls.from_dict(json.loads(Path(path).read_text()), source=str(path))

    def prefill_ms_for(self, uncached_tokens: float, cached_context: float = 0.0) -> float:
        cold = max(0.0, _interp(self.prefill_tokens, self.prefill_ms, max(uncached_tokens, 0.0)))
        return cold + self.cached_token_ms * max(cached_context, 0.0)

    def host_ms(self, streams: int) -> float:
        """Time outside the engine before the first token, for a request that finds `streams` open on its
        replica (itself included)."""
        return self.host_base_ms + self.host_ms_per_stream * max(streams, 1)

    def prefill_ms_per_token(self) -> float:
        """Marginal prefill cost at the large end of the profile (the router's cost slope)."""
        xs, ys = self.prefill_tokens, self.prefill_ms
        if len(xs) < 2:
            return ys[0] / max(xs[0], 1.0)
        return max((ys[-1] - ys[0]) / max(xs[-1] - xs[0], 1.0), 1e-6)

    def decode_step_ms(self, batch: int, context_tokens: float = 512) -> float:
        """One decode step's time (= ITL) for `batch` running sequences at `context_tokens`."""
        ctxs = sorted(self.decode)
        batch = max(batch, 1)
        vals = [_interp(*self.decode[c], float(batch)) for c in ctxs]
        if len(ctxs) == 1:
            return vals[0]
        return max(_interp([float(c) for c in ctxs], vals, float(context_tokens)), 0.1)

    def max_decode_batch_for_itl(self, itl_ms: float, context_tokens: float = 512, cap: int = 1024) -> int:
        """Largest batch whose decode step stays within `itl_ms` (at least 1)."""
        lo, hi = 1, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.decode_step_ms(mid, context_tokens) <= itl_ms:
                lo = mid
            else:
                hi = mid - 1
        return lo


def fit_cached_token_ms(prefill: list[dict]) -> float:
    """Extra TTFT of the warm points over the cold curve, per cached token (least squares through 0, >= 0).

    Weighted by cached tokens, so the long cached contexts a real hit has dominate the noisy small ones.
    """
    cold = EngineProfile.from_dict({"prefill": [p for p in prefill if not p.get("cached_fraction")],
                                    "decode": [], "kv_cache_tokens": 0})
    extra = cached_total = 0.0
    for p in prefill:
        frac = p.get("cached_fraction") or 0.0
        if frac <= 0:
            continue
        cached = p["prompt_tokens"] * frac
        extra += p["ttft_ms"] - cold.prefill_ms_for(p["prompt_tokens"] - cached)
        cached_total += cached
    return max(extra / cached_total, 0.0) if cached_total else 0.0
