"""What the Serve router adapter reads off the ingress's work item."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.protocol import ChatWork
from deployments.request_router import KVServeRequestRouter


def _pending(work) -> SimpleNamespace:  # Serve's PendingRequest, as far as the adapter reads it
    return SimpleNamespace(args=[work], metadata=SimpleNamespace(internal_request_id="req-1"))


def test_a_request_with_n_choices_is_charged_all_of_their_output():
    work = ChatWork(request_id="chat-1", body={"max_tokens": 50, "n": 3}, engine_inputs=[], block_hashes=[1, 2],
                    num_prompt_tokens=70, tenant="acme", expected_output_tokens=150)
    req = KVServeRequestRouter._route_request(_pending(work))
    assert (req.request_id, req.num_prompt_tokens, req.tenant) == ("req-1", 70, "acme")
    assert req.expected_output_tokens == 150 and list(req.block_hashes) == [1, 2]


def test_work_without_an_output_bound_expects_none():
    work = ChatWork(request_id="chat-2", body={}, engine_inputs=[], block_hashes=[], num_prompt_tokens=5)
    assert KVServeRequestRouter._route_request(_pending(work)).expected_output_tokens == 0
