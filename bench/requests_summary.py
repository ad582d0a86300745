"""Summaries of per-request records (`kvserve bench/sim --requests-jsonl`): cold vs cache-hit TTFT.

A run's TTFT p90 mixes two populations: requests whose prompt prefix was cached
(hits) and those that prefilled most of it (colds, cached < half the prompt).
Splitting them shows whether a policy lost on placement (more colds) or on
queueing (slower hits), and lets a live run be set beside its simulation.

    python -m bench.requests_summary live.jsonl sim.jsonl
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from bench.metrics import percentile, share_max_over_mean

COLD_CACHED_FRACTION = 0.5  # a request with less than this fraction of its prompt cached counts as cold


def read_rows(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """policy -> its records, in file order."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["policy"]].append(row)
    return dict(out)


def is_cold(row: dict[str, Any]) -> bool:
    cached, prompt = row.get("cached_tokens"), row.get("prompt_tokens")
    return cached is not None and bool(prompt) and cached < COLD_CACHED_FRACTION * prompt


def summarize_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if r.get("ok") and r.get("ttft_ms") is not None]
    cold = [r["ttft_ms"] for r in ok if is_cold(r)]
    hit = [r["ttft_ms"] for r in ok if not is_cold(r)]
    per_replica = Counter(r["replica"] for r in ok)
    tenants: dict[str, set[str]] = defaultdict(set)
    for r in ok:
        tenants[r["tenant"]].add(r["replica"])
    return {
        "requests": len(ok),
        "ttft_p50_ms": percentile([r["ttft_ms"] for r in ok], 50),
        "ttft_p90_ms": percentile([r["ttft_ms"] for r in ok], 90),
        "cold": len(cold),
        "cold_ttft_p50_ms": percentile(cold, 50),
        "cold_ttft_p90_ms": percentile(cold, 90),
        "hit_ttft_p50_ms": percentile(hit, 50),
        "hit_ttft_p90_ms": percentile(hit, 90),
        "share_max_over_mean": share_max_over_mean(dict(per_replica)),
        "tenants_on_several_replicas": sum(1 for reps in tenants.values() if len(reps) > 1),
        "duration_s": max((r["sent_s"] + (r["e2e_ms"] or 0.0) / 1000.0 for r in ok), default=0.0),
    }


_COLUMNS = (
    ("requests", "{:d}"), ("ttft_p50_ms", "{:.0f}"), ("ttft_p90_ms", "{:.0f}"), ("cold", "{:d}"),
    ("cold_ttft_p50_ms", "{:.0f}"), ("cold_ttft_p90_ms", "{:.0f}"), ("hit_ttft_p50_ms", "{:.0f}"),
    ("hit_ttft_p90_ms", "{:.0f}"), ("share_max_over_mean", "{:.2f}"), ("tenants_on_several_replicas", "{:d}"),
    ("duration_s", "{:.0f}"),
)


def main(files: list[Path] = typer.Argument(..., help="JSONL files from --requests-jsonl.")) -> None:
    table = Table(title=f"per-request summary (cold: < {COLD_CACHED_FRACTION:g} of the prompt cached)")
    table.add_column("file:policy", style="bold")
    for name, _ in _COLUMNS:
        table.add_column(name, justify="right")
    for f in files:
        for policy, rows in read_rows(f).items():
            s = summarize_rows(rows)
            table.add_row(f"{f.name}:{policy}", *("-" if s[k] is None else fmt.format(s[k]) for k, fmt in _COLUMNS))
    Console(width=250).print(table)


if __name__ == "__main__":
    typer.run(main)
