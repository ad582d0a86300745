"""Arrival schedules and popularity skews: seeded, so every policy replays the same load."""

from __future__ import annotations

import random


def parse_skew(spec: str) -> float | None:
    """`uniform` -> None; `zipf:S` -> S (> 0)."""
    spec = spec.strip().lower()
    if spec == "uniform":
        return None
    if spec.startswith("zipf:"):
        s = float(spec.split(":", 1)[1])
        if s <= 0:
            raise ValueError("zipf exponent must be > 0")
        return s
    raise ValueError(f"tenant skew must be 'uniform' or 'zipf:S', got {spec!r}")


def popularity_weights(n: int, zipf_s: float | None) -> list[float]:
    """Normalised popularity of items 0..n-1; item 0 is the most popular under Zipf."""
    raw = [1.0] * n if zipf_s is None else [1.0 / (k + 1) ** zipf_s for k in range(n)]
    total = sum(raw)
    return [w / total for w in raw]


def parse_load_shape(spec: str | None) -> list[float] | None:
    """`step:1,4,1` -> [1.0, 4.0, 1.0] (rate multipliers, one per step); None/`constant` -> None."""
    if spec is None or spec.strip().lower() in ("", "constant"):
        return None
    kind, _, body = spec.partition(":")
    if kind.strip().lower() != "step" or not body:
        raise ValueError(f"load shape must be 'constant' or 'step:m1,m2,...', got {spec!r}")
    mults = [float(x) for x in body.split(",")]
    if not mults or any(m < 0 for m in mults) or not any(m > 0 for m in mults):
        raise ValueError("step multipliers must be >= 0 with at least one > 0")
    return mults


def poisson_arrivals(
    rate: float,
    seed: int,
    max_requests: int | None,
    shape: list[float] | None = None,
    step_seconds: float | None = None,
) -> list[float]:
    """Arrival offsets (s) of a Poisson process at `rate`/s, optionally piecewise-scaled.

    With a step shape the process runs at rate*m_i during step i (each `step_seconds`
    long) and ends after the last step, or at `max_requests`, whichever comes first.
    Without one it needs `max_requests`.
    """
    if rate <= 0:
        raise ValueError("rate must be > 0")
    rng = random.Random(f"{seed}:arrivals")
    if shape is None:
        if max_requests is None:
            raise ValueError("a constant-rate schedule needs a request count")
        t, out = 0.0, []
        for _ in range(max_requests):
            t += rng.expovariate(rate)
            out.append(t)
        return out
    if not step_seconds or step_seconds <= 0:
        raise ValueError("a step load shape needs step_seconds > 0")
    out: list[float] = []
    for i, mult in enumerate(shape):
        start, end = i * step_seconds, (i + 1) * step_seconds
        if mult == 0:
            continue
        # Memoryless: restarting the clock at each step boundary keeps it Poisson.
        t = start
        while True:
            t += rng.expovariate(rate * mult)
            if t >= end:
                break
            out.append(t)
            if max_requests is not None and len(out) >= max_requests:
                return out
    return out
