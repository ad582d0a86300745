"""A chat request whose messages use pydantic's lazily validated Iterable fields is made picklable
(it travels to a replica) and stays readable after the renderer read it."""

from __future__ import annotations

import pickle

from collections.abc import Iterable

import pytest
from pydantic import BaseModel

from deployments.lazy_fields import materialize_request, materialized
from deployments.vllm_compat import get


def test_materialized_replaces_nested_iterators_with_lists():
    value = {"a": iter([1, {"b": iter("xy")}]), "c": "text", "d": (1, 2)}
    assert materialized(value) == {"a": [1, {"b": ["x", "y"]}], "c": "text", "d": [1, 2]}


def test_a_chat_request_with_iterable_fields_pickles_after_materializing():
    req = get("ChatCompletionRequest").model_validate({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]}]})
    materialize_request(req)
    again = pickle.loads(pickle.dumps(req))
    assert again.messages[0]["content"] == [{"type": "text", "text": "hi"}]
    assert again.messages[1]["tool_calls"][0]["function"]["name"] == "f"
    assert req.messages[0]["content"]  # still readable: a list, not a spent iterator


class _Lazy(BaseModel):
    parts: list[dict[str, Iterable[int]]]


def test_a_model_with_lazy_iterables_pickles_only_after_materializing():
    req = _Lazy.model_validate({"parts": [{"a": [1, 2]}]})
    with pytest.raises(TypeError, match="pickle"):  # the 500 the fuzzer found on /v1/chat/completions
        pickle.dumps(req)
    materialize_request(req)
    assert pickle.loads(pickle.dumps(req)).parts == [{"a": [1, 2]}]
