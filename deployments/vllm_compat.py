"""Every vLLM internal kvserve touches, in one place, for vLLM 0.24 to 0.33.

vLLM moves its entrypoint modules between releases. Each name is looked up by
feature detection (the first module path that has it), newest layout first, so a
release that keeps an old path as a deprecated alias is read at its new one.
Imports are lazy: the driver (`kvserve serve`) imports the deployments without vLLM.

Known differences, checked in the sources of 0.24.0, 0.32.0 and 0.33.0 (releases in between get
whichever layout they have, by the same detection):
  make_arg_parser          0.33 entrypoints.common.cli_args; 0.32 entrypoints.launchers.cli_args;
                           0.24 entrypoints.openai.cli_args
  init_app_state           0.32+ entrypoints.launchers.api_server.app_state; 0.24 entrypoints.openai.api_server
  init_render_app_state    0.32+ entrypoints.launchers.render.app_state, sets state.online_renderer;
                           0.24 entrypoints.openai.api_server, sets state.openai_serving_render
  unfinished requests      AsyncLLM.get_num_unfinished_requests() in 0.32+; 0.24 has it on engine.output_processor
  create_error_response    0.32+ entrypoints.serve.exception_handling.error_response; 0.24 entrypoints.serve.utils.error_response
  MM_PARSER_MAP            0.32+ renderers.chat_utils; 0.24 entrypoints.chat_utils
  client errors            0.32+ VLLMClientError (base of VLLMValidationError, VLLMNotFoundError, ...);
                           0.24 VLLMValidationError (a ValueError) and VLLMNotFoundError (an Exception)
The rest (AsyncEngineArgs, AsyncLLM, SamplingParams, FlexibleArgumentParser, the OpenAI protocol
models, StatLoggerBase's interface, the KV-event types and the fields we read) is the same in all three.
"""

from __future__ import annotations

import functools
import importlib
from argparse import Namespace
from typing import Any

