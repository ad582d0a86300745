"""The layer contracts (pyproject.toml [tool.importlinter]) hold, and they catch a violation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("kvserve", "router", "autoscaling", "flow", "deployments", "simulator", "bench", "cluster", "cli")
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--no-cache"], cwd=root, env=env, capture_output=True, text=True, timeout=120)


def _copy_tree(tmp: Path) -> Path:
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, tmp / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.json", "*.png"))
    return tmp


def test_the_tree_keeps_every_contract() -> None:
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


def test_a_core_importing_an_adapter_breaks_the_layers(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    cost = root / "router" / "cost.py"
    cost.write_text(cost.read_text() + "\nfrom simulator.engine import SimRequest  # noqa: E402,F401\n")
    done = _lint(root)
    assert done.returncode != 0
    assert "router is not allowed to import simulator" in done.stdout


def test_a_core_importing_ray_or_the_config_is_forbidden(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    window = root / "autoscaling" / "window.py"
    window.write_text(window.read_text() + "\nimport ray  # noqa: E402,F401\nfrom kvserve.config import SLOConfig  # noqa: E402,F401\n")
    done = _lint(root)
    assert done.returncode != 0
    assert "autoscaling.window -> ray" in done.stdout
    assert "autoscaling.window -> kvserve.config" in done.stdout
