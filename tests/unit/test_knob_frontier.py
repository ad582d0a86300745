"""The knob frontier (`simulator.knob_frontier`): kvserve's autoscaling knobs over a grid, on the suite."""

from simulator.knob_frontier import frontier, main, row_best, run_settings, settings
from simulator.suite import cells, run_cell

DEFAULT = {"headroom": 0.8, "downscale_delay_s": 30.0, "trend_z": 2.5}


def test_the_default_setting_reproduces_the_suites_kvserve_row():
    got = run_settings("step/low", 2, [DEFAULT, {**DEFAULT, "headroom": 1.0}])
    suite = run_cell(next(c for c in cells(None) if c.name == "step/low"), 2, ("kvserve",))
    run = got["runs"][0]
    assert run["slo_attainment"] == suite["kvserve"]["slo_attainment"]
    assert run["replica_seconds"] == suite["kvserve"]["replica_seconds"]
    assert run["oracle_replica_seconds"] == suite["kvserve"]["oracle_replica_seconds"]
    assert got["causal_bound_attainment"] == suite["causal_bound"]["slo_attainment"]
    # Planning replicas to all of their modelled capacity never costs more on this step.
    assert got["runs"][1]["replica_seconds"] <= run["replica_seconds"]


def test_the_frontier_keeps_settings_no_other_beats_on_both_counts():
    counts = [{"attainment_met": 14, "cost_met": 12}, {"attainment_met": 12, "cost_met": 16},
              {"attainment_met": 12, "cost_met": 12}, {"attainment_met": 14, "cost_met": 12},
              {"attainment_met": 13, "cost_met": 11}]
    assert frontier(counts) == [0, 1, 3]


def test_a_rows_best_is_its_cheapest_setting_that_keeps_attainment():
    grid = settings({"headroom": (0.8, 0.9, 1.0)})
    row = [{"attainment_met": True, "cost_met": False, "slo_attainment": 1.0, "cost_over_oracle": 1.3},
           {"attainment_met": True, "cost_met": True, "slo_attainment": 1.0, "cost_over_oracle": 1.1},
           {"attainment_met": False, "cost_met": True, "slo_attainment": 0.7, "cost_over_oracle": 0.9}]
    best = row_best(row, grid)
    assert best["setting"] == {"headroom": 0.9} and best["cost_over_oracle"] == 1.1
    assert best["settings_meeting_attainment"] == 2 and best["settings_meeting_both"] == 1
    assert row_best([{**row[2]}], grid[2:])["setting"] is None


def test_the_cli_counts_rows_per_setting_and_marks_the_default(tmp_path, capsys):
    out = main(["--only", "step/low", "--seeds", "2,5", "--tune-seeds", "2", "--grid",
                '{"headroom": [0.8, 1.0], "downscale_delay_s": [30], "trend_z": [2.5]}',
                "--json", str(tmp_path / "kf.json")])
    assert out["grid"][out["default_setting"]] == DEFAULT
    rows = out["report"]["rows"]
    assert set(rows) == {"step/low", "step/low/cpu"} and all(len(r) == 2 for r in rows.values())
    for i, c in enumerate(out["report"]["settings"]):
        assert c["attainment_met"] == sum(r[i]["attainment_met"] for r in rows.values())
        assert c["both_met"] + len(c["missed"]) == 2
    assert out["tune"]["settings"] and "(the default)" in capsys.readouterr().out
    assert (tmp_path / "kf.json").exists()
