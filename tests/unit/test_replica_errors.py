"""A replica answers with vLLM's serving layer; what vLLM raises or streams as an error becomes
an ERROR item with a 4xx status and OpenAI's body (no engine here: vLLM's serving objects are faked)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from deployments.protocol import BODY, ERROR, SSE, CompletionWork
from deployments.replica import LLMReplica


def _vllm_sse_error(exc: Exception) -> str:
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response

    return f"data: {json.dumps(create_error_response(exc).model_dump())}\n\n"


def _serve(create, request=None) -> list:
    replica = object.__new__(LLMReplica)
    replica.aborted = 0
    replica.completion = SimpleNamespace(create_completion=create)
    work = CompletionWork(request_id="c-1", body={"model": "m", "prompt": "hi"}, engine_inputs=[{}],
                          block_hashes=[], num_prompt_tokens=1, request=request)

    async def run():
        return [item async for item in replica._serve(work)]

    return asyncio.run(run())


def test_an_engine_validation_error_is_a_400_not_a_crash():
    from vllm.exceptions import VLLMValidationError

    async def create(request, raw):
        raise VLLMValidationError("Token id 99999999 is out of vocabulary", parameter="prompt")

    [(kind, (status, body))] = _serve(create)
    assert (kind, status) == (ERROR, 400)
    assert body["error"] == {"message": "Token id 99999999 is out of vocabulary", "type": "invalid_request_error",
                             "param": "prompt", "code": None}


def test_a_stream_that_fails_before_any_output_gets_a_real_status():
    closed = []

    async def stream():
        try:
            yield _vllm_sse_error(ValueError("logprobs must be at most 20"))
            yield "data: [DONE]\n\n"
        finally:
            closed.append(True)

    async def create(request, raw):
        return stream()

    [(kind, (status, body))] = _serve(create)
    assert (kind, status) == (ERROR, 400) and "logprobs" in body["error"]["message"]
    assert closed  # vLLM's generator is closed, not left to the garbage collector


def test_an_error_after_output_stays_in_the_stream_in_openais_shape():
    async def stream():
        yield 'data: {"id": "cmpl-1", "choices": [{"text": "Hi"}]}\n\n'
        yield _vllm_sse_error(RuntimeError("engine died"))
        yield "data: [DONE]\n\n"

    async def create(request, raw):
        return stream()

    items = _serve(create)
    assert [k for k, _ in items] == [SSE, SSE, SSE]
    err = json.loads(items[1][1][len("data: "):])["error"]
    assert err["type"] == "server_error" and err["code"] is None


def test_the_ingress_validated_request_is_served_and_vllm_error_responses_are_converted():
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import VLLMNotFoundError

    seen = []

    async def create(request, raw):
        seen.append(request)
        return create_error_response(VLLMNotFoundError("The model `x` does not exist."))

    marker = object()
    [(kind, (status, body))] = _serve(create, request=marker)
    assert seen == [marker]  # not re-validated from the body: the renderer's adjustments stay
    assert (kind, status, body["error"]["type"]) == (ERROR, 404, "invalid_request_error")


def test_a_response_body_passes_through():
    async def create(request, raw):
        return SimpleNamespace(model_dump_json=lambda **_: '{"id": "cmpl-1", "choices": []}')

    assert _serve(create) == [(BODY, {"id": "cmpl-1", "choices": []})]
