"""PNG plots: TTFT CDF per policy, and the scaling-run timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from bench.runner import PolicyRun  # noqa: E402
from bench.timeline import TimelineRow  # noqa: E402


def plot_ttft_cdf(runs: Sequence[PolicyRun], path: str | Path, title: str = "TTFT distribution") -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in runs:
        xs = sorted(run.metrics.ttft_ms_all)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{run.policy} (p90 {run.metrics.ttft_p90_ms:.0f} ms)")
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_timeline(rows: Sequence[TimelineRow], path: str | Path, title: str = "load, TTFT p90 and replicas") -> None:
    t = [r.second for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    ax1.plot(t, [r.sent for r in rows], label="sent/s")
    ax1.plot(t, [r.inflight for r in rows], label="in flight")
    ax1.set_ylabel("requests")
    ax1.legend(loc="upper right")
    ax2.plot(t, [r.ttft_p90_ms if r.ttft_p90_ms is not None else float("nan") for r in rows], color="tab:red")
    ax2.set_ylabel("TTFT p90 (ms)")
    ax3.step(t, [r.replicas if r.replicas is not None else float("nan") for r in rows], where="post", color="tab:green")
    ax3.set_ylabel("replicas")
    ax3.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax3.set_ylim(0, max([r.replicas or 0 for r in rows] + [1]) + 1)
    ax3.set_xlabel("time (s)")
    for ax in (ax1, ax2, ax3):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
