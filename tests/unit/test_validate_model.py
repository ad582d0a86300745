"""A body field of the wrong shape that crashes vLLM's own `before` validators is a 400, not a 500."""

from __future__ import annotations

import pytest

from deployments.errors import APIError, validate_model, vllm_errors_as_api_errors
from deployments.vllm_compat import get


@pytest.mark.parametrize("model, body", [
    ("CompletionRequest", {"model": "m", "prompt": "x", "structured_outputs": [{"regex": "a"}]}),
    ("ChatCompletionRequest", {"model": "m", "messages": [{"role": "user", "content": "x"}],
                               "structured_outputs": ["json"]}),
])
def test_structured_outputs_as_a_list_is_a_400(model, body):
    with pytest.raises(APIError) as err, vllm_errors_as_api_errors():
        validate_model(get(model), body)
    assert err.value.status == 400 and "wrong type" in err.value.message


def test_a_valid_body_validates():
    req = validate_model(get("CompletionRequest"), {"model": "m", "prompt": "x", "structured_outputs": {"regex": "a"}})
    assert req.structured_outputs is not None
