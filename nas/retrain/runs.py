"""Finished retraining runs kept on disk, so that a stopped retraining resumes where it stopped.

Retraining trains every chosen model once per training seed at the full budget: tens of
minutes on a small machine. A run that finished is written beside its model's export,

    <retrain.models_dir>/<study>/<model>/runs/seed-<seed>.json

after the export was brought up to date (the model's best seed so far is exported as soon
as it is known), so a retraining killed at any point leaves every recorded run's weights
behind it. Run again, the retraining reads the records back and trains only the runs that
are missing. A record is reused only when it was trained the same way: the same
architecture, steps, training settings and task (its `fingerprint`); anything else is
trained again. Records are plain JSON (the run's figures and history), written whole and
renamed into place, so a crash mid-write leaves no half record.

A run that has not finished yet resumes too (`retrain.checkpoint_every`): every N steps
the pipeline is saved into

    <retrain.models_dir>/<study>/<model>/checkpoints/seed-<seed>/

(`checkpoint_folder`; `nas.study.checkpoints.RunCheckpoints` keeps it, with the run's
step history). Run again, the run resumes from its newest checkpoint with its history up to
that step; the folder is deleted once the finished run is recorded (`save`).

Several workers retraining one study at once train each run once: a run is claimed beside
its record (`runs/seed-<seed>.claim`) before it trains (`nas.retrain.claims`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.study.checkpoints import fingerprint, plain

__all__ = [
    "checkpoint_folder",
    "fingerprint",
    "load",
    "mark_tracked",
    "record_path",
    "save",
]


def record_path(model_folder: Path, seed: int) -> Path:
    return model_folder / "runs" / f"seed-{seed}.json"


def save(
    model_folder: Path, seed: int, digest: str, run: Mapping[str, Any], *, tracked: bool = False
) -> Path:
    """Write one finished run's record (atomically: written beside, then renamed);
    `tracked`: whether its tracker run was written already."""
    path = record_path(model_folder, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    record = {"fingerprint": digest, "tracked": tracked, "run": dict(run)}
    partial.write_text(json.dumps(record, default=plain))
    os.replace(partial, path)
    _remove_checkpoints(model_folder, seed)  # finished and recorded: nothing to resume
    return path


def load(model_folder: Path, seed: int, digest: str) -> tuple[dict[str, Any], bool] | None:
    """The recorded run of this model and seed, and whether it was tracked, if it was
    trained as `digest` says; None when there is none, it was trained otherwise, or it
    cannot be read."""
    path = record_path(model_folder, seed)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != digest:
        return None
    run = record.get("run")
    return (run, bool(record.get("tracked"))) if isinstance(run, dict) else None


def mark_tracked(model_folder: Path, seed: int, digest: str) -> None:
    """Note that the recorded run's tracker run was written (a resumed retraining skips it)."""
    found = load(model_folder, seed, digest)
    if found is not None:
        save(model_folder, seed, digest, found[0], tracked=True)


def checkpoint_folder(model_folder: Path, seed: int) -> Path:
    """Where the unfinished run of this model and seed keeps its checkpoints (module doc)."""
    return model_folder / "checkpoints" / f"seed-{seed}"


def _remove_checkpoints(model_folder: Path, seed: int) -> None:
    folder = checkpoint_folder(model_folder, seed)
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent.is_dir() and not any(folder.parent.iterdir()):
        # the model's last unfinished run (unless another worker starts one: it stays)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()
