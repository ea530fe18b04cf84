"""How the W&B tracker writes values: metric summaries, table cells, a summary's last value.

Pure: no wandb import. A metric summarises as its best and its last value when its direction
is known (`metric_summary`); a table cell holds a scalar, or JSON text for a list or a
mapping; `sync_command` is the shell command that uploads offline runs.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from nas.tracking.base import json_safe

__all__ = [
    "STEP_METRIC",
    "Direction",
    "cell",
    "columns",
    "metric_summary",
    "set_last",
    "sync_command",
]

Direction = Literal["minimize", "maximize"]
STEP_METRIC = "step"  # logged in every trial row: the x axis of the trial's metrics
_SPLITS = ("validation_", "test_", "train_")
_RISING = ("accuracy",)  # by name, when no direction is declared (every task has it)


def sync_command(directories: Iterable[str | Path]) -> str:
    """The shell command that uploads offline runs: `wandb sync <run folder> ...`."""
    paths = [str(d) for d in directories]
    if not paths:
        raise ValueError("sync_command needs at least one run folder")
    return shlex.join(["wandb", "sync", *paths])


def metric_summary(name: str, directions: Mapping[str, Direction] | None = None) -> str | None:
    """How W&B summarises metric `name`: "min,last" when lower is better, "max,last" when
    higher is, None when neither is known (W&B's default: the last value).

    The direction is `directions[name]`, else that of its validation twin
    (`directions["validation_<metric>"]` for "loss", "test_loss", "stage0/train_loss"...), else
    the name's: a loss ("loss", "*_loss") is minimised, accuracy maximised; any other
    metric of a task needs its declared direction."""
    base = name.rsplit("/", 1)[-1]
    for split in _SPLITS:
        base = base.removeprefix(split)
    way = (directions or {}).get(name) or (directions or {}).get(f"validation_{base}")
    if way is None and (base == "loss" or base.endswith("_loss")):
        way = "minimize"
    if way is None and base in _RISING:
        way = "maximize"
    return None if way is None else ("min,last" if way == "minimize" else "max,last")


def cell(value: Any) -> Any:
    """A table cell: scalars as they are, lists and dicts as JSON text."""
    value = json_safe(value)
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return value


def columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(str(k) for k in row))
    return list(columns)


def set_last(run: Any, key: str, value: Any) -> None:
    """`value` as the "last" of `key`'s summary {"min"|"max", "last"}, keeping its best;
    written plainly when W&B holds no such summary for `key`."""
    try:
        run.summary[key]["last"] = value
    except (KeyError, TypeError):
        run.summary[key] = value
