"""The OpenAI checks vLLM's protocol models leave out: roles, message shapes, n, the context bound."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deployments.errors import APIError
from deployments.request_checks import (
    ROLES,
    check_choices,
    check_context,
    check_messages,
    describe_validation_errors,
    field_path,
)

USER = {"role": "user", "content": "hi"}


def _refused(messages) -> APIError:
    with pytest.raises(APIError) as info:
        check_messages(messages)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("messages,param,code,needle", [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role", "invalid_value", "'wizard'"),
    ([USER, {"role": "User", "content": "hi"}], "messages[1].role", "invalid_value", "supported values"),
    ([{"role": "user", "content": 42}], "messages[0].content", "invalid_type", "string or array of objects"),
    ([{"role": "user", "content": {"text": "hi"}}], "messages[0].content", "invalid_type", "got an object"),
    ([{"role": "user"}], "messages[0].content", "missing_required_parameter", "messages[0].content"),
    ([{"role": "system", "content": None}], "messages[0].content", "missing_required_parameter", "content"),
    ([{"role": "assistant", "content": None}], "messages[0].content", "missing_required_parameter", "content"),
    ([{"content": "hi"}], "messages[0].role", "missing_required_parameter", "role"),
    (["hi"], "messages[0]", "invalid_type", "expected an object"),
    ([], "messages", "empty_array", "empty array"),
    ("hi", "messages", "invalid_type", "expected an array"),
    (None, "messages", "missing_required_parameter", "messages"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0].text", "missing_required_parameter",
     "text"),
    ([{"role": "user", "content": [{"type": "text", "text": 5}]}], "messages[0].content[0].text", "invalid_type",
     "a string"),
    ([{"role": "user", "content": [7]}], "messages[0].content[0]", "invalid_type", "an integer"),
    ([USER, {"role": "tool", "content": "sunny"}], "messages[1].tool_call_id", "missing_required_parameter", "tool_call_id"),
    ([{"role": "user", "content": "hi", "name": 3}], "messages[0].name", "invalid_type", "name"),
    ([{"role": "function", "content": "x"}], "messages[0].name", "missing_required_parameter", "name"),
])
def test_bad_messages_are_refused_naming_the_field(messages, param, code, needle):
    err = _refused(messages)
    assert (err.param, err.code) == (param, code)
    assert needle.lower() in err.message.lower()
    assert "Param" not in err.message  # never a vLLM union member's class name


@pytest.mark.parametrize("messages", [
    [USER],
    [{"role": "system", "content": "be brief"}, USER, {"role": "assistant", "content": "ok"}, USER],
    [{"role": "developer", "content": [{"type": "text", "text": "rules"}]}, USER],
    [USER, {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     {"role": "tool", "tool_call_id": "c1", "content": "42"}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}, "and text"]}],
    [{"role": "function", "name": "f", "content": "out"}],
])
def test_valid_conversations_pass(messages):
    check_messages(messages)


def test_content_part_types_are_checked_against_the_servers_list():
    weird = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "weird"}]}]
    check_messages(weird)  # no list given: left to vLLM
    with pytest.raises(APIError) as info:
        check_messages(weird, part_types={"text", "image_url"})
    err = info.value
    assert (err.param, err.code) == ("messages[0].content[1].type", "invalid_value")
    assert "'weird'" in err.message and "'image_url' and 'text'" in err.message


_texts = st.text(max_size=20)
_message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                           "content": _texts | st.lists(st.fixed_dictionaries({"type": st.just("text"),
                                                                                "text": _texts}), max_size=3)}),
    st.fixed_dictionaries({"role": st.just("tool"), "content": _texts, "tool_call_id": _texts}),
)


@given(st.lists(_message, min_size=1, max_size=6))
def test_any_well_formed_conversation_passes(messages):
    check_messages(messages)


@given(st.lists(_message, min_size=1, max_size=6), st.data())
def test_any_unknown_role_is_refused_at_its_index(messages, data):
    i = data.draw(st.integers(0, len(messages) - 1))
    role = data.draw(st.text(max_size=12).filter(lambda r: r not in ROLES))
    messages[i] = {**messages[i], "role": role}
    err = _refused(messages)
    # An earlier message may be refused first only if it is itself bad; all others are well formed.
    assert err.param == f"messages[{i}].role" and err.code == "invalid_value"


def test_field_path_drops_union_members_and_type_tags():
    assert field_path(("messages", 0, "ChatCompletionUserMessageParam", "content", "str")) == "messages[0].content"
    assert field_path(("stop", "list[str]", 2)) == "stop[2]"
    assert field_path(("body", "tools", 0, "function", "name")) == "tools[0].function.name"
    assert field_path(()) == ""


def test_vllm_model_errors_read_like_openai_ones():
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [USER], "stop": 5})
    message, param = describe_validation_errors(info.value.errors())
    assert param == "stop" and message.startswith("Invalid parameter 'stop': ")
    message, param = describe_validation_errors([{"loc": (), "msg": "Value error, n must be 1 with beam search"}])
    assert (message, param) == ("n must be 1 with beam search", None)


@pytest.mark.parametrize("n,ok", [(None, True), (1, True), (16, True), (17, False), (0, False), (-1, False),
                                  (True, False), (2.0, False), ("2", False)])
def test_n_is_a_positive_integer_under_the_servers_limit(n, ok):
    if ok:
        check_choices(n, 16)
        return
    with pytest.raises(APIError) as info:
        check_choices(n, 16)
    assert info.value.status == 400 and info.value.param == "n"


@given(st.integers(1, 4096), st.none() | st.integers(1, 4096), st.integers(64, 4096))
def test_the_context_bound_is_prompt_plus_completion(prompt, completion, limit):
    fits = completion is None or prompt + completion <= limit
    if fits:
        check_context(prompt, completion, limit, "prompt")
        return
    with pytest.raises(APIError) as info:
        check_context(prompt, completion, limit, "messages")
    err = info.value
    assert (err.status, err.param, err.code) == (400, "messages", "context_length_exceeded")
    assert f"maximum context length is {limit} tokens" in err.message
    assert f"you requested {prompt + completion} tokens" in err.message
