"""Where does a burst go right after a true scale-up 1 -> 2 (issue 5 item 4)?

Like `bench.warm_ab` with warming on, but it waits WAIT_S seconds after the new replica is ready
(so its routing stats have reached the routers), prints both replicas' stats, then sends the same
24-request burst and counts the requests served by the new replica.
Run: `python -m bench.scaleup_probe [WAIT_S]` (starts and stops its own local cluster).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import sys
import time

import httpx

from bench import warm_ab
from cluster.local import base_url, deploy, shutdown, start_cluster
from kvserve.config import load_config


def main() -> None:
    wait_s = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    cfg = load_config(overrides={"num_replicas": 1, "tenants": {"open_mode": True},
                                 "autoscaling": {"warm_prefixes": 4}}, environ={})
    started = start_cluster(cfg, join_existing=False)
    try:
        deploy(cfg, address=None)
        url, model = base_url(cfg), cfg.model.name
        for i in range(5):  # the hot set, as in warm_ab
            for t in range(warm_ab.TENANTS):
                warm_ab._ttft(url, model, t, f"warm-up question {i}?")
        time.sleep(6)
        old = {s["replica_id"] for s in httpx.get(url + "/kvserve/stats").json()["replicas"]}
        deploy(cfg.model_copy(update={"num_replicas": 2}), address=None)
        time.sleep(wait_s)
        stats = httpx.get(url + "/kvserve/stats").json()["replicas"]
        print(json.dumps([{k: s.get(k) for k in ("replica_id", "cached_blocks", "warmed_prefixes", "num_requests")}
                          for s in stats]))
        jobs = [(t % warm_ab.TENANTS, f"burst question {t}?") for t in range(24)]
        with cf.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda j: warm_ab._ttft(url, model, *j), jobs))
        print(json.dumps({"wait_s": wait_s, "requests_on_new_replica": sum(1 for _, rid in results if rid not in old),
                          "ttft_ms": sorted(round(x) for x, _ in results)}))
    finally:
        shutdown(started)


if __name__ == "__main__":
    main()
