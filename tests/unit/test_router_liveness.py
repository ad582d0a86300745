"""router.liveness: which replicas may take a new request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.liveness import ENGINE_DEAD, FAILED_HERE, SILENT, DropLog, exclusions, live_ids

NOW = 1000.0


def test_engine_dead_replica_is_dropped_at_its_first_report():
    stats = {"a": {"ready": True, "ts": NOW}, "b": {"ready": False, "engine_dead": True, "ts": NOW}}
    log = DropLog()
    assert live_ids(stats, (), NOW, 2.0, log) == ["a"]
    assert log.first == {"b": {"at": NOW, "reason": ENGINE_DEAD}}


def test_silent_replica_is_dropped_after_the_limit_not_before():
    stats = {"a": {"ready": True, "ts": NOW}, "b": {"ready": True, "ts": NOW - 1.9}}
    assert live_ids(stats, (), NOW, 2.0, None) == ["a", "b"]
    assert exclusions(stats, (), NOW + 0.2, 2.0) == {"b": SILENT}


def test_a_starting_replica_with_no_report_is_not_silent():
    assert live_ids({"a": {}, "b": None, "c": {"ready": False}}, (), NOW, 1.0, None) == ["a", "b", "c"]


def test_a_request_avoids_replicas_it_failed_on_without_condemning_them():
    log = DropLog()
    stats = {"a": {"ts": NOW}, "b": {"ts": NOW}}
    assert live_ids(stats, ["a"], NOW, 2.0, log) == ["b"]
    assert log.first == {}  # another request may still go to a


def test_when_every_replica_is_excluded_all_are_kept():
    stats = {"a": {"engine_dead": True}, "b": {"ts": NOW}}
    assert live_ids(stats, ["b"], NOW, 2.0, None) == ["a", "b"]


def test_drop_log_keeps_the_first_drop_and_is_bounded():
    log = DropLog(max_entries=2)
    log.note("a", SILENT, 1.0)
    log.note("a", ENGINE_DEAD, 2.0)
    assert log.first["a"] == {"at": 1.0, "reason": SILENT}
    log.note("b", SILENT, 3.0)
    log.note("c", SILENT, 4.0)
    log.note("d", FAILED_HERE, 5.0)
    assert list(log.first) == ["b", "c"]


@given(st.dictionaries(st.sampled_from("abcdef"), st.fixed_dictionaries({}, optional={
    "ts": st.floats(NOW - 10, NOW), "engine_dead": st.booleans()})), st.lists(st.sampled_from("abcdef")))
def test_live_ids_is_a_nonempty_ordered_subset_without_excluded_ones(stats, avoid):
    ids = live_ids(stats, avoid, NOW, 2.0, None)
    assert ids == [r for r in stats if r in ids]
    excluded = exclusions(stats, avoid, NOW, 2.0)
    if stats:
        assert ids
    if len(excluded) < len(stats):
        assert not set(ids) & set(excluded)


def test_a_late_reporter_is_kept_when_the_only_other_replica_is_dead():
    """Silence is weaker than death: never send a request back to a dead engine to avoid a slow one."""
    stats = {"dead": {"engine_dead": True, "ts": NOW}, "late": {"ts": NOW - 5}}
    assert live_ids(stats, (), NOW, 2.0, None) == ["late"]
    assert live_ids({"a": {"ts": NOW - 5}, "b": {"ts": NOW}}, ["b"], NOW, 2.0, None) == ["a"]
