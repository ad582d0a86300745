"""The floor of a Ray Serve serving path: what Serve's own hops cost, with none of kvserve's work.

`hops=2`: proxy -> a pass-through ingress deployment -> a replica deployment streaming the fake
engine (the shape of kvserve, and of Ray Serve LLM's OpenAI ingress -> LLMServer). `hops=1`: the
proxy -> one deployment that runs the fake engine itself. Against `bare` (the same engine in one
uvicorn process) these say how much of kvserve's added TTFT Serve's path costs before any of ours.
"""

from __future__ import annotations

import time
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from bench.fake_engine import FakeEngine, prompt_tokens


class FloorReplica:
    def __init__(self, step_s: float, work_s: float, model: str) -> None:
        self.engine = FakeEngine(step_s, work_s, model)

    async def generate(self, body: dict):
        async for chunk in self.engine.stream(prompt_tokens(body), int(body.get("max_tokens") or 16), time.time()):
            yield chunk


class FloorIngress:
    def __init__(self, replica: Any, step_s: float, work_s: float, model: str) -> None:
        self.replica = replica.options(stream=True) if replica is not None else None
        self.engine = FakeEngine(step_s, work_s, model) if replica is None else None
        self.model = model

    async def __call__(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})
        body = await request.json()
        if self.engine is not None:  # one hop: the engine runs here
            chunks = self.engine.stream(prompt_tokens(body), int(body.get("max_tokens") or 16), time.time())
        else:
            chunks = self.replica.generate.remote(body)
        return StreamingResponse(chunks, media_type="text/event-stream")


def floor_app(step_s: float, work_s: float, model: str, hops: int) -> serve.Application:
    ingress = serve.deployment(FloorIngress).options(name="FloorIngress", ray_actor_options={"num_cpus": 0},
                                                     max_ongoing_requests=1024)
    if hops == 1:
        return ingress.bind(None, step_s, work_s, model)
    replica = serve.deployment(FloorReplica).options(name="FloorReplica", ray_actor_options={"num_cpus": 0},
                                                     max_ongoing_requests=1024)
    return ingress.bind(replica.bind(step_s, work_s, model), step_s, work_s, model)
