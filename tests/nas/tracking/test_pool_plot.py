"""The stage pool over time, drawn from trial rows: only rows that ran on the pool, well
formed, are drawn; none, no picture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nas.tracking.pool_plot import (
    POOL_ENDED,
    POOL_PROCESSES,
    POOL_STARTED,
    pool_rows,
    save_pool_plot,
)
from tests.nas.tracking.test_plots import is_png

RAN: list[dict[str, Any]] = [  # one trial on process 0, then one on both, beside a third
    {"number": 0, POOL_PROCESSES: [0], POOL_STARTED: 100.0, POOL_ENDED: 130.0, "partition": [6]},
    {"number": 1, POOL_PROCESSES: [1, 0], POOL_STARTED: 131, POOL_ENDED: 190, "partition": [3, 3]},
    {"number": 2, POOL_PROCESSES: [1], POOL_STARTED: 100.5, POOL_ENDED: 128.0},
]
NOT_ON_THE_POOL: list[dict[str, Any]] = [
    {"number": 3, "state": "FAIL"},  # refused: no pipeline fits it
    {"number": 4, POOL_PROCESSES: [], POOL_STARTED: 1.0, POOL_ENDED: 2.0},
    {"number": 5, POOL_PROCESSES: [0], POOL_STARTED: 3.0, POOL_ENDED: 2.0},
    {"number": 6, POOL_PROCESSES: ["0"], POOL_STARTED: 1.0, POOL_ENDED: 2.0},
]


def test_only_trials_that_ran_on_the_pool_are_drawn(tmp_path: Path) -> None:
    assert pool_rows([*RAN, *NOT_ON_THE_POOL]) == RAN
    path = save_pool_plot([*RAN, *NOT_ON_THE_POOL], tmp_path / "report" / "stage_pool.png")
    assert path == tmp_path / "report" / "stage_pool.png" and is_png(path)
    assert save_pool_plot(NOT_ON_THE_POOL, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()
