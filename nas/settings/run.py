"""`NasSettings`: everything one run needs, and the rules that tie its parts together.

Each part checks its own keys (`nas.settings.study`, `train`, `pipeline`, `parts`,
`retrain`); what depends on two parts is checked here: objectives the task measures,
decoding for the objectives that need it, a pruner's rungs at evaluation steps, a
schedule that fits the learning rate, micro-batches that divide the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from nas.settings.checks import Settings, setting
from nas.settings.constraints import Integer, Subsequence
from nas.settings.objectives import RUNTIME_OBJECTIVES, task_metrics
from nas.settings.parts import (
    PrunerSettings,
    SamplerSettings,
    SearchSpaceSettings,
    TaskSettings,
    TrackerSettings,
)
from nas.settings.pipeline import PipelineSettings
from nas.settings.retrain import RetrainSettings
from nas.settings.study import StudySettings
from nas.settings.train import TrainSettings
from nas.tasks import task_class

__all__ = ["STAGES", "NasSettings"]

STAGES = ("search", "retrain")  # in this order


@dataclass
class NasSettings(Settings):
    """Everything one study needs; `output_dir` is the run folder (Hydra's, or any)."""

    section: ClassVar[str] = ""

    study: StudySettings = field(default_factory=StudySettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)
    task: TaskSettings = field(default_factory=TaskSettings)
    search_space: SearchSpaceSettings = field(default_factory=SearchSpaceSettings)
    sampler: SamplerSettings = field(default_factory=SamplerSettings)
    pruner: PrunerSettings = field(default_factory=PrunerSettings)
    tracker: TrackerSettings = field(default_factory=TrackerSettings)
    retrain: RetrainSettings = field(default_factory=RetrainSettings)
    # what a run does: "search" (run or resume the study), then "retrain" (its best,
    # from scratch, exported); either alone (retrain alone reads the stored study)
    stages: tuple[str, ...] = setting(
        STAGES, Subsequence(STAGES, "valid: [search], [retrain] or [search, retrain]")
    )
    seed: int = setting(0, Integer(low=None))
    output_dir: str = "outputs/run"
    studies_dir: str = "outputs/studies"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.search_space.decoder_only is None:  # as the task needs
            self.search_space.decoder_only = task_class(self.task.name).decoder_only

    def rules(self) -> tuple[str | None, ...]:
        return (
            self._space_fits_the_task(),
            self._objectives_measured(),
            self._decoding_for_the_objectives(),
            self._hurdles_at_evaluations(),
            self._study_seeds_apart_from_the_judges(),
            self._rate_under_pipemare(),
            self._microbatches_divide_the_batch(),
        )

    def _space_fits_the_task(self) -> str | None:
        wants = task_class(self.task.name).decoder_only
        chosen = self.search_space.decoder_only
        if chosen is not None and chosen != wants:
            return (
                f"search_space.decoder_only={chosen} does not fit task={self.task.name}; "
                f"valid: {wants} (or leave it unset)"
            )
        return None

    def _objectives_measured(self) -> str | None:
        measured = task_metrics(self.task.name)
        for objective in self.study.objectives:
            if objective.startswith("validation_") and objective not in measured:
                return (
                    f"study.objectives has {objective}, which task={self.task.name} does not "
                    f"measure; valid: {', '.join(measured)} and " + ", ".join(RUNTIME_OBJECTIVES)
                )
        return None

    def _decoding_for_the_objectives(self) -> str | None:
        """An objective only decoding measures (`Task.decoded_metrics`) needs pairs decoded:
        at every evaluation for the first (the fitness, reported as the trial trains), at
        the final one for the others."""
        decoded = {f"validation_{m}" for m in task_class(self.task.name).decoded_metrics}
        for key, ranked in (("decode_pairs", 1), ("final_decode_pairs", None)):
            needing = [o for o in self.study.objectives[:ranked] if o in decoded]
            if getattr(self.train, key) == 0 and needing:
                return (
                    f"train.{key}=0 decodes no pair, but study.objectives has {needing[0]}, "
                    "which only decoding measures; valid: a count > 0 or null (all pairs)"
                )
        return None

    def _hurdles_at_evaluations(self) -> str | None:
        """Pruners decide at evaluations: a pruner's rungs (`budgets`) are evaluation steps,
        its top rung the full training length (`nas.study.strategies.pruner_options`)."""
        budgets = list(self.pruner.options.get("budgets", []))
        steps, every = self.train.steps, self.train.eval_every
        bad = [b for b in budgets if b > steps or (b % every and b != steps)]
        if bad:
            return (
                f"pruner.options.budgets={budgets} has {bad}, not an evaluation step; "
                f"valid: multiples of train.eval_every={every} up to train.steps={steps}, "
                "and train.steps"
            )
        return None

    def _study_seeds_apart_from_the_judges(self) -> str | None:
        """The seeds a study measures its leaders on never judge the winner
        (`nas.study.leading`, 3.)."""
        second = self.study.confirm_seed
        if second is None:
            return None
        if second == self.seed:
            return f"study.confirm_seed={second} is the study's seed; valid: another seed"
        judges = self.retrain.seeds
        if second in judges or self.seed in judges:
            return (
                f"study.confirm_seed={second} with seed={self.seed}: the seeds the study "
                f"measures on must not judge the winner (retrain.seeds={list(judges)}); "
                "valid: seeds outside retrain.seeds"
            )
        return None

    def _rate_under_pipemare(self) -> str | None:
        """PipeMare's T1 sets the rates itself: the runtime takes no lr_scheduler there."""
        if self.pipeline.schedule == "pipemare" and (
            self.train.lr_schedule != "constant" or self.train.warmup_steps
        ):
            return (
                f"train.lr_schedule={self.train.lr_schedule!r} with train.warmup_steps="
                f"{self.train.warmup_steps} cannot run under pipeline.schedule=pipemare; "
                "valid: train.lr_schedule=constant and train.warmup_steps=0"
            )
        return None

    def _microbatches_divide_the_batch(self) -> str | None:
        microbatches = self.pipeline.n_microbatches
        if isinstance(microbatches, int) and self.train.batch_size % microbatches:
            return (
                f"train.batch_size={self.train.batch_size} is not a multiple of "
                f"pipeline.n_microbatches={microbatches}"
            )
        return None

    @property
    def storage_url(self) -> str:
        if self.study.storage:
            return self.study.storage
        return f"sqlite:///{self.studies_dir}/{self.study.name}.db"
