"""The project's shared/ folder, laid beside the checkout for every session and CI run.

Tests that read it fail when it is missing, never skip: a skip would hide that they did not run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared"


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.fail(f"{path.resolve()} is missing: this test needs the project's shared/ folder beside the checkout")
    return path
