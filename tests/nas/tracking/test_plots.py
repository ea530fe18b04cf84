"""The Pareto-front picture: drawn from the numeric rows only, skipped when there are none."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from nas.tracking.plots import numeric_pairs, save_pareto_plot

ROWS: list[dict[str, Any]] = [
    {"loss": 1.0, "tokens_per_s": 100},
    {"loss": 0.5, "tokens_per_s": 50.0},
    {"loss": None, "tokens_per_s": 10},  # a failed trial
    {"loss": math.nan, "tokens_per_s": 10},
    {"loss": True, "tokens_per_s": 10},
    {"tokens_per_s": 10},
]


def test_numeric_pairs_skip_missing_and_non_finite_values() -> None:
    assert numeric_pairs(ROWS, "loss", "tokens_per_s") == [(1.0, 100.0), (0.5, 50.0)]


def test_the_picture_is_a_png(tmp_path: Path) -> None:
    path = save_pareto_plot(ROWS, ROWS[:2], "loss", "tokens_per_s", tmp_path / "a" / "p.png")
    assert path == tmp_path / "a" / "p.png"
    assert path.read_bytes().startswith(b"\x89PNG")
    assert save_pareto_plot(ROWS[2:], [], "loss", "tokens_per_s", tmp_path / "q.png") is None
    assert not (tmp_path / "q.png").exists()
