"""What `study_scaling.py` reports: a run's trial figures, the summary over rounds per
worker count, and the table.

Why it exists: reading a study's trials into trials per hour and per core, the medians and
ranges over rounds, and their table are the report, apart from running and measuring.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable
from typing import Any

from optuna.trial import FrozenTrial
from rich.console import Console
from rich.table import Table
from study_scaling_storage import trial_seconds

from nas.study.trials import OWNER, counted


def study_figures(trials: list[FrozenTrial], wall: float, n: int, cores: int) -> dict[str, Any]:
    done = [t for t in trials if counted(t)]
    walls = [s for t in done if (s := trial_seconds(t)) is not None]
    trained = [
        (s, float(t.user_attrs["seconds"]))
        for t in done
        if (s := trial_seconds(t)) is not None and "seconds" in t.user_attrs
    ]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    per_hour = 3600 * len(done) / wall
    return {
        "workers": n,
        "wall_s": wall,
        "trials_stored": len(trials),
        "trials_counted": len(done),
        "states": dict(collections.Counter(t.state.name for t in trials)),
        "trials_per_worker": sorted(
            collections.Counter(str(t.user_attrs.get(OWNER)) for t in done).values()
        ),
        "trials_per_hour": per_hour,
        "trials_per_hour_per_core": per_hour / cores,
        "first_start_to_last_end_s": span,
        "trials_per_hour_first_start_to_last_end": 3600 * len(done) / span if span else None,
        "trial_wall_s": walls,
        "trial_build_and_train_s": [b for _, b in trained],
        "trial_outside_build_and_train_s": [s - b for s, b in trained],
        "median_trial_wall_s": statistics.median(walls) if walls else None,
    }


def _spread(values: list[float]) -> dict[str, float | list[float] | None]:
    return {
        "median": statistics.median(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "rounds": values,
    }


def summarise(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    def pick(n: int, get: Callable[[dict[str, Any]], Any]) -> list[float]:
        return [float(v) for r in runs if r["workers"] == n and (v := get(r)) is not None]

    measures: dict[str, Callable[[dict[str, Any]], Any]] = {
        "trials_per_hour": lambda r: r["trials_per_hour"],
        "trials_per_hour_per_core": lambda r: r["trials_per_hour_per_core"],
        "trials_per_hour_first_start_to_last_end": lambda r: r[
            "trials_per_hour_first_start_to_last_end"
        ],
        "trials_counted": lambda r: r["trials_counted"],
        "median_trial_wall_s": lambda r: r["median_trial_wall_s"],
        "storage_s_per_trial": lambda r: r["storage"].get("storage_s_per_trial"),
        "storage_share_of_trial_wall": lambda r: r["storage"].get("share_of_trial_wall"),
        "storage_share_of_worker_time": lambda r: r["storage"].get("share_of_worker_time"),
        "heartbeat_s_per_trial": lambda r: r["storage"].get("heartbeat_s_per_trial"),
        "calls_per_trial": lambda r: r["storage"].get("calls_per_trial"),
        "server_transactions_per_trial": lambda r: r["storage"]["server_transactions_per_trial"],
        "server_active_share_of_trial_wall": lambda r: r["storage"][
            "server_active_share_of_trial_wall"
        ],
        "outside_build_and_train_share_of_trial_wall": lambda r: r["storage"][
            "outside_build_and_train_share_of_trial_wall"
        ],
    }
    summary: dict[str, Any] = {
        str(n): {k: _spread(pick(n, get)) for k, get in measures.items()} for n in counts
    }
    base = summary.get(str(counts[0]), {})
    for n in counts:
        ratios = {}
        for k in ("trials_per_hour", "trials_per_hour_first_start_to_last_end"):
            mine, ref = summary[str(n)][k]["median"], base.get(k, {}).get("median")
            ratios[k] = mine / ref if mine is not None and ref else None
        summary[str(n)][f"vs_{counts[0]}_worker"] = ratios
    return summary


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def print_table(summary: dict[str, Any], counts: list[int], console: Console) -> None:
    table = Table(title="one PostgreSQL study, W workers x 2 stages (medians over rounds)")
    for column in (
        "W",
        "trials/h",
        "per core",
        "first start-last end",
        f"vs W={counts[0]}",
        "trial wall s",
        "storage/trial",
        "share of trial",
        "server active",
        "outside train",
    ):
        table.add_column(column, justify="right")
    for n in counts:
        s = summary[str(n)]
        table.add_row(
            str(n),
            num(s["trials_per_hour"]["median"]),
            num(s["trials_per_hour_per_core"]["median"]),
            num(s["trials_per_hour_first_start_to_last_end"]["median"]),
            num(s[f"vs_{counts[0]}_worker"]["trials_per_hour"], 2),
            num(s["median_trial_wall_s"]["median"], 2),
            "-"
            if s["storage_s_per_trial"]["median"] is None
            else f"{1000 * s['storage_s_per_trial']['median']:.0f} ms",
            pct(s["storage_share_of_trial_wall"]["median"]),
            pct(s["server_active_share_of_trial_wall"]["median"]),
            pct(s["outside_build_and_train_share_of_trial_wall"]["median"]),
        )
    console.print(table)
