"""The typed settings agree with the parts they configure (no processes, no Hydra)."""

from __future__ import annotations

import pytest

from nas import settings
from pipeline.local.pipemare import PipeMareConfig
from pipeline.pure.planner import PLANNERS
from pipeline.pure.schedule import SCHEDULES


def test_every_schedule_and_planner_of_the_runtime_can_be_configured() -> None:
    assert set(settings.SCHEDULES) == set(SCHEDULES)
    assert set(settings.PLANNERS) == set(PLANNERS)
    assert settings.PipelineSettings(planner="bipartition").planner == "bipartition"


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_a_pipeline_setting_takes_each_schedule(schedule: str) -> None:
    assert settings.PipelineSettings(schedule=schedule).schedule == schedule


def test_pipemare_options_are_the_runtimes() -> None:
    assert set(settings.PIPEMARE_OPTIONS) == set(PipeMareConfig.__dataclass_fields__)
    with pytest.raises(ValueError, match=r"unknown options \['decay'\]"):
        settings.PipelineSettings(schedule="pipemare", pipemare={"decay": 0.5})
    with pytest.raises(ValueError, match="apply to schedule=pipemare only"):
        settings.PipelineSettings(schedule="1f1b", pipemare={"update_every": 2})


def test_pdh_budgets_must_be_evaluation_steps() -> None:
    with pytest.raises(ValueError, match=r"budgets=\[15\] has \[15\], not an evaluation step"):
        settings.NasSettings(train=settings.TrainSettings(steps=60, eval_every=20),
                             pruner=settings.PrunerSettings("pdh", {"budgets": [15]}))  # fmt: skip


def test_the_median_pruner_needs_a_single_objective() -> None:
    with pytest.raises(ValueError, match="pruner=median is not valid with several"):
        settings.NasSettings(
            study=settings.StudySettings(objectives=("validation_loss", "tokens_per_s")),
            pruner=settings.PrunerSettings("median"),
        )
