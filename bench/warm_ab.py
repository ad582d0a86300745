"""Scale-up TTFT with and without prefix warming (issue 5, item 4), on the live CPU cluster.

For each setting: 1 replica serves 4 tenants (5 requests each) (each with a ~500-token system prompt) so the ingress
learns the hot prefixes; the deployment then scales to 2 (a lightweight rescale, like the
autoscaler's), and a burst of 24 requests at concurrency 8 measures TTFT while the new replica
takes its first traffic. Run: `python -m bench.warm_ab` (starts and stops its own local cluster).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import statistics
import sys
import time

import httpx

from cluster.local import base_url, deploy, shutdown, start_cluster
from kvserve.config import load_config

TENANTS = 4


def _system(t: int) -> str:
    return " ".join(f"Tenant {t} rule {i}: answer in a formal tone and cite section {i * 3 + t}." for i in range(28))


def _ttft(url: str, model: str, t: int, q: str) -> tuple[float, str]:
    body = {"model": model, "max_tokens": 8, "temperature": 0, "stream": True,
            "messages": [{"role": "system", "content": _system(t)}, {"role": "user", "content": q}]}
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return (time.perf_counter() - start) * 1000, r.headers["x-kvserve-replica"]
    return (time.perf_counter() - start) * 1000, r.headers["x-kvserve-replica"]


def run(warm_prefixes: int) -> dict:
    cfg = load_config(overrides={"num_replicas": 1, "tenants": {"open_mode": True},
                                 "autoscaling": {"warm_prefixes": warm_prefixes}}, environ={})
    deploy(cfg, address=None)
    url, model = base_url(cfg), cfg.model.name
    for i in range(5):  # the hot set: every tenant seen 5 times, over autoscaling.warm_min_requests (2)
        for t in range(TENANTS):
            _ttft(url, model, t, f"warm-up question {i}?")
    time.sleep(6)  # the ingress posts hot prefixes every 5 s; replicas post stats every second
    old = {s["replica_id"] for s in httpx.get(url + "/kvserve/stats").json()["replicas"]}
    deploy(cfg.model_copy(update={"num_replicas": 2}), address=None)
    new: list[dict] = []
    for _ in range(15):  # the new replica serves; its first stats reach the board within a second or two
        new = [s for s in httpx.get(url + "/kvserve/stats").json()["replicas"] if s["replica_id"] not in old]
        if new:
            break
        time.sleep(1)
    jobs = [(t % TENANTS, f"burst question {t}?") for t in range(24)]
    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda j: _ttft(url, model, *j), jobs))
    ttfts = [x for x, _ in results]
    on_new = [x for x, rid in results if rid not in old]
    q = lambda xs, p: sorted(xs)[min(int(p * len(xs)), len(xs) - 1)] if xs else None  # noqa: E731
    return {"warm_prefixes": warm_prefixes, "warmed_on_new_replica": new[0].get("warmed_prefixes") if new else None,
            "warm_s": new[0].get("warm_s") if new else None,
            "ttft_p50_ms": statistics.median(ttfts), "ttft_p90_ms": q(ttfts, 0.9), "ttft_max_ms": max(ttfts),
            "requests_on_new_replica": len(on_new),
            "new_replica_ttft_p50_ms": statistics.median(on_new) if on_new else None}


def main() -> None:
    started = start_cluster(load_config(overrides={"tenants": {"open_mode": True}}, environ={}), join_existing=False)
    try:
        out = [run(4), run(0)]
    finally:
        shutdown(started)
    print(json.dumps(out, indent=1))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
