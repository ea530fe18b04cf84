"""The stage pool over time as a PNG: which process trained which trial's which layers, when.

A study on the stage pool (`pipeline.per_candidate`, `nas.study.pooled`) trains each
candidate on the stage count it needs, several at once: a trial records the pool processes
its job ran on, by rank (`POOL_PROCESSES`), when the job started and ended (`POOL_STARTED`,
`POOL_ENDED`: seconds since the epoch) and its partition (layers per stage). Drawn from
those rows, one lane per process::

    process 1 │      ████ 3: L4-7 ████      ██ 5: all ██
    process 0 │ ██ 1: all ██ ████ 3: L0-3 ████   ██ 4: all ██
              └──────────────────────────────────────────> seconds (minutes)

A trial on two lanes at once is a pipeline of two stages; the same colour is one trial. The
report draws it from the stored study, the W&B tracker from its rows (`Tracker.end_study`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["POOL_ENDED", "POOL_PROCESSES", "POOL_STARTED", "pool_rows", "save_pool_plot"]

POOL_PROCESSES = "pool_processes"  # the pool processes of the trial's job, by rank
POOL_STARTED = "pool_started"  # when its job began on them (seconds since the epoch)
POOL_ENDED = "pool_ended"  # when they were free again


def pool_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The rows of trials that ran on the pool (every key the picture needs, well formed)."""
    kept = []
    for row in rows:
        processes, started, ended = (row.get(k) for k in (POOL_PROCESSES, POOL_STARTED, POOL_ENDED))
        if (
            isinstance(processes, list | tuple)
            and processes
            and all(isinstance(p, int) for p in processes)
            and isinstance(started, int | float)
            and isinstance(ended, int | float)
            and ended >= started
        ):
            kept.append(row)
    return kept


def _layers(row: Mapping[str, Any], rank: int) -> str:
    """The layers stage `rank` held: "all" for one stage, else "L<first>-<last>"."""
    sizes = row.get("partition")
    if not isinstance(sizes, list | tuple) or len(sizes) <= rank or len(sizes) == 1:
        return "all"
    first = sum(int(s) for s in sizes[:rank])
    return f"L{first}-{first + int(sizes[rank]) - 1}"


def save_pool_plot(rows: Sequence[Mapping[str, Any]], path: str | Path) -> Path | None:
    """Save the pool over time (module doc) from trial rows (`nas.study.trials.trials_table`);
    None when no trial ran on the pool, or matplotlib is not installed."""
    ran = pool_rows(rows)
    if not ran:
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    start = min(float(r[POOL_STARTED]) for r in ran)
    span = max(float(r[POOL_ENDED]) for r in ran) - start
    unit, per = ("minutes", 60.0) if span >= 120 else ("seconds", 1.0)
    lanes = sorted({p for r in ran for p in r[POOL_PROCESSES]})
    figure = Figure(figsize=(8, 1.2 + 0.6 * len(lanes)), layout="constrained")
    axes = figure.add_subplot()
    colours = [f"C{i}" for i in range(10)]
    for row in sorted(ran, key=lambda r: float(r[POOL_STARTED])):
        begin = (float(row[POOL_STARTED]) - start) / per
        width = max((float(row[POOL_ENDED]) - float(row[POOL_STARTED])) / per, 1e-3)
        colour = colours[int(row.get("number", 0)) % len(colours)]
        for rank, process in enumerate(row[POOL_PROCESSES]):
            lane = lanes.index(process)
            axes.broken_barh([(begin, width)], (lane - 0.4, 0.8), color=colour, alpha=0.85)
            axes.text(
                begin + width / 2,
                lane,
                f"{row.get('number', '?')}: {_layers(row, rank)}",
                ha="center",
                va="center",
                fontsize=7,
                clip_on=True,
            )
    axes.set_yticks(range(len(lanes)), [f"process {p}" for p in lanes])
    axes.set(
        xlabel=f"{unit} since the first trial began",
        title="the stage pool over time: each trial's layers on the processes that trained them",
    )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    return path
