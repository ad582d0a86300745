"""Serving-path microbenchmark: kvserve's relay (proxy -> ingress -> replica) with a fake engine.

The real Ingress and router, and a replica that streams `bench.fake_engine` chunks through the
same Serve handle call as `LLMReplica`; against it, the same fake engine behind one plain
FastAPI/uvicorn process (what vLLM's own server is). With no model, what is measured is the
path: tokens/s, TTFT, ITL and the CPU each process spends per streamed token.

    python -m bench.serving_path --target kvserve --concurrency 1,32,128 --step-ms 20 --out sp.json
    python -m bench.serving_path --target bare ...

`--env K=V` sets environment for the server and everything it starts (Ray reads its
RAY_SERVE_* switches at import), to compare Serve's modes.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import typer

from bench.client import completion_body
from bench.fake_engine import FakeEngine, prompt_tokens
from bench.overhead import parse_levels, requests_for, run_entry
from bench.overhead_load import chunks_per_token, measure_levels, random_requests
from bench.prepare import load_tokenizer
from bench.profiling import Spies, cpu_by_role, per_token_us
from bench.runner import ReplayOptions
from bench.servers import free_port, running
from bench.tokens import SafeVocab
from cluster.local import shutdown, start_cluster, wait_ready
from cluster.serve_config import ingress_limits
from deployments.protocol import META, SSE
from kvserve.config import KVServeConfig, load_config

app = typer.Typer(add_completion=False)
FLOORS = {"serve-floor": 2, "serve-floor-1hop": 1}  # bench.serve_floor: Serve's hops, none of kvserve's work

class FakeReplica:
    """LLMReplica's streaming contract (META, then SSE chunks) over a fake engine."""

    async def __init__(self, config: dict, step_s: float, work_s: float) -> None:  # type: ignore[misc]

        self.cfg = KVServeConfig.model_validate(config)
        self.engine = FakeEngine(step_s, work_s, self.cfg.model.name)
        self.replica_id = f"fake-{os.getpid()}"

    async def record_routing_stats(self) -> dict[str, Any]:
        n = len(self.engine._running)
        return {"ready": True, "ts": time.time(), "block_size": self.cfg.engine.block_size, "blocks": [],
                "blocks_version": 0, "waiting": 0, "running": n, "queued_prefill_tokens": 0, "kv_usage": 0.0,
                "kv_capacity_tokens": 1 << 20}

    async def stats(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, "steps": self.engine.steps}

    async def generate(self, work: Any):
        entered = time.time()
        yield META, {"replica_id": self.replica_id}
        async for chunk in self.engine.stream(work.num_prompt_tokens, int(work.body.get("max_tokens") or 16), entered):
            yield SSE, chunk


def fake_app(cfg: Any, step_s: float, work_s: float):
    """deployments.app.build_app's graph with FakeReplica in LLMReplica's place."""
    from ray import serve

    from deployments.app import replica_options
    from deployments.ingress import Ingress

    config = {**cfg.model_dump(mode="json"), "num_replicas": 1}
    replica = serve.deployment(FakeReplica).options(**replica_options(cfg)).bind(config, step_s, work_s)
    ingress = serve.deployment(Ingress).options(name="Ingress", num_replicas=1, ray_actor_options={"num_cpus": 0},
                                                **ingress_limits(cfg))
    return ingress.bind(replica, config)


