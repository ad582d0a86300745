"""One GPU run for what CPU CI cannot check: kvserve on the installed vLLM and Ray (every compat
name, ray_prefix), and replicas that share a GPU with KV caches sized to their shares.

    python3 -m bench.gpu_check OUT bench/configs/gpu-8b-2replicas.yaml:ray_prefix bench/configs/gpu-8b-4replicas.yaml

Each CONFIG[:POLICY] is served in turn (`kvserve serve`, stopped before the next), answers a chat
request, a streamed completion and a repeated shared prefix (cached_tokens > 0), and its replicas'
KV capacity is set beside the plan. OUT/gpu-check.json is rewritten after every step, so a run cut
short keeps what it had; OUT/<config>.serve.log and OUT/<config>.raylogs.tgz hold the logs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from deployments import vllm_compat
from deployments.vllm_args import engine_cli_args, gpu_device_memory, parse_vllm_args
from kvserve.config import KVServeConfig, load_config
from kvserve.model import resolve_model_path
from kvserve.model_footprint import kv_bytes_for_tokens, local_model_dir

# Lines of the engines' logs that tell how memory went (vLLM's own words, and ours), and failures.
MEMORY_LINES = re.compile(r"Available KV cache memory|for KV Cache as specified|KV cache size|GiB for KV cache|"
                          r"Model loading took|CUDA graph pool memory|Graph capturing finished")
ERROR_LINES = re.compile(r"OutOfMemory|out of memory|Traceback|Error")
RAY_LOGS = Path("/tmp/ray/session_latest/logs")


def _gpu() -> dict[str, Any]:
    """From nvidia-smi: this checker must not hold a CUDA context (it would take GPU memory)."""
    try:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader,nounits"]
        out = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        name, total, used = (x.strip() for x in out.split(","))
        return {"name": name, "memory_total_mib": int(total), "memory_used_mib": int(used)}
    except Exception as e:  # no GPU here (a CPU dry run)
        return {"error": str(e)}


def static_checks(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """Where each vLLM name resolved, ray_prefix's class, and each config's vLLM args and KV plan."""
    import ray

    from deployments.app import request_router_config

    result: dict[str, Any] = {"vllm": vllm_compat.vllm_version(), "ray": ray.__version__, "gpu": _gpu(),
                              "compat": {}, "configs": {}, "errors": []}

    def check(key: str, fn) -> Any:  # one failure is recorded; the other checks still run
        try:
            return fn()
        except Exception as e:
            result["errors"].append(f"{key}: {type(e).__name__}: {e}")
            return None

    for n in vllm_compat._CANDIDATES:
        o = check(n, lambda: vllm_compat.get(n))
        result["compat"][n] = o and f"{getattr(o, '__module__', '?')}.{getattr(o, '__qualname__', n)}"
    result["client_errors"] = check("client_errors", lambda: [e.__name__ for e in vllm_compat.client_errors()])
    result["unfinished_on_engine"] = check("AsyncLLM", lambda: hasattr(vllm_compat.get("AsyncLLM"),
                                                                      "get_num_unfinished_requests"))
    cls = check("ray_prefix", lambda: request_router_config(
        KVServeConfig.model_validate({"router": {"policy": "ray_prefix"}})).get_request_router_class())
    result["ray_prefix"] = cls and f"{cls.__module__}.{cls.__name__}"
    for path, _ in configs:
        def plan(path: str = path) -> dict[str, Any]:
            cfg = load_config(path)
            device = gpu_device_memory(cfg)
            args = engine_cli_args(cfg, device_memory_bytes=device)
            parse_vllm_args(args)  # the installed vLLM's parser takes every flag
            return {"device_memory_bytes": device, "vllm_args": args, "planned_kv_tokens": planned_kv_tokens(cfg, args)}
        result["configs"][path] = check(path, plan)
    return result


def planned_kv_tokens(cfg: Any, args: list[str]) -> int | None:
    if "--kv-cache-memory-bytes" not in args:
        return None

    per_block = kv_bytes_for_tokens(cfg, local_model_dir(resolve_model_path(cfg.model)), cfg.engine.block_size)
    return int(args[args.index("--kv-cache-memory-bytes") + 1]) // per_block * cfg.engine.block_size


def _http(url: str, body: dict | None = None, timeout: float = 120) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def exercise(base: str, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    status, text = _http(f"{base}/v1/chat/completions", {
        "model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]})
    out["chat"] = {"status": status, "usage": json.loads(text).get("usage") if status == 200 else text[:500]}
    status, text = _http(f"{base}/v1/completions", {"model": model, "prompt": "One, two,", "max_tokens": 8,
                                                    "stream": True})
    out["completion_stream"] = {"status": status, "chunks": text.count("data: {"), "done": "[DONE]" in text}
    system = "You are a terse assistant. " * 120  # ~700 tokens: many full blocks
    cached = []
    for q in ("First question?", "Second question?"):
        status, text = _http(f"{base}/v1/chat/completions", {"model": model, "max_tokens": 4, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": q}]})
        usage = (json.loads(text).get("usage") or {}) if status == 200 else {}
        cached.append((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
    out["shared_prefix_cached_tokens"] = cached
    status, text = _http(f"{base}/kvserve/stats")
    out["replicas"] = [{k: r.get(k) for k in ("replica_id", "kv_capacity_tokens", "prefix_cache_hits", "kv_events")}
                       for r in json.loads(text)["replicas"]] if status == 200 else text[:500]
    return out


def _log_lines(pattern: re.Pattern, limit: int) -> list[str]:
    lines: list[str] = []
    for f in sorted(RAY_LOGS.rglob("*.*")) if RAY_LOGS.is_dir() else []:
        if f.name.startswith("worker-") or f.parent.name == "serve":  # engines and replicas, not Ray's own
            lines += [f"{f.name}: {ln.strip()[:400]}" for ln in f.read_text(errors="replace").splitlines()
                      if pattern.search(ln)]
    return lines[:limit]


def serve_and_check(path: str, policy: str | None, out_dir: Path, deadline: float) -> dict[str, Any]:
    cfg = load_config(path)
    stem = Path(path).stem + (f"-{policy}" if policy else "")
    cmd = [sys.executable, "-m", "cli", "serve", "--config", path] + (["--policy", policy] if policy else [])
    log = (out_dir / f"{stem}.serve.log").open("w")
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "INFO"}  # vLLM's memory lines are INFO
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            start_new_session=True)
    base = f"http://{cfg.server.host}:{cfg.server.port}"
    result: dict[str, Any] = {"policy": policy or cfg.router.policy}
    start = time.monotonic()
    try:
        while True:
            if proc.poll() is not None:
                result["error"] = f"serve exited with {proc.returncode} before answering"
                break
            if time.monotonic() > deadline:
                result["error"] = "not up before the deadline"
                break
            try:
                if _http(f"{base}/ready", timeout=3)[0] == 200:
                    result["up_s"] = round(time.monotonic() - start, 1)
                    result.update(exercise(base, cfg.model.name))
                    result["gpu"] = _gpu()
                    break
            except OSError:
                pass
            time.sleep(3)
    finally:
        _stop(proc)
        result["memory_log"] = _log_lines(MEMORY_LINES, 60)
        result["error_log"] = _log_lines(ERROR_LINES, 30)
        if RAY_LOGS.is_dir():
            with tarfile.open(out_dir / f"{stem}.raylogs.tgz", "w:gz") as tar:
                tar.add(RAY_LOGS, arcname="logs")
    return result


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True, timeout=120)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, deadline = Path(argv[0]), time.monotonic() + float(os.environ.get("GPU_CHECK_DEADLINE_S", "540"))
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = [(p, pol or None) for p, _, pol in (a.partition(":") for a in argv[1:])]
    report: dict[str, Any] = {}

    def save() -> None:
        (out_dir / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))

    report["static"] = static_checks(configs)
    save()
    for path, policy in configs:
        key = f"{path}:{policy}" if policy else path
        report[key] = serve_and_check(path, policy, out_dir, deadline)
        save()
    summary = {k: v.get("error", "ok") for k, v in report.items() if k != "static"}
    summary["static"] = report["static"]["errors"] or "ok"
    print(json.dumps(summary, indent=2))
    return 0 if all(v == "ok" for v in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
