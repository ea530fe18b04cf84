"""`pipeline.*`: the pipeline one worker trains a trial on.

The runtime (`pipeline.ElasticPipeline`) takes these: its schedules and planners are read from
its registries when a value is checked, so a schedule the user registers
(`pipeline.register_schedule`) is a valid one. The shape (stages, micro-batches, threads) may
be left "auto", for `nas.study.shape` to choose from the candidates' profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from nas.settings.checks import Settings, declared, setting
from nas.settings.constraints import (
    AUTO,
    POSITIVE,
    Flag,
    KnownKeys,
    Number,
    OrAuto,
    OrNone,
    Registered,
)
from pipeline.local.pipemare import PipeMareConfig
from pipeline.pure.planner import PLANNERS
from pipeline.pure.schedule import SCHEDULES

__all__ = ["PIPEMARE_OPTIONS", "PipelineSettings"]

PIPEMARE_OPTIONS = tuple(PipeMareConfig.__dataclass_fields__)


@dataclass
class PipelineSettings(Settings):
    """One worker's pipeline. `n_stages`, `n_microbatches` and `threads_per_stage` may be
    "auto": chosen with `study.workers` from the candidates' profile (`nas.study.shape`), the
    shape predicted to train the most samples per second of the machine; with
    `per_candidate`, chosen for each candidate from its own profile instead."""

    section: ClassVar[str] = "pipeline"

    n_stages: int | str = setting(AUTO, OrAuto())
    # each candidate on the stage count its own profile needs, from one pool of stage
    # processes (a process per core) shared by the study's workers (`nas.study.pooled`);
    # n_stages, when set, is the most a candidate may take
    per_candidate: bool = setting(False, Flag())
    schedule: str = setting("1f1b", Registered(SCHEDULES))
    n_microbatches: int | str = setting(AUTO, OrAuto())
    memory_budget: int | None = setting(None, OrNone(POSITIVE))  # bytes per stage process
    planner: str = setting("time", Registered(PLANNERS))
    rebalance_every: int | None = setting(None, OrNone(POSITIVE))
    threads_per_stage: int | str | None = setting(AUTO, OrNone(OrAuto()))  # None: cores / stages
    timeout_s: float = setting(300.0, Number(0, open_low=True))
    # schedule=pipemare: PipeMareConfig's fields (lr_reschedule, warmup_updates, correction,
    # correction_decay, update_every); their values are checked by the runtime
    pipemare: dict[str, Any] = field(
        default_factory=dict, metadata=declared(KnownKeys(PIPEMARE_OPTIONS))
    )

    def rules(self) -> tuple[str | None, ...]:
        return (self._pipemare_needs_its_schedule(),)

    def _pipemare_needs_its_schedule(self) -> str | None:
        if self.pipemare and self.schedule != "pipemare":
            return (
                f"pipeline.pipemare is set but pipeline.schedule={self.schedule!r}; "
                "PipeMare's options apply to schedule=pipemare only"
            )
        return None

    @property
    def auto_keys(self) -> tuple[str, ...]:
        """The shape's keys left to the profile ("auto")."""
        keys = ("n_stages", "n_microbatches", "threads_per_stage")
        return tuple(key for key in keys if getattr(self, key) == AUTO)

    @property
    def stage_count(self) -> int:
        """`n_stages` once chosen (`nas.study.shape.resolve`)."""
        return _chosen("n_stages", self.n_stages)

    @property
    def microbatch_count(self) -> int:
        """`n_microbatches` once chosen (`nas.study.shape.resolve`)."""
        return _chosen("n_microbatches", self.n_microbatches)

    @property
    def thread_count(self) -> int | None:
        """`threads_per_stage` once chosen (`nas.study.shape.resolve`); None: cores / stages."""
        if self.threads_per_stage is None:
            return None
        return _chosen("threads_per_stage", self.threads_per_stage)


def _chosen(key: str, value: int | str) -> int:
    if isinstance(value, str):
        raise RuntimeError(f"pipeline.{key} is {value!r}: choose the shape first (nas.study.shape)")
    return value