def bare_app(step_s: float, work_s: float, model: str):
    """The fake engine behind one Starlette process (FastAPI's base), streamed as vLLM's server streams."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route


    engine = FakeEngine(step_s, work_s, model)

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def completions(request):
        body = await request.json()
        return StreamingResponse(engine.stream(prompt_tokens(body), int(body.get("max_tokens") or 16), time.time()),
                                 media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])


def _serve_ray(cfg: Any, application: Any, ready: bool = True) -> None:
    from ray import serve


    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    started = start_cluster(cfg, join_existing=False)
    try:
        serve.start(http_options={"host": cfg.server.host, "port": cfg.server.port})
        serve.run(application, name=cfg.app_name, route_prefix="/", blocking=False)
        if ready:  # kvserve's /ready; the floor apps are ready once serve.run returns
            wait_ready(cfg, 600)
        print("serving", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        shutdown(started)


@app.command("serve", hidden=True)
def serve_cmd(target: str = typer.Option(...), port: int = typer.Option(...), step_ms: float = typer.Option(...),
              work_us: float = typer.Option(0.0), config: Optional[Path] = typer.Option(None)) -> None:
    """(internal) Run one target until SIGINT/SIGTERM."""
    cfg = load_config(config, overrides={"num_replicas": 1, "autoscaling": {"enabled": False},
                                         "server": {"host": "127.0.0.1", "port": port},
                                         "tenants": {"open_mode": True}})  # loopback only, a fake engine
    if target == "bare":
        import uvicorn

        uvicorn.run(bare_app(step_ms / 1000.0, work_us / 1e6, cfg.model.name), host="127.0.0.1", port=port,
                    log_level="warning", access_log=False)
    elif target in FLOORS:
        from bench.serve_floor import floor_app

        _serve_ray(cfg, floor_app(step_ms / 1000.0, work_us / 1e6, cfg.model.name, FLOORS[target]), ready=False)
    else:
        _serve_ray(cfg, fake_app(cfg, step_ms / 1000.0, work_us / 1e6))


async def probe_legs(opts: Any, vocab: Any, n: int, prompt_tokens: int) -> dict[str, float]:
    """Median legs of TTFT over n sequential requests: client -> server handler (`to_server`),
    handler -> first chunk sent (`server`, the fake engine's first step), first chunk -> client
    (`to_client`). One machine, one wall clock."""
    legs: dict[str, list[float]] = {"to_server": [], "server": [], "to_client": [], "ttft": []}
    async with httpx.AsyncClient(timeout=60) as client:
        for req in random_requests(vocab, n, prompt_tokens, 2, "sp:probe"):
            sent = time.time()
            async with client.stream("POST", f"{opts.base_url}/v1/completions",
                                     json=completion_body(req, opts.model)) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data:") and "kvserve_probe" in line:
                        got = time.time()
                        p = json.loads(line[5:])["kvserve_probe"]
                        legs["to_server"].append((p["entered"] - sent) * 1000)
                        legs["server"].append((p["first_sent"] - p["entered"]) * 1000)
                        legs["to_client"].append((got - p["first_sent"]) * 1000)
                        legs["ttft"].append((got - sent) * 1000)
    return {k: round(statistics.median(v), 2) for k, v in legs.items() if v}


@app.command("run")
def run_cmd(
    target: str = typer.Option("kvserve", "--target", help="kvserve, bare, serve-floor (proxy -> ingress -> replica, "
                               "pass-through) or serve-floor-1hop (proxy -> one deployment)"),
    concurrency: str = typer.Option("1,32,128", "--concurrency"),
    tokens: int = typer.Option(64, "--tokens", min=1, help="Output tokens per request."),
    prompt_tokens: int = typer.Option(16, "--prompt-tokens", min=1),
    step_ms: float = typer.Option(20.0, "--step-ms", help="The fake engine's decode step."),
    work_us: float = typer.Option(0.0, "--work-us", help="CPU burnt per token in the output step."),
    per_slot: int = typer.Option(4, "--requests-per-slot", min=1),
    min_requests: int = typer.Option(8, "--min-requests", min=1),
    env: list[str] = typer.Option([], "--env", help="K=V for the server and all it starts."),
    probes: int = typer.Option(20, "--probes", min=0, help="Sequential requests that split TTFT into path legs."),
    direct_ingress: bool = typer.Option(False, "--direct-ingress", help="kvserve: Serve's direct ingress (the "
                                        "Ingress replica serves HTTP itself; the client skips the proxy)."),
    config: Optional[Path] = typer.Option(None, "--config"),
    label: str = typer.Option("", "--label"),
    pyspy: Optional[Path] = typer.Option(None, "--py-spy", help="Record py-spy stacks per role and level here."),
    out: Optional[Path] = typer.Option(None, "--out", help="Append one JSON line here."),
) -> None:
    """Start the target, run the closed-loop levels, print (and append) one JSON result."""
    import psutil


    cfg = load_config(config)
    levels = parse_levels(concurrency)
    vocab = SafeVocab(load_tokenizer(cfg.model))
    extra = dict(kv.split("=", 1) for kv in env)
    port = free_port()
    serve_port = port
    if direct_ingress:  # the ingress replica takes `port` (its own uvicorn); the proxy another one
        serve_port = free_port()
        extra.update({"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(port),
                      "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(port + 1)})
    cmd = [sys.executable, "-m", "bench.serving_path", "serve", "--target", target, "--port", str(serve_port),
           "--step-ms", str(step_ms), "--work-us", str(work_us)] + (["--config", str(config)] if config else [])
    ready = f"http://127.0.0.1:{port}" + ("/ready" if target == "kvserve" else "/v1/models")
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"serving-path-{target}-{port}.log"
    result: dict[str, Any] = {"label": label or target, "target": target, "env": extra, "step_ms": step_ms,
                              "work_us": work_us, "tokens": tokens, "cpus": len(os.sched_getaffinity(0)), "runs": {}}
    with running(cmd, env={"RAY_USAGE_STATS_ENABLED": "0", **extra}, ready_url=ready, log=log, timeout_s=600,
                 stop_signal=signal.SIGINT) as proc:
        opts = ReplayOptions(base_url=f"http://127.0.0.1:{port}", model=cfg.model.name, timeout_s=300)
        me = psutil.Process()
        asyncio.run(measure_levels(opts, {}, random_requests(vocab, 2, prompt_tokens, tokens, "sp:warm")))
        for c in levels:
            reqs = random_requests(vocab, requests_for(c, per_slot, min_requests), prompt_tokens, tokens, f"sp:{c}")
            spies = Spies(proc.pid, pyspy, f"{label or target}-c{c}") if pyspy else None
            before = {**cpu_by_role(proc.pid), "client": sum(me.cpu_times()[:2])}
            t0 = time.perf_counter()
            kept: dict = {}
            m = asyncio.run(measure_levels(opts, {c: reqs}, keep=kept))[c]
            wall = time.perf_counter() - t0
            after = {**cpu_by_role(proc.pid), "client": sum(me.cpu_times()[:2])}
            if spies:
                spies.stop()
            n_tok = int(round(m.output_tok_per_s * m.duration_s))
            entry = run_entry(m.to_dict())
            entry["cpu_us_per_token"] = per_token_us(before, after, n_tok)
            entry["cpu_busy_fraction"] = round(sum(after[k] - before.get(k, 0.0) for k in after) / wall, 2)
            entry["ideal_tok_per_s"] = round(c * 1000.0 / step_ms, 1)
            entry["chunks_per_token"] = chunks_per_token(kept[c])
            result["runs"][f"c{c}"] = entry
            print(json.dumps({f"c{c}": entry}), flush=True)
        if probes:
            result["ttft_legs_ms"] = asyncio.run(probe_legs(opts, vocab, probes, prompt_tokens))
            print(json.dumps({"ttft_legs_ms": result["ttft_legs_ms"]}), flush=True)
    print(json.dumps(result), flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    app()
