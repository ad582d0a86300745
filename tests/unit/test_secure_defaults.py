"""No keys, no server: every path that serves refuses a keyless config unless open mode is asked for,
and open mode on a network address takes a second switch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kvserve.config import ConfigError, KVServeConfig, load_config, require_servable, serving_problem

KEY = {"tenant": "a", "key_sha256": "0" * 64}
ROOT = Path(__file__).resolve().parents[2]


def _cfg(tenants: dict | None = None, host: str = "127.0.0.1") -> KVServeConfig:
    return KVServeConfig.model_validate({"tenants": tenants or {}, "server": {"host": host}})


@pytest.mark.parametrize(
    ("tenants", "host", "fix"),
    [
        (None, "127.0.0.1", "--dev"),  # the defaults
        ({"open_mode": False}, "127.0.0.1", "tenants.keys"),
        ({"open_mode": True}, "0.0.0.0", "allow_open_on_network"),
        ({"open_mode": True}, "10.1.2.3", "allow_open_on_network"),
        ({"open_mode": True}, "::", "allow_open_on_network"),
        ({"open_mode": True}, "llm.internal", "allow_open_on_network"),  # a name may resolve to anything
    ],
)
def test_refused_configs_name_the_fix(tenants, host, fix):
    problem = serving_problem(_cfg(tenants, host))
    assert problem and fix in problem
    with pytest.raises(ConfigError, match="refusing to serve"):
        require_servable(_cfg(tenants, host))


@pytest.mark.parametrize(
    ("tenants", "host"),
    [
        ({"open_mode": True}, "127.0.0.1"),
        ({"open_mode": True}, "127.0.0.53"),
        ({"open_mode": True}, "localhost"),
        ({"open_mode": True}, "::1"),
        ({"open_mode": True, "allow_open_on_network": True}, "0.0.0.0"),
        ({"keys": [KEY]}, "0.0.0.0"),
        ({"keys_file": "/etc/kvserve/keys.yaml"}, "0.0.0.0"),
    ],
)
def test_served_configs(tenants, host):
    assert serving_problem(_cfg(tenants, host)) is None


def test_the_default_config_describes_but_does_not_serve():
    cfg = KVServeConfig()  # the simulator, dashboard and profiler use one
    assert not cfg.tenants.open_mode and not cfg.tenants.keys
    assert "no API keys" in serving_problem(cfg)


def test_a_file_that_only_sets_the_port_is_refused(tmp_path):
    f = tmp_path / "kvserve.yaml"
    f.write_text(yaml.safe_dump({"server": {"port": 9000}}))
    assert "no API keys" in serving_problem(load_config(f, environ={}))


def test_a_network_host_from_the_environment_is_refused_in_open_mode():
    cfg = load_config(overrides={"tenants": {"open_mode": True}}, environ={"KVSERVE_SERVER__HOST": "0.0.0.0"})
    assert "allow_open_on_network" in serving_problem(cfg)
    allowed = load_config(overrides={"tenants": {"open_mode": True}},
                          environ={"KVSERVE_SERVER__HOST": "0.0.0.0", "KVSERVE_TENANTS__ALLOW_OPEN_ON_NETWORK": "true"})
    assert serving_problem(allowed) is None


def test_the_serve_app_builder_refuses_a_keyless_config():
    """Helm's serveConfigV2, `serve deploy` and `ray up` all build the app here."""
    from deployments.app import build_app

    with pytest.raises(ConfigError, match="no API keys"):
        build_app({"config": KVServeConfig().model_dump(mode="json")})
    build_app({"config": _cfg({"open_mode": True}).model_dump(mode="json")})


# ---------------------------------------------------------------- CLI


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVSERVE_") and k != "RAY_ADDRESS"}
    return env | {"PYTHONPATH": str(ROOT)}


def test_kvserve_serve_without_flags_exits_quickly_naming_the_fix(tmp_path):
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli", "serve"], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 60
    assert done.returncode != 0
    said = " ".join(done.stderr.split())  # rich wraps lines
    assert "--dev" in said and "tenants.keys" in said and "kvserve config hash-key" in said, said


class _Reached(Exception):
    """Raised by a stand-in for start_cluster: the command got past its checks."""


