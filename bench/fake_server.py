"""A tiny fake of the kvserve HTTP contract, for the bench's tests and dry runs.

Streams `max_tokens` completion chunks with a fixed first-token delay and
inter-token gap, tags each response with `x-kvserve-replica` (round robin over
its replicas), serves `/kvserve/stats` counters that advance with every request,
and `/kvserve/config`. Nothing here is a model; timings are what you configure.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeBehaviour:
    replicas: tuple[str, ...] = ("replica-a", "replica-b")
    first_token_s: float = 0.05
    itl_s: float = 0.01
    cached_fraction: float = 0.5  # reported both in usage and in the engine counters
    fail_status: dict[int, int] = field(default_factory=dict)  # n-th request (0-based) -> HTTP status
    api_key: str | None = None
    config: dict = field(default_factory=dict)
    not_ready_polls: int = 0  # `/ready` answers 503 this many times first (replicas still starting)


class FakeKVServe:
    def __init__(self, behaviour: FakeBehaviour | None = None) -> None:
        self.b = behaviour or FakeBehaviour()
        self.counters = {
            r: {"prefix_cache_queries": 0, "prefix_cache_hits": 0, "num_requests": 0} for r in self.b.replicas
        }
        self.cache_epochs: dict[str, str] = {}  # replica -> the cache epoch it reports (none: absent)
        self.bodies: list[dict] = []
        self._n = 0
        self.ready_polls = 0
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/kvserve/stats", self.stats),
                Route("/kvserve/config", self.config),
                Route("/ready", self.ready),
            ]
        )

    async def completions(self, request: Request) -> Response:
        if self.b.api_key and request.headers.get("authorization") != f"Bearer {self.b.api_key}":
            return JSONResponse({"error": {"message": "bad key", "code": 401}}, status_code=401)
        body = await request.json()
        with self._lock:
            n = self._n
            self._n += 1
            self.bodies.append(body)
        replica = self.b.replicas[n % len(self.b.replicas)]
        headers = {"x-kvserve-replica": replica}
        status = self.b.fail_status.get(n)
        if status:
            return JSONResponse({"error": {"message": "injected", "code": status}}, status_code=status, headers=headers)
        prompt = body["prompt"]
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        cached = int(prompt_tokens * self.b.cached_fraction)
        with self._lock:
            c = self.counters[replica]
            c["prefix_cache_queries"] += prompt_tokens
            c["prefix_cache_hits"] += cached
            c["num_requests"] += 1
        max_tokens = int(body.get("max_tokens", 1))

        async def events():
            await asyncio.sleep(self.b.first_token_s)
            for i in range(max_tokens):
                if i:
                    await asyncio.sleep(self.b.itl_s)
                chunk = {"id": f"cmpl-{n}", "object": "text_completion", "created": int(time.time()),
                         "choices": [{"index": 0, "text": f" t{i}", "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            yield f"data: {json.dumps({'id': f'cmpl-{n}', 'choices': [], 'usage': usage})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def stats(self, request: Request) -> Response:
        with self._lock:
            reps = [{"replica_id": r, **c, "kv_usage": 0.1, "waiting": 0, "running": 1,
                     "cache_epoch": self.cache_epochs.get(r)} for r, c in self.counters.items()]
        return JSONResponse({"replicas": reps})

    def serve_replicas(self, replicas: tuple[str, ...]) -> None:
        """The cluster now has these replicas (a redeploy or a crash, as the test scripts it)."""
        with self._lock:
            self.b.replicas = replicas
            self.counters = {r: self.counters.get(r, {"prefix_cache_queries": 0, "prefix_cache_hits": 0,
                                                      "num_requests": 0}) for r in replicas}

    async def ready(self, request: Request) -> Response:
        with self._lock:
            self.ready_polls += 1
            ok = self.ready_polls > self.b.not_ready_polls
        return JSONResponse({"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503)

    async def config(self, request: Request) -> Response:
        return JSONResponse(self.b.config)


class ServerThread:
    """Runs an ASGI app with uvicorn on 127.0.0.1 and a free port, in a daemon thread."""

    def __init__(self, app) -> None:
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()
