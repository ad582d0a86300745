"""deployments.vllm_compat picks each vLLM name by what the installed release has.

Fake vLLM trees (modules injected into sys.modules) with the layouts of 0.24, 0.32 and 0.33 run
every branch on CPU; the last tests check the real, installed vLLM (the CPU build, 0.32).
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.util
import sys
from types import ModuleType, SimpleNamespace

import pytest

from deployments import vllm_compat
from deployments.vllm_compat import _CANDIDATES

ALL_CANDIDATE_MODULES = {m for cands in _CANDIDATES.values() for m, _ in cands} | {"vllm.exceptions"}


@pytest.fixture(autouse=True)
def _fresh_lookups():
    vllm_compat.get.cache_clear()
    vllm_compat.client_errors.cache_clear()
    yield
    vllm_compat.get.cache_clear()
    vllm_compat.client_errors.cache_clear()


def _install(monkeypatch, layout: dict[str, dict[str, object]]) -> None:
    """Make `layout` ({module: {attr: value}}) the whole vLLM: its modules and their parents are
    fakes; every other module kvserve looks for is absent."""
    for name in ALL_CANDIDATE_MODULES - set(layout):
        monkeypatch.setitem(sys.modules, name, None)  # import -> ModuleNotFoundError
    for name, attrs in layout.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if not isinstance(sys.modules.get(parent), ModuleType) or not getattr(sys.modules[parent], "_fake", False):
                pkg = ModuleType(parent)
                pkg._fake, pkg.__path__ = True, []
                monkeypatch.setitem(sys.modules, parent, pkg)
        mod = ModuleType(name)
        mod._fake = True
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, name, mod)


class _Parser:
    def __init__(self) -> None:
        self.made_by = None

    def parse_args(self, argv):
        return SimpleNamespace(argv=argv, made_by=self.made_by)


def _arg_parser(tag):
    def make_arg_parser(parser):
        parser.made_by = tag
        return parser
    return make_arg_parser


class VLLMValidationError(ValueError):
    pass


class VLLMNotFoundError(Exception):
    pass


class VLLMClientError(Exception):
    pass


def _render_state(attr):
    async def init_render_app_state(vllm_config, state, args):
        setattr(state, attr, ("renderer", vllm_config))
    return init_render_app_state


async def init_app_state(*a, **kw):
    return None


V024 = {  # vLLM 0.24.0's layout
    "vllm.entrypoints.openai.cli_args": {"make_arg_parser": _arg_parser("0.24")},
    "vllm.entrypoints.openai.api_server": {"init_app_state": init_app_state,
                                           "init_render_app_state": _render_state("openai_serving_render")},
    "vllm.utils.argparse_utils": {"FlexibleArgumentParser": _Parser},
    "vllm.exceptions": {"VLLMValidationError": VLLMValidationError, "VLLMNotFoundError": VLLMNotFoundError},
}
V032 = {  # 0.32.0 (also keeps openai.api_server as a deprecated re-export)
    "vllm.entrypoints.launchers.cli_args": {"make_arg_parser": _arg_parser("0.32")},
    "vllm.entrypoints.launchers.api_server.app_state": {"init_app_state": init_app_state},
    "vllm.entrypoints.launchers.render.app_state": {"init_render_app_state": _render_state("online_renderer")},
    "vllm.entrypoints.openai.api_server": {"init_app_state": "deprecated alias",
                                           "init_render_app_state": "deprecated alias"},
    "vllm.utils.argparse_utils": {"FlexibleArgumentParser": _Parser},
    "vllm.exceptions": {"VLLMClientError": VLLMClientError, "VLLMValidationError": VLLMValidationError},
}
V033 = {**V032, "vllm.entrypoints.common.cli_args": {"make_arg_parser": _arg_parser("0.33")}}
del V033["vllm.entrypoints.launchers.cli_args"]


def test_vllm_024_layout(monkeypatch):
    _install(monkeypatch, V024)
    assert vllm_compat.parse_args(["--model", "m"]).made_by == "0.24"
    assert vllm_compat.get("init_app_state") is init_app_state
    state = SimpleNamespace()
    assert asyncio.run(vllm_compat.init_renderer("cfg", state, None)) == ("renderer", "cfg")
    assert state.openai_serving_render == ("renderer", "cfg")
    assert vllm_compat.client_errors() == (VLLMValidationError, VLLMNotFoundError)


def test_vllm_032_layout_prefers_launchers_over_the_deprecated_alias(monkeypatch):
    _install(monkeypatch, V032)
    assert vllm_compat.parse_args([]).made_by == "0.32"
    assert vllm_compat.get("init_app_state") is init_app_state
    state = SimpleNamespace()
    assert asyncio.run(vllm_compat.init_renderer("cfg", state, None)) == ("renderer", "cfg")
    assert not hasattr(state, "openai_serving_render")
    assert vllm_compat.client_errors() == (VLLMClientError,)


def test_vllm_033_layout(monkeypatch):
    _install(monkeypatch, V033)
    assert vllm_compat.parse_args([]).made_by == "0.33"


def test_newest_layout_wins_when_two_have_the_name(monkeypatch):
    _install(monkeypatch, {**V032, "vllm.entrypoints.common.cli_args": {"make_arg_parser": _arg_parser("0.33")}})
    assert vllm_compat.parse_args([]).made_by == "0.33"


def test_unfinished_requests_on_the_engine_or_its_output_processor():
    new = SimpleNamespace(get_num_unfinished_requests=lambda: 3)
    old = SimpleNamespace(output_processor=SimpleNamespace(get_num_unfinished_requests=lambda: 5))  # 0.24
    assert vllm_compat.num_unfinished_requests(new) == 3
    assert vllm_compat.num_unfinished_requests(old) == 5


def test_a_name_no_supported_release_has_is_a_clear_import_error(monkeypatch):
    _install(monkeypatch, {"vllm.utils.argparse_utils": {"FlexibleArgumentParser": _Parser}})
    with pytest.raises(ImportError, match=r"vllm\.entrypoints\.openai\.cli_args\.make_arg_parser.*0\.24 to 0\.33"):
        vllm_compat.get("make_arg_parser")


class _BrokenModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A module that exists but whose own import fails (a missing dependency of it)."""

    def find_spec(self, name, path, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "vllm.entrypoints.common.cli_args" else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ModuleNotFoundError("No module named 'some_dependency'", name="some_dependency")


def test_a_candidate_that_fails_inside_its_own_imports_is_not_taken_for_missing(monkeypatch):
    _install(monkeypatch, {**V032, "vllm.entrypoints.common.startup": {}})  # the package exists
    monkeypatch.delitem(sys.modules, "vllm.entrypoints.common.cli_args")
    monkeypatch.setattr(sys, "meta_path", [_BrokenModule(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError, match="some_dependency"):
        vllm_compat.get("make_arg_parser")


# -- the installed vLLM ---------------------------------------------------------------------------------


def test_installed_vllm_resolves_every_name():
    import vllm.exceptions
    from vllm.entrypoints.launchers.cli_args import make_arg_parser

    assert vllm_compat.get("make_arg_parser") is make_arg_parser
    for name in _CANDIDATES:
        assert vllm_compat.get(name) is not None
    assert vllm_compat.client_errors() == (vllm.exceptions.VLLMClientError,)
    assert vllm_compat.vllm_version().startswith("0.32")