@pytest.fixture
def no_cluster(monkeypatch):
    """kvserve serve/deploy with Ray, the model and the cluster replaced by tripwires."""
    import cluster.local
    import cli.commands

    def tripwire(*_a, **_k):
        raise _Reached

    monkeypatch.setattr(cli.commands, "_ensure_model", lambda _cfg: None)
    monkeypatch.setattr(cluster.local, "start_cluster", tripwire)
    monkeypatch.setattr(cluster.local, "deploy", tripwire)
    monkeypatch.setattr(cluster.local, "shutdown", lambda _started: None)
    for key in [k for k in os.environ if k.startswith("KVSERVE_")]:
        monkeypatch.delenv(key)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in handlers.items():  # `kvserve serve` installs its own
        signal.signal(s, h)


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (["serve"], "--dev"),
        (["serve", "--dev", "--host", "0.0.0.0"], "allow_open_on_network"),
        (["deploy"], "tenants.keys"),
    ],
)
def test_refused_before_ray_starts(no_cluster, args, fix):
    from cli.app import app

    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and not isinstance(result.exception, _Reached)
    assert fix in " ".join(result.output.split())


@pytest.mark.parametrize("args", [["serve", "--dev"], ["deploy", "--dev"]])
def test_dev_mode_on_loopback_goes_on_to_start(no_cluster, args):
    from cli.app import app

    assert isinstance(CliRunner().invoke(app, args).exception, _Reached)


# ---------------------------------------------------------------- Helm and ray up


def test_helm_values_check_applies_the_same_rule():
    from cluster.helm_values import load_values, validate_values

    values = load_values()
    values["kvserve"]["tenants"] = {"open_mode": True}  # the chart binds 0.0.0.0
    with pytest.raises(ConfigError, match="allow_open_on_network"):
        validate_values(values)
    values["kvserve"]["tenants"]["allow_open_on_network"] = True
    validate_values(values)
    values["kvserve"].pop("tenants")
    values["apiKeySecret"] = {"name": None}
    with pytest.raises(ConfigError, match="no API keys"):
        validate_values(values)


def test_helm_chart_refuses_open_mode_on_the_pod_network_unless_allowed():
    helm_python = pytest.importorskip("helm_python")
    from cluster.helm_values import render_chart

    with pytest.raises(helm_python.HelmRenderError, match="allow_open_on_network"):
        render_chart({"kvserve": {"tenants": {"open_mode": True}}})
    render_chart({"kvserve": {"tenants": {"open_mode": True, "allow_open_on_network": True}}})
    with pytest.raises(helm_python.HelmRenderError, match="no API keys"):
        render_chart({"kvserve": {"tenants": None}, "apiKeySecret": {"name": None}})


def test_ray_up_configs_are_rendered_only_for_servable_configs(tmp_path, capsys):
    from cluster.render import TARGETS, main, render

    onprem = TARGETS["onprem"]
    assert KVServeConfig.model_validate(onprem.kvserve).tenants.keys_file
    with pytest.raises(ConfigError, match="allow_open_on_network"):
        render(onprem, KVServeConfig.model_validate({**onprem.kvserve, "tenants": {"open_mode": True}}))
    f = tmp_path / "kv.yaml"
    f.write_text(yaml.safe_dump({"num_replicas": 3}))
    assert main(["onprem", "--config", str(f)]) == 2
    assert "no API keys" in capsys.readouterr().err


def test_tenant_classes_name_the_key_with_an_unknown_class():
    from kvserve.config import TenantsConfig

    with pytest.raises(ValueError, match=r"tenants.keys\[0\] \(tenant 'a'\): unknown class 'gold'"):
        TenantsConfig(keys=[{"tenant": "a", "key_sha256": "0" * 64, "class": "gold"}])
    cfg = TenantsConfig(keys=[{"tenant": "a", "key_sha256": "0" * 64, "class": "gold"}], classes={"gold": {"weight": 2}})
    assert set(cfg.classes) == {"default", "gold"} and cfg.keys[0].tenant_class == "gold"


@pytest.mark.parametrize("field", ["requests_per_min", "tokens_per_min", "max_concurrent", "weight", "ttft_p90_ms"])
def test_tenant_class_limits_must_be_positive(field):
    from kvserve.config import TenantClass

    with pytest.raises(ValueError, match=field):
        TenantClass(**{field: 0})
