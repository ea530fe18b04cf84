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
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["fingerprint", "load", "mark_tracked", "record_path", "save"]


def fingerprint(architecture: str, steps: int, training: Mapping[str, Any]) -> str:
    """What makes two runs of one model and seed the same run: a digest of how it trains."""
    document = json.dumps(
        {"architecture": architecture, "steps": steps, **training}, sort_keys=True, default=str
    )
    return hashlib.sha256(document.encode()).hexdigest()[:16]


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
    partial.write_text(json.dumps(record, default=_plain))
    os.replace(partial, path)
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


def _plain(value: Any) -> Any:
    """JSON for what a run holds besides JSON types (numpy and torch scalars)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a retraining record cannot hold {type(value).__name__}")
