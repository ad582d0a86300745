"""How fair a run was: Jain's index over each tenant's service / its weighted max-min fair share."""

from __future__ import annotations

from collections.abc import Mapping


def weighted_max_min(demand: Mapping[str, float], weight: Mapping[str, float], capacity: float) -> dict[str, float]:
    """Water-filling: every tenant gets min(its demand, its weight's share of what is left)."""
    alloc = {t: 0.0 for t in demand}
    left, active = max(capacity, 0.0), {t for t, d in demand.items() if d > 0}
    while active and left > 1e-12:
        total_w = sum(weight.get(t, 1.0) for t in active)
        share = {t: left * weight.get(t, 1.0) / total_w for t in active}
        done = {t for t in active if demand[t] - alloc[t] <= share[t]}
        if not done:
            for t in active:
                alloc[t] += share[t]
            break
        for t in done:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        active -= done
    return alloc


def jain(values: list[float]) -> float | None:
    """(sum x)^2 / (n sum x^2): 1 when all are equal, 1/n when one has everything."""
    if not values:
        return None
    sq = sum(x * x for x in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq > 0 else 1.0


def jain_fairness(service: Mapping[str, float], demand: Mapping[str, float], weight: Mapping[str, float]) -> float | None:
    """Jain's index of service_i / fair_i, the fair shares cut from the capacity the run delivered
    (the sum of services), so 1.0 means every tenant got exactly its weighted max-min share."""
    fair = weighted_max_min(demand, weight, sum(service.values()))
    ratios = [service.get(t, 0.0) / f for t, f in fair.items() if f > 0]
    return jain(ratios)
