"""build_serve_config: the Serve config every install path deploys (kvserve deploy, Helm, ray up)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.serve.schema import ServeDeploySchema

from kvserve.config import KVServeConfig
from cluster.serve_config import (
    IMPORT_PATH,
    assert_no_clear_secrets,
    build_serve_config,
    config_from_serve_config,
    serve_config_yaml,
)


def test_shape_is_what_serve_accepts():
    cfg = KVServeConfig.model_validate({"server": {"host": "0.0.0.0", "port": 9100}, "app_name": "llm"})
    out = build_serve_config(cfg, runtime_env={"env_vars": {"HF_HOME": "/models"}})
    parsed = ServeDeploySchema.model_validate(out)  # Ray's own schema of `serve deploy` files
    (app,) = parsed.applications
    assert (app.name, app.route_prefix, app.import_path) == ("llm", "/", IMPORT_PATH)
    assert parsed.http_options.port == 9100 and parsed.http_options.host == "0.0.0.0"
    assert out["applications"][0]["runtime_env"] == {"env_vars": {"HF_HOME": "/models"}}


def test_keys_are_references_or_hashes_never_clear_text():
    cfg = KVServeConfig.model_validate(
        {
            "tenants": {
                "keys": [
                    {"tenant": "a", "key_env": "TEAM_A_KEY"},
                    {"tenant": "b", "key_sha256": "0" * 64},
                    {"tenant": "c", "key_file": "/etc/kvserve/keys/c"},
                ]
            }
        }
    )
    text = serve_config_yaml(cfg)
    assert "TEAM_A_KEY" in text and "/etc/kvserve/keys/c" in text
    assert config_from_serve_config(text) == cfg


@pytest.mark.parametrize("bad", [{"api_key": "sk-1"}, {"a": [{"token": "t"}]}, {"x": {"password": "p"}}])
def test_clear_secret_guard(bad):
    with pytest.raises(ValueError, match="clear-text"):
        assert_no_clear_secrets(bad)


def test_guard_allows_references():
    assert_no_clear_secrets({"keys": [{"tenant": "a", "key_env": "K", "key_file": None, "key_sha256": "0" * 64}]})


def test_config_from_serve_config_needs_exactly_one_kvserve_app():
    with pytest.raises(ValueError, match="exactly one"):
        config_from_serve_config({"applications": [{"name": "x", "import_path": "other:app"}]})


configs = st.builds(
    lambda replicas, policy, port, device, autoscale: KVServeConfig.model_validate(
        {
            "num_replicas": replicas,
            "router": {"policy": policy},
            "server": {"port": port},
            "engine": {"device": device},
            "autoscaling": {"enabled": autoscale, "min_replicas": 1, "max_replicas": max(replicas, 1)},
        }
    ),
    st.integers(1, 64),
    st.sampled_from(["round_robin", "pow2", "ray_prefix", "kvserve"]),
    st.integers(1, 65535),
    st.sampled_from(["cpu", "gpu"]),
    st.booleans(),
)


@settings(deadline=None)  # a timing bound has no place here: the 2-core CI machine is shared
@given(configs)
def test_round_trip_through_yaml(cfg):
    text = serve_config_yaml(cfg)
    assert config_from_serve_config(yaml.safe_load(text)) == cfg
    assert build_serve_config(cfg)["http_options"]["port"] == cfg.server.port


def test_resizing_a_fixed_fleet_is_a_lightweight_serve_update():
    """Serve restarts every replica when an app's code version (import path, runtime env, args)
    changes; the replica count must stay out of it, while anything else in the config changes it."""
    from ray.serve._private.deploy_utils import get_app_code_version
    from ray.serve.schema import ServeApplicationSchema

    def app_of(cfg: KVServeConfig) -> ServeApplicationSchema:
        (app,) = ServeDeploySchema.model_validate(build_serve_config(cfg)).applications
        return app

    two, four = KVServeConfig(num_replicas=2), KVServeConfig(num_replicas=4)
    assert get_app_code_version(app_of(two)) == get_app_code_version(app_of(four))
    (replica, ingress) = app_of(four).deployments
    assert (replica.name, replica.num_replicas, ingress.name) == ("LLMReplica", 4, "Ingress")
    assert ingress.max_ongoing_requests == 2 * (64 * 4 + 256)
    assert config_from_serve_config(build_serve_config(four)) == four
    other = four.model_copy(update={"router": four.router.model_copy(update={"policy": "pow2"})})
    assert get_app_code_version(app_of(other)) != get_app_code_version(app_of(four))
    # With autoscaling, Serve's autoscaling config sizes the fleet: no count override.
    auto = KVServeConfig.model_validate({"autoscaling": {"enabled": True}})
    assert app_of(auto).deployments == [] and config_from_serve_config(build_serve_config(auto)) == auto
