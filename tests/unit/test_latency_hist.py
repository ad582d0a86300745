"""kvserve.latency_hist: bucketed quantiles stay within a bucket of the exact ones; deltas of a run."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from kvserve import latency_hist as lh


@given(st.lists(st.floats(min_value=1.001, max_value=50_000.0), min_size=1, max_size=300),
       st.sampled_from([0.1, 0.5, 0.9, 0.99]))
def test_a_quantile_is_within_one_bucket_of_the_exact_one(values, q):
    # (Above the first edge: the first bucket, 0..1 ms, reads from 0, as Prometheus does.)
    counts = lh.new_counts()
    for v in values:
        lh.add(counts, v)
    ordered, k = sorted(values), math.ceil(q * len(values))
    lo, hi = ordered[max(k - 1, 0)], ordered[min(k, len(values) - 1)]  # the order statistics around rank q*n
    got = lh.quantile(lh.EDGES_MS, counts, q)
    assert lo / lh.RATIO <= got <= hi * lh.RATIO


def test_a_runs_histogram_is_after_minus_before_and_a_restart_counts_from_zero():
    before, after = lh.new_counts(), lh.new_counts()
    for v in (3.0, 30.0):
        lh.add(before, v)
        lh.add(after, v)
    lh.add(after, 300.0)
    run = lh.delta(after, before)
    assert sum(run) == 1 and 300.0 / lh.RATIO <= lh.quantile(lh.EDGES_MS, run, 0.5) <= 300.0
    assert lh.delta(before, after) == before  # it shrank: the process restarted
    assert lh.quantile(lh.EDGES_MS, lh.new_counts(), 0.5) is None


def test_values_past_the_last_edge_read_as_the_last_edge():
    counts = lh.new_counts()
    lh.add(counts, 1e9)
    assert lh.quantile(lh.EDGES_MS, counts, 0.5) == lh.EDGES_MS[-1]