# (module, attribute) candidates per name, newest layout first.
_CANDIDATES: dict[str, tuple[tuple[str, str], ...]] = {
    "make_arg_parser": (
        ("vllm.entrypoints.common.cli_args", "make_arg_parser"),
        ("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),
        ("vllm.entrypoints.openai.cli_args", "make_arg_parser"),
    ),
    "init_app_state": (
        ("vllm.entrypoints.launchers.api_server.app_state", "init_app_state"),
        ("vllm.entrypoints.openai.api_server", "init_app_state"),
    ),
    "init_render_app_state": (
        ("vllm.entrypoints.launchers.render.app_state", "init_render_app_state"),
        ("vllm.entrypoints.openai.api_server", "init_render_app_state"),
    ),
    "create_error_response": (
        ("vllm.entrypoints.serve.exception_handling.error_response", "create_error_response"),
        ("vllm.entrypoints.serve.utils.error_response", "create_error_response"),
    ),
    "MM_PARSER_MAP": (
        ("vllm.renderers.chat_utils", "MM_PARSER_MAP"),
        ("vllm.entrypoints.chat_utils", "MM_PARSER_MAP"),
    ),
    "TokenizeCompletionRequest": (("vllm.entrypoints.serve.tokenize.protocol", "TokenizeCompletionRequest"),),
    "TokenizeChatRequest": (("vllm.entrypoints.serve.tokenize.protocol", "TokenizeChatRequest"),),
    "DetokenizeRequest": (("vllm.entrypoints.serve.tokenize.protocol", "DetokenizeRequest"),),
    "FlexibleArgumentParser": (("vllm.utils.argparse_utils", "FlexibleArgumentParser"),),
    "AsyncEngineArgs": (("vllm.engine.arg_utils", "AsyncEngineArgs"),),
    "AsyncLLM": (("vllm.v1.engine.async_llm", "AsyncLLM"),),
    "SamplingParams": (("vllm.sampling_params", "SamplingParams"),),
    "ChatCompletionRequest": (("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest"),),
    "CompletionRequest": (("vllm.entrypoints.openai.completion.protocol", "CompletionRequest"),),
    "StatLoggerBase": (("vllm.v1.metrics.loggers", "StatLoggerBase"),),
    "KVEventBatch": (("vllm.distributed.kv_events", "KVEventBatch"),),
    "BlockStored": (("vllm.distributed.kv_events", "BlockStored"),),
    "BlockRemoved": (("vllm.distributed.kv_events", "BlockRemoved"),),
    "AllBlocksCleared": (("vllm.distributed.kv_events", "AllBlocksCleared"),),
}


def _find(candidates: tuple[tuple[str, str], ...]) -> Any | None:
    for module, attr in candidates:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not (module == e.name or module.startswith(e.name + ".")):
                raise  # the module is there but one of its own imports is broken: show that, not "missing"
            continue
        if hasattr(mod, attr):
            return getattr(mod, attr)
    return None


@functools.cache
def get(name: str) -> Any:
    """The installed vLLM's object for `name` (a key of _CANDIDATES)."""
    found = _find(_CANDIDATES[name])
    if found is None:
        tried = ", ".join(f"{m}.{a}" for m, a in _CANDIDATES[name])
        raise ImportError(f"vLLM {vllm_version()} has none of {tried}; kvserve supports vLLM 0.24 to 0.33")
    return found


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except ImportError:
        return "(not installed)"


def parse_args(argv: list[str]) -> Namespace:
    """vLLM's own `vllm serve` parser: its defaults and validation, at any supported version."""
    return get("make_arg_parser")(get("FlexibleArgumentParser")()).parse_args(argv)


async def init_renderer(vllm_config: Any, state: Any, args: Namespace) -> Any:
    """Fill `state` with vLLM's engine-less serving state; return its chat/completion renderer."""
    await get("init_render_app_state")(vllm_config, state, args)
    renderer = getattr(state, "online_renderer", None)  # 0.25+; 0.24 names it openai_serving_render
    return renderer if renderer is not None else state.openai_serving_render


def num_unfinished_requests(engine: Any) -> int:
    if hasattr(engine, "get_num_unfinished_requests"):
        return engine.get_num_unfinished_requests()
    return engine.output_processor.get_num_unfinished_requests()  # vLLM 0.24


async def reset_prefix_cache(engine: Any) -> bool:
    """Empty the engine's prefix cache. False: vLLM refused (a running request holds blocks)."""
    return await engine.reset_prefix_cache() is not False  # 0.24 may answer None


@functools.cache
def client_errors() -> tuple[type[BaseException], ...]:
    """The exception types vLLM raises for a bad request (-> HTTP 4xx)."""
    import vllm.exceptions as ex

    if hasattr(ex, "VLLMClientError"):
        return (ex.VLLMClientError,)
    return tuple(getattr(ex, n) for n in ("VLLMValidationError", "VLLMNotFoundError") if hasattr(ex, n))


def device_total_memory() -> int:
    """Total memory of this process's first visible GPU, in bytes.

    vLLM's platform reads it through NVML, which (unlike torch.cuda.mem_get_info) creates no CUDA
    context: the replica actor itself never holds GPU memory, only its engine process does."""
    try:
        from vllm.platforms import current_platform

        return int(current_platform.get_device_total_memory(0))
    except NotImplementedError:  # platforms without NVML
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)


def validate_token_ids(serving: Any, token_ids: list[int], parameter: str | None) -> None:
    """vLLM's out-of-vocabulary check on a serving object's renderer, where it has one (0.32+). On 0.24
    the engine makes the same check at admission; the replica answers its error as a 400 then."""
    check = getattr(getattr(serving, "renderer", None), "validate_token_ids", None)
    if check is not None:
        check(token_ids, parameter=parameter)


def preflight(serving: Any, n: int) -> None:
    """The admission checks vLLM's render step makes before a request reaches the engine (0.32+:
    `_preflight`); 0.24 makes them inside generate(), which our pre-rendered path still calls."""
    check = getattr(serving, "_preflight", None)
    if check is not None:
        check(n)
