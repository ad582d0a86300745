"""The ingress's request limits, derived from the one config."""

from __future__ import annotations

from cluster.serve_config import ingress_limits
from kvserve.config import KVServeConfig


def test_the_ingress_admits_more_than_the_replica_routers_can_hold():
    # Below this, requests would wait at the ingress (in Serve's HTTP proxy), where neither the
    # routers' 503 bound nor the autoscaler sees them.
    big = KVServeConfig(server={"max_ongoing_requests": 64, "max_queued_requests": 256},
                        autoscaling={"enabled": True, "max_replicas": 16})
    assert ingress_limits(big) == {"max_ongoing_requests": 2 * (64 * 16 + 256), "max_queued_requests": 2 * (64 * 16 + 256)}
    small = KVServeConfig(server={"max_ongoing_requests": 2, "max_queued_requests": 8},
                          autoscaling={"enabled": True, "min_replicas": 1, "max_replicas": 2})
    assert ingress_limits(small) == {"max_ongoing_requests": 256, "max_queued_requests": 256}
    fixed = KVServeConfig(num_replicas=20)
    assert ingress_limits(fixed)["max_ongoing_requests"] == 2 * (fixed.server.max_ongoing_requests * 20
                                                                 + fixed.server.max_queued_requests)


def test_an_unbounded_replica_queue_leaves_the_ingress_queue_unbounded_too():
    cfg = KVServeConfig(server={"max_queued_requests": -1})
    limits = ingress_limits(cfg)
    assert limits["max_queued_requests"] == -1 and limits["max_ongoing_requests"] >= 256


def test_deploy_version_ignores_the_replica_count_only():
    """`serve.run` restarts every replica when the deployment version changes; a resize must not."""
    from deployments.app import build_app

    def versions(args):
        ingress = build_app(args)._bound_deployment
        (replica,) = [a for a in ingress.init_args if hasattr(a, "_bound_deployment")]
        return ingress._version, replica._bound_deployment._version

    dev = {"open_mode": True}  # build_app serves: without keys, only in explicit open mode
    two = versions({"config": KVServeConfig(num_replicas=2, tenants=dev)})
    assert two == versions({"config": KVServeConfig(num_replicas=5, tenants=dev)})
    pow2 = versions({"config": KVServeConfig.model_validate({"num_replicas": 2, "router": {"policy": "pow2"}, "tenants": dev})})
    # The policy runs in the ingress's handle: a new one restarts the ingress, not the engines.
    assert pow2[0] != two[0] and pow2[1] == two[1]
    other_engine = versions({"config": KVServeConfig(num_replicas=2, tenants=dev, engine={"max_num_seqs": 3})})
    assert other_engine[0] != two[0] and other_engine[1] != two[1]
    assert two != versions({"config": KVServeConfig(num_replicas=2, tenants=dev), "generation": "x"})  # a forced restart
