"""Fit an engine profile's host path (`EngineProfile.host_ms`) from live bench runs' TTFT breakdowns.

    python -m bench.host_fit PROFILE.json LIVE.json [LIVE.json ...] [--policy kvserve]

Per run, the host path of a typical request is its median TTFT at the client less the engine's median
scheduler wait and prefill (`ttft_breakdown_ms`): the time spent in the HTTP proxy, the ingress,
routing, the Serve hop and the replica's own input and output processing. Each closed-loop run holds
concurrency / replicas streams open on a replica; a least-squares line through (streams, host ms)
over the runs gives `host: {ms, ms_per_stream}`, written into PROFILE. Medians, not means: the host
path has a long tail (the mean is about twice the median on an H100 shared by 4 replicas) that one
line per stream count cannot carry, and the simulator is compared with live runs at p50 and p90.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def host_point(run: dict[str, Any], policy: str) -> tuple[float, float]:
    """(streams per replica, host ms) of one bench JSON's `policy`."""
    w, p = run["workload"], run["policies"][policy]
    t = p["ttft_breakdown_ms"]
    streams = w["concurrency"] / p["replicas"]
    return streams, t["client"]["p50"] - t["engine_queue"]["p50"] - t["engine_prefill"]["p50"]


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) by least squares; one point (or one stream count): a flat line through their mean.
    Neither goes below zero: a host path takes time."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = max(sum((x - mx) * (y - my) for x, y in points) / var, 0.0) if var else 0.0
    return max(my - slope * mx, 0.0), slope


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", type=Path)
    ap.add_argument("live", type=Path, nargs="+")
    ap.add_argument("--policy", default="kvserve", help="the policy whose runs are fitted (the others are held out)")
    a = ap.parse_args(argv)
    points = [host_point(json.loads(f.read_text()), a.policy) for f in a.live]
    base, per_stream = fit_line(points)
    prof = json.loads(a.profile.read_text())
    prof["host"] = {"ms": round(base, 1), "ms_per_stream": round(per_stream, 2),
                    "fitted_from": f"python -m bench.host_fit (policy {a.policy}; streams per replica, host ms: "
                                   + ", ".join(f"{x:g}: {y:.0f}" for x, y in points) + ")"}
    a.profile.write_text(json.dumps(prof, indent=1) + "\n")  # as `kvserve profile` writes it
    print(json.dumps(prof["host"], indent=1))


if __name__ == "__main__":
    main()
