"""Streaming OpenAI-compatible client: one request in, one measured RequestResult out."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from bench.workloads import BenchRequest

REPLICA_HEADER = "x-kvserve-replica"


@dataclass
class RequestResult:
    idx: int
    start: float  # time.perf_counter() at send
    ok: bool = False
    status: int | None = None  # HTTP status; None if no response came back
    # "http_429", "http_503", "http_4xx", "http_5xx", "timeout", "connect", "stream_error", "protocol: ..."
    error: str | None = None
    error_detail: str | None = None  # the transport exception, for a failure with no HTTP status
    ttft_s: float | None = None
    e2e_s: float | None = None  # successful requests only
    elapsed_s: float | None = None  # send -> done (or failed), every request
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    replica: str | None = None
    tenant: str | None = None

    @property
    def first_token_at(self) -> float | None:
        return None if self.ttft_s is None else self.start + self.ttft_s

    @property
    def end_at(self) -> float | None:
        return None if self.e2e_s is None else self.start + self.e2e_s

    @property
    def done_at(self) -> float | None:
        return None if self.elapsed_s is None else self.start + self.elapsed_s

    @property
    def mean_itl_s(self) -> float | None:
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else None


def is_loopback_url(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def error_kind(status: int) -> str:
    if status in (429, 503):
        return f"http_{status}"  # overload signals are counted on their own
    return "http_4xx" if 400 <= status < 500 else "http_5xx"


def completion_body(req: BenchRequest, model: str, use_ids: bool = False) -> dict:
    return {
        "model": model,
        "prompt": list(req.prompt_ids) if use_ids else req.prompt_text,
        "max_tokens": req.max_tokens,
        "ignore_eos": True,  # exact output lengths, identical across policies
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _chunk_text(choice: dict) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    return (choice.get("delta") or {}).get("content") or ""


async def _read_events(resp: httpx.Response, chunk_times: list[float], res: RequestResult) -> dict | None:
    """Consume the SSE stream, stamping each chunk that carries text; returns the final `usage`."""
    usage = None
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("error"):  # the server gave up mid-stream
            res.error = "stream_error"
            break
        if chunk.get("usage"):
            usage = chunk["usage"]
        if any(_chunk_text(c) for c in chunk.get("choices") or []):
            chunk_times.append(time.perf_counter())
    return usage


def _error_code(resp: httpx.Response) -> str | None:
    """The OpenAI error body's `code` (why: overloaded, engine_dead, ...), if it has one."""
    try:
        err = resp.json().get("error") or {}
        return f"code: {err.get('code')}" if isinstance(err, dict) and err.get("code") else None
    except (ValueError, AttributeError):
        return None


def _detail(e: BaseException) -> str:
    """Exception type and message, with its cause's (httpx wraps the socket error)."""
    cause = e.__cause__ or e.__context__
    text = f"{type(e).__name__}: {e}"
    return text + (f" <- {type(cause).__name__}: {cause}" if cause is not None else "")


async def stream_request(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    *,
    idx: int = 0,
    tenant: str | None = None,
    timeout_s: float = 120.0,
    headers: dict[str, str] | None = None,
) -> RequestResult:
    """POST a streaming completion and time it: TTFT = first non-empty token chunk, ITL = gaps between them."""
    res = RequestResult(idx=idx, start=time.perf_counter(), tenant=tenant)
    chunk_times: list[float] = []
    usage: dict | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body, headers=headers) as resp:
                res.status = resp.status_code
                res.replica = resp.headers.get(REPLICA_HEADER)
                if resp.status_code != 200:
                    await resp.aread()
                    res.error = error_kind(resp.status_code)
                    res.error_detail = _error_code(resp)
                else:
                    usage = await _read_events(resp, chunk_times, res)
    except TimeoutError:
        res.error = "timeout"
    except (httpx.ConnectError, httpx.ConnectTimeout) as e:
        res.error, res.error_detail = "connect", _detail(e)
    except httpx.TimeoutException as e:
        res.error, res.error_detail = "timeout", _detail(e)
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error, res.error_detail = f"protocol: {type(e).__name__}", _detail(e)
    end = time.perf_counter()
    res.elapsed_s = end - res.start
    if chunk_times:
        res.ttft_s = chunk_times[0] - res.start
        res.itl_s = [b - a for a, b in zip(chunk_times, chunk_times[1:])]
    if usage:
        res.output_tokens = int(usage.get("completion_tokens") or len(chunk_times))
        res.prompt_tokens = usage.get("prompt_tokens")
        res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    else:
        res.output_tokens = len(chunk_times)
    if res.error is None:
        res.e2e_s = end - res.start
        if not chunk_times:
            res.error = "protocol: no tokens"
        else:
            res.ok = True
    return res


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
