"""Exported models as the trackers and the study record them.

The retrain stage exports each model's best seed to a folder (`nas.export.writing`); that folder is
logged as a model artifact in the tracker run of the seed it holds (`Tracker.log_model`),
and the study keeps where each model went. Optuna refuses user attributes on a finished
trial and retraining runs after the trials finished, so the export paths are one study user
attribute, `exported_models`: {model name: {"folder", "seed", "trial", "tracker_run_id"}}
("trial" is None for a seed architecture; "tracker_run_id" the run that logged the
artifact). A resumed retraining updates the entries it exported again and keeps the others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nas.tracking.base import artifact_name

if TYPE_CHECKING:
    import optuna

__all__ = [
    "EXPORTED_MODELS",
    "export_metadata",
    "exported_seed",
    "model_artifact_name",
    "record_exports",
]

EXPORTED_MODELS = "exported_models"  # the study user attribute
_FIGURES = ("trial", "seed", "steps", "samples_per_s")  # then the task's headline metrics


def _metrics(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not an exported model: it has no metrics.json")
    metrics: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return metrics


def model_artifact_name(study: str, model: str) -> str:
    """The artifact a model of a study is logged as: `<study>-<model>`, in the characters
    every tracker takes (`artifact_name`)."""
    return artifact_name(f"{study}-{model}")


def export_metadata(
    folder: str | Path, *, headline_metrics: Sequence[str], **extra: Any
) -> dict[str, Any]:
    """What the artifact of export `folder` says: from its metrics.json the trial, seed,
    steps, throughput, the `headline_metrics` it records (the task's: `Task.headline_metrics`),
    parameter count (`parameters`) and every validation figure, then `extra` (e.g. the
    model's name and sampled parameters)."""
    metrics = _metrics(folder)
    figures = {k: metrics[k] for k in (*_FIGURES, *headline_metrics) if k in metrics}
    validation = {k: v for k, v in metrics.items() if k.startswith("validation_")}
    return {**figures, "parameters": metrics.get("params"), **validation, **extra}


def exported_seed(folder: str | Path) -> int:
    """The training seed whose weights export `folder` holds."""
    return int(_metrics(folder)["seed"])


def record_exports(
    study: optuna.Study, exported: Mapping[str, str], run_ids: Mapping[tuple[str, int], str]
) -> dict[str, dict[str, Any]]:
    """Write `exported` (model name -> folder) into the study's `exported_models`, each with
    the run id that logged it (`run_ids[(model, seed)]`, else the one recorded before for
    the same seed); returns the attribute as written."""
    recorded: dict[str, dict[str, Any]] = dict(study.user_attrs.get(EXPORTED_MODELS) or {})
    for name, folder in exported.items():
        metrics = _metrics(folder)
        seed = int(metrics["seed"])
        before = recorded.get(name) or {}
        run_id = run_ids.get((name, seed))
        if run_id is None and before.get("seed") == seed:
            run_id = before.get("tracker_run_id")
        recorded[name] = {
            "folder": str(Path(folder).resolve()),
            "seed": seed,
            "trial": metrics.get("trial"),
            "tracker_run_id": run_id,
        }
    study.set_user_attr(EXPORTED_MODELS, recorded)
    return recorded
