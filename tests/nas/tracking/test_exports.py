"""What the trackers and the study record of exported models: the artifact's name and
metadata read from an export folder, and the study's `exported_models` attribute kept up to
date across a resumed retraining (a real Optuna study in SQLite, real folders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest

from nas.tracking.exports import (
    EXPORTED_MODELS,
    export_metadata,
    exported_seed,
    model_artifact_name,
    record_exports,
)


def export(folder: Path, seed: int, trial: int | None = 3, **more: Any) -> str:
    """A folder with the metrics.json an export writes (`nas.retrain.trainer._export`)."""
    folder.mkdir(parents=True, exist_ok=True)
    metrics = {
        "validation_loss": 1.25,
        "validation_chrf": 40.5,
        "test_loss": 1.3,
        "chrf": 40.5,
        "params": 12345,
        "steps": 6,
        "seed": seed,
        "trial": trial,
        "per_seed": [{"seed": seed, "validation_loss": 1.25}],
        **more,
    }
    (folder / "metrics.json").write_text(json.dumps(metrics))
    return str(folder)


def test_the_artifact_name_and_metadata_of_an_export(tmp_path: Path) -> None:
    folder = export(tmp_path / "trial-3", seed=1)
    assert model_artifact_name("my study", "trial-3") == "my-study-trial-3"
    assert exported_seed(folder) == 1
    # the task's headline metrics the export records ("bleu" it does not)
    headline = ("chrf", "bleu")
    assert export_metadata(folder, headline_metrics=headline, model="trial-3") == {
        "trial": 3,
        "seed": 1,
        "steps": 6,
        "chrf": 40.5,
        "parameters": 12345,
        "validation_loss": 1.25,
        "validation_chrf": 40.5,
        "model": "trial-3",
    }
    assert "chrf" not in export_metadata(folder, headline_metrics=())  # a task without it
    with pytest.raises(FileNotFoundError, match="missing is not an exported model"):
        export_metadata(tmp_path / "missing", headline_metrics=headline)


def test_the_study_keeps_each_export_with_the_run_that_logged_it(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    best = export(tmp_path / "trial-3", seed=0)
    seed_model = export(tmp_path / "transformer", seed=1, trial=None)
    record_exports(study, {"trial-3": best, "transformer": seed_model}, {("trial-3", 0): "run-a"})
    stored = optuna.load_study(study_name="s", storage=storage)  # as another process reads it
    assert stored.user_attrs[EXPORTED_MODELS] == {
        "trial-3": {"folder": best, "seed": 0, "trial": 3, "tracker_run_id": "run-a"},
        "transformer": {"folder": seed_model, "seed": 1, "trial": None, "tracker_run_id": None},
    }
    # resumed: the same export again (its run tracked before) keeps its id; a new best seed
    # takes its own run's
    record_exports(study, {"trial-3": best}, {})
    assert study.user_attrs[EXPORTED_MODELS]["trial-3"]["tracker_run_id"] == "run-a"
    export(tmp_path / "trial-3", seed=2)
    written = record_exports(study, {"trial-3": best}, {("trial-3", 2): "run-c"})
    assert written["trial-3"] == {"folder": best, "seed": 2, "trial": 3, "tracker_run_id": "run-c"}
    assert study.user_attrs[EXPORTED_MODELS] == written
    assert written["transformer"]["folder"] == seed_model  # the others are kept
