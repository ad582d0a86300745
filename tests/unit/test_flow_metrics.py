"""flow.fairness (weighted max-min, Jain), flow.tiers (tightest tier with traffic), flow.cost."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flow.cost import DecodeEstimate, request_cost
from flow.fairness import jain, jain_fairness, weighted_max_min
from flow.tiers import Tier, TierTraffic, effective_targets
from kvserve.policy_params import SLOTargets


def test_max_min_gives_small_demands_in_full_and_splits_the_rest_by_weight() -> None:
    alloc = weighted_max_min({"v1": 10, "v2": 10, "agg": 1000}, {"v1": 1, "v2": 1, "agg": 1}, 100)
    assert alloc == {"v1": 10, "v2": 10, "agg": 80}
    alloc = weighted_max_min({"a": 100, "b": 100}, {"a": 3, "b": 1}, 40)
    assert alloc == {"a": 30, "b": 10}


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 1000), min_size=1),
       st.floats(0, 3000))
def test_max_min_never_exceeds_demand_or_capacity(demand: dict, capacity: float) -> None:
    alloc = weighted_max_min(demand, {}, capacity)
    assert all(alloc[t] <= demand[t] + 1e-6 for t in demand)
    assert sum(alloc.values()) <= capacity + 1e-6
    # Work-conserving: either every demand is met or the capacity is used up.
    assert all(alloc[t] >= demand[t] - 1e-6 for t in demand) or sum(alloc.values()) >= capacity - 1e-6


def test_jain() -> None:
    assert jain([1, 1, 1]) == 1.0
    assert abs(jain([1, 0, 0, 0]) - 0.25) < 1e-12
    # Aggressor took the victims' share: unfair; everyone at its fair share: 1.
    demand, w = {"v": 10, "agg": 1000}, {"v": 1, "agg": 1}
    assert jain_fairness({"v": 10, "agg": 90}, demand, w) == 1.0
    assert jain_fairness({"v": 2, "agg": 98}, demand, w) < 0.8


def test_tightest_tier_with_traffic() -> None:
    default = SLOTargets(2000, 200)
    assert effective_targets(default, [Tier(500, None), Tier(None, 50), Tier(5000, 500)]) == SLOTargets(500, 50)
    seen = TierTraffic({"gold": Tier(300, 40), "free": Tier(None, None)}, window_s=60)
    seen.saw("free", 0.0)
    seen.saw("gold", 10.0)
    assert seen.targets(default, 20.0) == SLOTargets(300, 40)
    assert seen.targets(default, 100.0) == default  # gold went quiet: the fleet need not serve its tier
    seen.saw("unknown", 100.0)
    assert seen.active(100.0) == []


def test_decode_estimate_learns_and_respects_max_tokens() -> None:
    est = DecodeEstimate(alpha=0.5)
    assert est.expected("a", 100) == 100
    est.observe("a", 20)
    est.observe("a", 40)
    assert est.expected("a", 100) == 30 and est.expected("a", 10) == 10 and est.expected("a", None) == 30
    assert request_cost(-5, 30) == 30 and request_cost(100, 28.5) == 128.5
