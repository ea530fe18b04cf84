"""The `search_2h` slices of `search_throughput.py`: the study run for a few minutes of
wall time with the old default shape and with `auto` (or `auto`'s read from a stored
study), and what each judged per hour.

Why it exists: `search_throughput.py` measures samples per second per shape; a slice is a
whole search for a while, a different measurement with its own figures.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

SHAPE_ARGS = {  # a slice's mode -> its shape's overrides
    "old_default": ["pipeline=cpu_2_stages", "study.workers=1"],
    "auto": [],
    "pool": ["pipeline.per_candidate=true"],  # each candidate its own stages on a stage pool
}


def search_slice(
    mode: str, minutes: float, folder: Path, overrides: list[str] | None = None
) -> dict[str, Any]:
    """`search_2h` for `minutes` of wall time (search only, a fresh study) on the shape of
    `mode` (`SHAPE_ARGS`), with Hydra `overrides` after the experiment's: the trials finished
    within `minutes` of the command's start, per hour of those minutes (the study's workers
    end the trials they began before its timeout, a full-budget one over a minute later)."""
    name = f"slice-{mode}"
    shape_args = SHAPE_ARGS[mode]
    command = [
        sys.executable,
        "-m",
        "nas",
        "experiment=search_2h",
        "stages=[search]",
        "tracker=none",
        f"study.name={name}",
        f"study.timeout_s={minutes * 60}",
        "study.time_budget_s=null",
        f"studies_dir={folder / 'studies'}",
        f"hydra.run.dir={folder / name}",
        *shape_args,
        *(overrides or []),
    ]
    started = time.time()
    subprocess.run(command, check=True, cwd=folder, stdout=subprocess.DEVNULL)
    run_wall_s = time.time() - started
    storage = f"sqlite:///{folder / 'studies' / f'{name}.db'}"
    return {**_first_minutes(storage, name, started, minutes), "run_wall_s": run_wall_s}


def stored_slice(storage: str, name: str, started: str, minutes: float) -> dict[str, Any]:
    """The first `minutes` of a stored `search_2h` study started (its command) at `started`
    (ISO time): the trials finished by then, per hour of those minutes."""
    started_at = datetime.fromisoformat(started).timestamp()
    return {**_first_minutes(storage, name, started_at, minutes), "from_study": f"{storage} {name}"}


def _first_minutes(storage: str, name: str, started: float, minutes: float) -> dict[str, Any]:
    """The figures of the trials of study `name` finished within `minutes` of `started`
    (epoch seconds), per hour of those minutes."""
    import optuna

    from nas.study.trials import counted

    end = started + 60 * minutes
    study = optuna.load_study(study_name=name, storage=storage)
    done = [
        t
        for t in study.trials
        if counted(t) and t.datetime_complete and t.datetime_complete.timestamp() <= end
    ]
    return _slice_figures(done, 60 * minutes)


def _slice_figures(done: list[Any], wall_s: float) -> dict[str, Any]:
    """Candidates, full-budget candidates and steps per hour of `done` (counted trials)."""
    import optuna

    from nas.search.fidelity import Fidelity, fidelity_of
    from nas.study.inheritance import INHERITED_FROM
    from nas.study.phases import shares

    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    inherited = [t for t in complete if fidelity_of(t) is Fidelity.INHERITED]
    full = [t for t in complete if t not in inherited]
    # each parent's control (study.fidelity=inherited) trains as many steps as a child, once
    controls = {t.user_attrs[INHERITED_FROM]: int(t.user_attrs["steps"]) for t in inherited}
    steps = sum(int(t.user_attrs.get("steps", 0)) for t in done) + sum(controls.values())
    hours = wall_s / 3600
    trial_s, by_phase = shares(t.user_attrs for t in done)
    return {
        "wall_s": wall_s,
        "shape": done[0].user_attrs.get("shape") if done else None,
        "finished": len(done),
        "complete_full_budget": len(full),
        "complete_inherited": len(inherited),
        "controls": len(controls),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in done),
        "steps_trained": steps,
        "candidates_per_h": len(done) / hours,
        "full_budget_candidates_per_h": len(full) / hours,
        "steps_per_h": steps / hours,
        "best_validation_loss": min((t.values[0] for t in full), default=None),
        "best_estimate": min((t.values[0] for t in inherited), default=None),
        # where the trials' seconds went (`nas.study.phases`): steps and fixed costs
        "trial_seconds": trial_s,
        "time_share_by_phase": by_phase,
    }


def search_slices(args: argparse.Namespace) -> dict[str, Any]:
    """The `search_2h` slices, old default and auto, and auto's ratios over the old."""
    slices: dict[str, Any] = {}
    if args.auto_slice_study:
        storage, name, started = args.auto_slice_study
        slices["auto"] = stored_slice(storage, name, started, args.slice_min)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.slice_modes:
            if mode not in slices:
                slices[mode] = search_slice(mode, args.slice_min, Path(tmp), args.slice_overrides)
    if {"auto", "old_default"} <= slices.keys():
        slices["auto_over_old_default"] = {
            key: slices["auto"][key] / max(slices["old_default"][key], 1e-9)
            for key in ("candidates_per_h", "full_budget_candidates_per_h", "steps_per_h")
        }
    return slices
