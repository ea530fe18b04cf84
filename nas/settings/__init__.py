"""The harness's typed configuration: one dataclass per swappable part, checked.

Hydra composes YAML from `conf/` at the edge (`nas.config`, `nas.cli`) and converts it into
these dataclasses; the study code (`nas.study.run`) only ever sees them, so it runs the same
from the command line, from a test, or from a user's script, and never imports Hydra.
Each field declares what it may hold and one validator checks them all (`nas.settings.checks`):
a wrong value is refused when the settings are made, one line per problem naming the dotted
key, the value and what would be valid. The parts live beside one another, one module each:
`study`, `train`, `pipeline`, `parts` (task, search space, sampler, pruner, tracker),
`retrain`, and `run` (`NasSettings`, the whole, with the rules across parts).
"""

from __future__ import annotations

from nas.settings.checks import SettingsError, keys_of, what_is_valid
from nas.settings.constraints import AUTO, shown
from nas.settings.objectives import (
    DIRECTIONS,
    RUNTIME_OBJECTIVES,
    direction,
    lower_is_better,
    objectives,
    task_metrics,
)
from nas.settings.parts import (
    PrunerSettings,
    SamplerSettings,
    SearchSpaceSettings,
    TaskSettings,
    TrackerSettings,
)
from nas.settings.pipeline import PipelineSettings
from nas.settings.retrain import RetrainSettings
from nas.settings.run import STAGES, NasSettings
from nas.settings.study import StudySettings
from nas.settings.train import TrainSettings

__all__ = [
    "AUTO",
    "DIRECTIONS",
    "RUNTIME_OBJECTIVES",
    "STAGES",
    "NasSettings",
    "PipelineSettings",
    "PrunerSettings",
    "RetrainSettings",
    "SamplerSettings",
    "SearchSpaceSettings",
    "SettingsError",
    "StudySettings",
    "TaskSettings",
    "TrackerSettings",
    "TrainSettings",
    "direction",
    "keys_of",
    "lower_is_better",
    "objectives",
    "shown",
    "task_metrics",
    "what_is_valid",
]
