"""PNG plots of simulator runs (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from simulator.cluster import RunResult  # noqa: E402


def ttft_cdf(results: dict[str, RunResult], path: str | Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        ttft = np.sort([(r.first_token - r.arrival) * 1000.0 for r in res.requests if r.first_token is not None])
        if len(ttft):
            ax.plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), label=name)
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title or "TTFT CDF per routing policy (simulated)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def autoscaling_timeline(results: dict[str, RunResult], path: str | Path, ttft_slo_ms: float, title: str = "",
                         oracle_need: list[int] | None = None) -> Path:
    """`oracle_need`: the oracle's replicas per minute, drawn as a dashed step on the replicas panel."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    if oracle_need:
        end = max((res.end_time for res in results.values()), default=0.0)
        edges = [60.0 * m for m in range(len(oracle_need))] + [max(end, 60.0 * (len(oracle_need) - 1) + 1.0)]
        axes[0].stairs(oracle_need, edges, color="k", ls="--", lw=1, label="oracle (per minute)")
    for name, res in results.items():
        tl = res.timeline
        t = [row["t"] for row in tl]
        axes[0].step(t, [row["existing"] for row in tl], where="post", label=name)
        axes[1].plot(t, [row["ttft_p90_ms"] if row["ttft_p90_ms"] is not None else np.nan for row in tl], label=name)
        axes[2].plot(t, [row["arrivals_per_s"] for row in tl], label=name, alpha=0.7)
    axes[0].set_ylabel("replicas (incl. starting, draining)")
    axes[1].set_ylabel("TTFT p90, last 10 s (ms)")
    axes[1].axhline(ttft_slo_ms, color="k", ls="--", lw=1, label="SLO")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("arrivals / s")
    axes[2].set_xlabel("time (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_title(title or "Autoscaling timeline (simulated)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
