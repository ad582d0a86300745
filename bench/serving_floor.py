"""Collects `bench.serving_path` runs at concurrency 1 into the serving-path floor table: how much TTFT
Serve's own hops add over one plain process (bare), and how much kvserve adds beyond them.

    python -m bench.serving_floor RUNS.jsonl OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.sweep_cli import host_description

ORDER = ("bare", "serve-floor-1hop", "serve-floor", "kvserve")


def floor_table(lines: list[dict]) -> dict:
    by = {d["target"]: d for d in lines}  # the last run of each target
    missing = [t for t in ORDER if t not in by]
    if missing:
        raise ValueError(f"no run of {', '.join(missing)}")
    ttft = {t: by[t]["runs"]["c1"]["ttft_p50_ms"] for t in ORDER}
    return {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "host": host_description(),
        "step_ms": by["bare"]["step_ms"], "tokens": by["bare"]["tokens"],
        "ttft_p50_ms": {t: round(v, 2) for t, v in ttft.items()},
        "added_over_bare_ms": {t: round(ttft[t] - ttft["bare"], 2) for t in ORDER[1:]},
        "kvserve_over_two_hop_floor_ms": round(ttft["kvserve"] - ttft["serve-floor"], 2),
        "ttft_legs_ms": {t: by[t].get("ttft_legs_ms") for t in ORDER},
    }


def main(argv: list[str]) -> None:
    src, out = Path(argv[0]), Path(argv[1])
    table = floor_table([json.loads(line) for line in src.read_text().splitlines() if line.strip()])
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps(table["added_over_bare_ms"]), "kvserve over the two-hop floor:", table["kvserve_over_two_hop_floor_ms"])


if __name__ == "__main__":
    main(sys.argv[1:])
