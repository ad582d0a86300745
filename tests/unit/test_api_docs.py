"""docs/API.md's bad-input table is the one the integration tests send, row for row."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.bad_inputs import BAD_INPUTS

API_MD = Path(__file__).resolve().parents[2] / "docs" / "API.md"


def _doc_rows() -> list[tuple[str, str, int, str]]:
    text = API_MD.read_text()
    table = text.split("<!-- bad-inputs -->", 2)[1]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d{3}", cells[2]):
            rows.append((cells[0], cells[1].strip("`"), int(cells[2]), cells[3].strip("`")))
    return rows


def test_docs_table_lists_every_bad_input_with_its_status():
    expected = [(b.problem, f"{b.method} {b.path}", b.status, b.param or "") for b in BAD_INPUTS]
    assert _doc_rows() == expected


def test_the_table_has_at_least_40_rows_and_no_5xx():
    assert len(BAD_INPUTS) >= 40
    assert all(400 <= b.status < 500 for b in BAD_INPUTS)
    assert len({b.problem for b in BAD_INPUTS}) == len(BAD_INPUTS)  # each row names one problem
