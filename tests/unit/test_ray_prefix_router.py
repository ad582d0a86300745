"""`ray_prefix` loads Ray's PrefixCacheAffinityRouter without ray.serve.llm (and so without vLLM)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from deployments.app import request_router_config
from deployments.ray_prefix_router import PrefixCacheAffinityRouter
from kvserve.config import KVServeConfig
from kvserve.policy_registry import ROUTERS

REPO = Path(__file__).resolve().parents[2]


def test_it_is_the_class_ray_publishes_minus_nothing():
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter as Public  # imports vLLM 0.32 here

    # Ray's public class is an empty subclass: only its docstring and API-stability tags are its own.
    assert Public.__bases__ == (PrefixCacheAffinityRouter,)
    own = {k for k in vars(Public) if not (k.startswith("__") or k.startswith("_abc") or k.startswith("_annotated"))}
    assert own == set()


def test_serve_gets_it_from_the_config():
    assert ROUTERS["ray_prefix"].live == "deployments.ray_prefix_router:PrefixCacheAffinityRouter"
    assert ROUTERS["ray_prefix"].live_origin == "ray"
    rc = request_router_config(KVServeConfig.model_validate({"router": {"policy": "ray_prefix"}}))
    assert rc.get_request_router_class() is PrefixCacheAffinityRouter


# A process where ray.serve.llm fails the way it does on vLLM 0.24, and vLLM cannot be imported at all.
_VLLM_024 = textwrap.dedent("""
    import importlib.abc, sys

    class Vllm024(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "ray.serve.llm" or name.startswith("ray.serve.llm."):
                raise ModuleNotFoundError("No module named 'vllm.entrypoints.serve.engine.protocol'",
                                          name="vllm.entrypoints.serve.engine.protocol")
            if name == "vllm" or name.startswith("vllm.") or name in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    BLOCKED = set(sys.argv[1:])
    sys.meta_path.insert(0, Vllm024())
""")


def _run(body: str, *blocked: str) -> subprocess.CompletedProcess:
    code = _VLLM_024 + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code, *blocked], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_it_loads_where_ray_serve_llm_cannot():
    proc = _run("""
        try:
            import ray.serve.llm.request_router
        except ModuleNotFoundError as e:
            print("public path fails:", e)
        from deployments.app import request_router_config
        from kvserve.config import KVServeConfig
        rc = request_router_config(KVServeConfig.model_validate({"router": {"policy": "ray_prefix"}}))
        cls = rc.get_request_router_class()
        print("loaded", cls.__module__, cls.__name__)
        print("vllm modules:", sorted(m for m in sys.modules if m.split(".")[0] == "vllm"))
    """)
    assert proc.returncode == 0, proc.stderr
    assert "public path fails: No module named 'vllm.entrypoints.serve.engine.protocol'" in proc.stdout
    assert ("loaded ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router "
            "PrefixCacheAffinityRouter") in proc.stdout
    assert "vllm modules: []" in proc.stdout


def test_a_ray_without_either_path_says_why_at_config_time():
    proc = _run("""
        from deployments.app import request_router_config
        from kvserve.config import KVServeConfig
        request_router_config(KVServeConfig.model_validate({"router": {"policy": "ray_prefix"}}))
    """, "ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router")
    assert proc.returncode != 0
    assert "router.policy ray_prefix needs Ray's PrefixCacheAffinityRouter" in proc.stderr
    assert "needs vLLM >= 0.32" in proc.stderr
