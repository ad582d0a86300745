"""Ray's PrefixCacheAffinityRouter (the `ray_prefix` baseline), importable without vLLM.

Ray publishes it as `ray.serve.llm.request_router.PrefixCacheAffinityRouter`, an empty subclass
of the class below. Importing that path runs `ray.serve.llm`'s package __init__, which imports
Ray's whole LLM stack and, in Ray 2.60, vLLM >= 0.32's protocol modules (on vLLM 0.24 it fails:
"No module named 'vllm.entrypoints.serve.engine.protocol'"). The router itself needs only Ray
Serve: its module lives under `ray.llm._internal`, whose package __init__s import no vLLM.
"""

from __future__ import annotations

try:
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )
except ImportError as internal_error:  # a Ray release that moved it: try the public path
    try:
        from ray.serve.llm.request_router import PrefixCacheAffinityRouter  # type: ignore[no-redef]
    except ImportError as public_error:
        raise ImportError(
            "router.policy ray_prefix needs Ray's PrefixCacheAffinityRouter, and this Ray has it at neither "
            f"ray.llm._internal...prefix_aware_router ({internal_error}) nor ray.serve.llm.request_router "
            f"({public_error}); the public path imports ray.serve.llm, which in Ray 2.60 needs vLLM >= 0.32. "
            "Use another router.policy, or vLLM >= 0.32."
        ) from public_error

__all__ = ["PrefixCacheAffinityRouter"]
