"""`kvserve bench --sweep batch`: the batch/latency table, measured on the live cluster.

For each batch size B, a closed loop keeps B requests in flight (so the engines run batches of B)
over max(8, ROUNDS x B) requests with unique random prompts (no prefix-cache hits) and exact output
lengths. Throughput rises near-linearly with B while decode is bound by memory bandwidth (each step
reads the weights once for the whole batch), latency grows slowly, then both saturate once a step
is bound by compute.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

from bench.runner import ReplayOptions, replay
from bench.workloads import multi_tenant

ROUNDS = 4  # requests per point = ROUNDS x batch: every worker sends a few, so steady batches dominate
ROW_KEYS = ("batch", "ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms", "output_tok_per_s")


def parse_batches(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--batch: comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch: batch sizes must be >= 1, got {text!r}")
    return sizes


def run_batch_sweep(opts: ReplayOptions, vocab, batches: Sequence[int], *, question_tokens: int,
                    output_tokens: int, seed: int, on_point: Callable[[dict], None] | None = None) -> list[dict]:
    rows = []
    for b in batches:
        n = max(8, ROUNDS * b)
        # A seed per point: no point's prompts are cached by an earlier one.
        wl = multi_tenant(vocab, tenants=1, system_tokens=0, question_tokens=question_tokens,
                          output_tokens=output_tokens, requests=n + b, seed=seed * 1000 + b)
        warm, reqs = wl.requests[:b], wl.requests[b:]  # one batch to reach steady state, excluded
        run = asyncio.run(replay(dataclasses.replace(opts, concurrency=b), reqs, policy=f"batch={b}", warmup=warm))
        m = run.metrics
        row = {"batch": b, "ttft_p50_ms": m.ttft_p50_ms, "itl_p50_ms": m.itl_p50_ms, "e2e_p50_ms": m.e2e_p50_ms,
               "output_tok_per_s": m.output_tok_per_s, "ttft_p90_ms": m.ttft_p90_ms, "itl_p90_ms": m.itl_p90_ms,
               "requests": m.requests, "errors": m.errors, "replicas": len(m.replica_requests),
               "client_loop_lag_max_ms": m.client_loop_lag_max_ms}
        rows.append(row)
        if on_point:
            on_point(row)
    return rows


def write_sweep(path: Path, rows: list[dict], params: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rows": rows, "params": params}, indent=1) + "\n")


def plot_batch_sweep(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = [r["batch"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(b, [r["output_tok_per_s"] for r in rows], "o-", color="tab:green")
    ax1.set_xlabel("batch (requests in flight)")
    ax1.set_ylabel("output tokens / s")
    ax1.set_title("throughput")
    for key, label in (("ttft_p50_ms", "TTFT p50"), ("itl_p50_ms", "ITL p50"), ("e2e_p50_ms", "end-to-end p50")):
        ax2.plot(b, [r[key] for r in rows], "o-", label=label)
    ax2.set_yscale("log")
    ax2.set_xlabel("batch (requests in flight)")
    ax2.set_ylabel("ms (log)")
    ax2.set_title("latency")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
