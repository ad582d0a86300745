"""The reaction budget (`simulator.reaction_budget`): the oracle's counts asked for L s into each minute."""

from autoscaling.base import ScalingInput
from simulator.bounds import LaggedScript
from simulator.metrics import slo_attainment
from simulator.reaction_budget import attainment_at_lags, main
from simulator.suite import ZeroLagScript, cell_setup, cells, oracle_need, run_script


def test_lag_zero_is_the_causal_bound_and_a_late_ask_loses_the_step_minute():
    cell = next(c for c in cells(None) if c.name == "step/low")
    setup = cell_setup(cell, 2)
    _, need = oracle_need(setup)
    causal = run_script(setup, ZeroLagScript(need), setup.cfg.autoscaling, "causal_bound")
    got = attainment_at_lags("step/low", 2, [0.0, 30.0])
    assert got[0.0] == slo_attainment(causal.requests, causal.itl, setup.cfg.slo) == 1.0
    # Seed 2's step needs a second replica in minute 2; asked for 30 s late, it serves too late for that minute.
    assert got[30.0] < got[0.0]


def test_the_lagged_script_without_a_gate_asks_for_the_minute_it_saw():
    script = LaggedScript([1, 3, 2], 12.0, 0.0, 0.0)

    def ask(now: float, current: int) -> int:
        return script.decide(ScalingInput(now=now, target_replicas=current, running_replicas=current,
                                          metrics=[])).replicas

    assert ask(5.0, 1) == 1  # nothing seen yet: holds
    assert ask(65.0, 1) == 1  # minute 1 started 5 s ago: still minute 0's count
    assert ask(72.0, 1) == 3  # 12 s in: minute 1's count at once (no delay gate)
    assert ask(132.0, 3) == 2


def test_the_cli_writes_medians_per_seed_set(tmp_path, capsys):
    out = main(["--cells", "step/low", "--lags", "0,30", "--seeds", "2,5", "--tune-seeds", "2",
                "--json", str(tmp_path / "rb.json")])
    row = out["cells"]["step/low"]["0"]
    assert set(row["per_seed"]) == {"2", "5"} and row["tune"] == row["per_seed"]["2"]
    assert row["report"] == row["per_seed"]["5"]
    assert "step/low" in capsys.readouterr().out and (tmp_path / "rb.json").exists()
