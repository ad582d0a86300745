"""Tool calling is configured through vLLM's own flags; the shipped `chatml-tools` template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deployments.vllm_args import TEMPLATES_DIR, engine_cli_args, parse_vllm_args, resolve_chat_template
from kvserve.config import ConfigError, KVServeConfig, load_config

# SmolLM2-135M-Instruct's own chat template (its tokenizer_config.json), verbatim.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SHIPPED = (TEMPLATES_DIR / "chatml-tools.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _cfg(**engine) -> KVServeConfig:
    return KVServeConfig.model_validate({"model": {"source": "some-org/some-model"}, "engine": engine})


def test_tool_options_reach_vllms_own_parser():
    cfg = _cfg(tool_call_parser="hermes", enable_auto_tool_choice=True, reasoning_parser="deepseek_r1",
               chat_template="chatml-tools")
    args = parse_vllm_args(engine_cli_args(cfg))
    assert args.tool_call_parser == "hermes" and args.enable_auto_tool_choice is True
    assert args.reasoning_parser == "deepseek_r1"
    assert Path(args.chat_template) == TEMPLATES_DIR / "chatml-tools.jinja"


def test_no_tool_options_by_default():
    args = parse_vllm_args(engine_cli_args(_cfg()))
    assert args.tool_call_parser is None and not args.enable_auto_tool_choice and args.chat_template is None


def test_auto_tool_choice_without_a_parser_is_a_config_error():
    with pytest.raises(ConfigError, match="tool_call_parser"):
        load_config(overrides={"engine": {"enable_auto_tool_choice": True}}, environ={})


def test_chat_template_names_a_shipped_template_else_passes_through(tmp_path):
    assert resolve_chat_template("chatml-tools") == str(TEMPLATES_DIR / "chatml-tools.jinja")
    own = tmp_path / "mine.jinja"
    assert resolve_chat_template(str(own)) == str(own)
    assert resolve_chat_template("{{ messages[0]['content'] }}") == "{{ messages[0]['content'] }}"
    assert resolve_chat_template("no-such-template") == "no-such-template"


def _render(template: str, messages: list, **kw) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    return render_jinja_template([messages], chat_template=template, **kw)[0][0]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_without_tools_the_shipped_template_renders_like_the_models_own(messages, add_generation_prompt):
    # Prompts (and so prefix-cache hits) do not change when a deployment switches to it.
    assert _render(SHIPPED, messages, add_generation_prompt=add_generation_prompt) == \
        _render(SMOLLM2_TEMPLATE, messages, add_generation_prompt=add_generation_prompt)


def test_the_shipped_template_offers_tools_and_replays_calls_in_hermes_format():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = _render(SHIPPED, messages, tools=[WEATHER], add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert text.count("Be brief.") == 1
    tools_block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_block) == WEATHER
    call = text.split("<tool_call>\n")[-1].split("\n</tool_call>", 1)[0]
    assert json.loads(call) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert "<tool_response>\nsunny\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
