"""A real study end to end: Hydra compose -> typed settings -> stage processes -> SQLite.

Tiny models and few steps, but every part is real: Optuna with SQLite storage, two gloo
stage processes kept for the whole study, the translation task's data, the JSONL tracker.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from hydra import compose, initialize_config_dir

from nas.config import CONFIG_DIR, register, to_settings
from nas.settings import NasSettings
from nas.study import run_study
from nas.trials import INTERRUPTED

pytestmark = pytest.mark.multiprocess


def settings(tmp_path: Path, *overrides: str) -> NasSettings:
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[
            "tracker=jsonl", "train.steps=6", "train.eval_every=3", "train.eval_batches=1",
            "train.batch_size=16", "search_space.d_model=[32]", "search_space.max_cells=1",
            f"studies_dir={tmp_path / 'studies'}", f"output_dir={tmp_path / 'run'}",
            *overrides,
        ])  # fmt: skip
    return to_settings(cfg)


def test_a_study_runs_resumes_and_records_failures(tmp_path: Path) -> None:
    first = settings(tmp_path, "study.name=t", "study.n_trials=3")
    result = run_study(first)
    study = optuna.load_study(study_name="t", storage=first.storage_url)
    assert result.finished == 3 and len(study.trials) == 3
    seeds = study.trials[:2]  # the Transformer and the Evolved Transformer come first
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in seeds)
    assert [t.user_attrs["architecture"][:9] for t in seeds] == ["d=32 enc "] * 2
    for t in study.trials:  # a sampled architecture may break a rule: failed, with its cause
        assert t.state == optuna.trial.TrialState.COMPLETE or t.user_attrs["fail_reason"]
    assert (tmp_path / "run" / "tracking").exists()
    # re-running the same study continues toward the new total on fresh processes
    assert run_study(settings(tmp_path, "study.name=t", "study.n_trials=4")).finished == 4
    assert len(optuna.load_study(study_name="t", storage=first.storage_url).trials) == 4
    # a memory budget no plan fits: failed with its cause, and the next trial still runs
    tight = settings(tmp_path, "study.name=tight", "study.n_trials=2",
                     "pipeline.memory_budget=1000")
    assert run_study(tight).finished == 2
    failed = optuna.load_study(study_name="tight", storage=tight.storage_url).trials
    assert [t.state for t in failed] == [optuna.trial.TrialState.FAIL] * 2
    assert all("InfeasibleBudgetError" in t.user_attrs["fail_reason"] for t in failed)
    assert not any(t.user_attrs.get(INTERRUPTED) for t in failed)


@pytest.mark.parametrize("override,message", [
    ("sampler.name=foo", "sampler='foo' is not valid; valid values: tpe, nsga2"),
    ("pipeline.schedule=zigzag", "pipeline.schedule='zigzag' is not valid"),
    ("study.objectives=[tokens_per_s]", "must start with validation_loss"),
    ("search_space.decoder_only=true", "does not fit task=translation"),
    ("search_space.d_model=[48]", "widths are positive multiples of 32"),
])  # fmt: skip
def test_invalid_values_name_the_key_and_the_valid_ones(
    tmp_path: Path, override: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        settings(tmp_path, override)
