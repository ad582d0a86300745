"""Interactive TTFT beside a batch: does the Batch API keep its lowest priority?

    python -m bench.batch_interference --url URL --json F

Three runs of the same interactive workload (closed loop, fresh prompts each run) on the live
cluster: alone; while a Batch API job runs; while the same batch lines are sent as ordinary
requests at the batch's concurrency (what a batch without priority would do). Each result row is
the interactive requests' TTFT/ITL percentiles; the Batch API job is cancelled after its run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import io
import json
import time
from pathlib import Path

import httpx

from bench.client import auth_headers
from bench.ingress_probe import probed
from bench.runner import ReplayOptions, replay
from bench.workloads import multi_tenant


def _batch_lines(model: str, n: int, words: int, max_tokens: int) -> list[dict]:
    return [{"custom_id": f"bg-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": max_tokens, "temperature": 0,
                      "messages": [{"role": "user", "content": f"Item {i}: " + "summarise this text " * words}]}}
            for i in range(n)]


async def _plain_load(url: str, headers: dict, lines: list[dict], concurrency: int, stop: asyncio.Event) -> int:
    """The batch's lines as ordinary requests, `concurrency` at a time, until `stop`."""
    done = 0
    it = iter(lines)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        for line in it:
            if stop.is_set():
                return
            await client.post(url + line["url"], json=line["body"], headers=headers, timeout=300)
            done += 1

    async with httpx.AsyncClient() as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return done


def run(url: str, api_key: str | None, model: str, vocab, *, requests: int, concurrency: int, batch_lines: int,
        batch_concurrency: int, seed: int) -> list[dict]:
    from openai import OpenAI

    opts = ReplayOptions(base_url=url, model=model, api_key=api_key, concurrency=concurrency, timeout_s=300)
    client = OpenAI(base_url=url + "/v1", api_key=api_key or "dev", max_retries=2)
    lines = _batch_lines(model, batch_lines, 40, 32)

    def workload(k: int):
        return multi_tenant(vocab, tenants=4, system_tokens=256, question_tokens=32, output_tokens=16,
                            requests=requests, seed=seed * 100 + k).requests

    def row(name: str, m, **extra) -> dict:
        return {"run": name, "ttft_p50_ms": m.ttft_p50_ms, "ttft_p90_ms": m.ttft_p90_ms, "itl_p50_ms": m.itl_p50_ms,
                "itl_p90_ms": m.itl_p90_ms, "requests": m.requests, "errors": m.errors, **extra}

    hdrs = auth_headers(api_key)

    def measured(k: int):  # the interactive run, and the ingress's /health round trips meanwhile
        return asyncio.run(probed(url, hdrs, replay(opts, workload(k))))

    run0, lag = measured(0)
    rows = [row("alone", run0.metrics, **lag)]

    raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
    fid = client.files.create(file=("bg.jsonl", io.BytesIO(raw)), purpose="batch").id
    batch = client.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
    while client.batches.retrieve(batch.id).request_counts.completed < 1:  # the batch is running
        time.sleep(0.5)
    before = client.batches.retrieve(batch.id).request_counts.completed
    run1, lag = measured(1)
    m = run1.metrics
    during = client.batches.retrieve(batch.id).request_counts.completed - before
    client.batches.cancel(batch.id)
    while client.batches.retrieve(batch.id).status == "cancelling":
        time.sleep(0.5)
    rows.append(row("beside a Batch API job", m, batch_lines_done_during=during, **lag))

    async def plain() -> tuple:
        stop = asyncio.Event()
        load = asyncio.create_task(_plain_load(url, auth_headers(api_key), lines, batch_concurrency, stop))
        await asyncio.sleep(2.0)  # the load is running
        run_, lag_ = await probed(url, hdrs, replay(dataclasses.replace(opts), workload(2)))
        stop.set()
        return run_, lag_, await load

    run_, lag, done = asyncio.run(plain())
    rows.append(row(f"beside the same lines as plain requests ({batch_concurrency} at a time)", run_.metrics,
                    batch_lines_done_during=done, **lag))
    return rows


def main() -> None:
    from bench.prepare import load_tokenizer
    from bench.tokens import SafeVocab
    from kvserve.config import ModelConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--api-key", default=None)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--batch-lines", type=int, default=400)
    p.add_argument("--batch-concurrency", type=int, default=4, help="batch.max_concurrency of the server")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, required=True)
    a = p.parse_args()
    cfg = httpx.get(a.url + "/kvserve/config", headers=auth_headers(a.api_key), timeout=30).json()
    model = ModelConfig.model_validate(cfg["model"])
    rows = run(a.url, a.api_key, model.name, SafeVocab(load_tokenizer(model)), requests=a.requests,
               concurrency=a.concurrency, batch_lines=a.batch_lines, batch_concurrency=a.batch_concurrency,
               seed=a.seed)
    params = {k: v for k, v in vars(a).items() if k not in ("json", "api_key", "url")}
    params.update(date=time.strftime("%Y-%m-%d", time.gmtime()), replicas=cfg.get("num_replicas"),
                  batch={k: v for k, v in cfg.get("batch", {}).items() if k != "db_path"})  # a machine path
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"rows": rows, "params": params}, indent=1) + "\n")
    for r in rows:
        print(f"{r['run']}: TTFT p50 {r['ttft_p50_ms']:.0f} ms p90 {r['ttft_p90_ms']:.0f} ms, "
              f"ITL p50 {r['itl_p50_ms']:.0f} ms, errors {r['errors']}, batch lines {r.get('batch_lines_done_during')}, "
              f"/health p99 {r['health_rtt_p99_ms'] or 0:.0f} ms")


if __name__ == "__main__":
    main()
