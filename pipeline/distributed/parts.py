"""What each of the facade's helper modules needs of it: one narrow interface per helper.

`ElasticPipeline` composes parts that each own their state, and its longer methods run in
helper modules. Each helper is typed against the interface below that lists only what it
reads or calls, not against the facade's class, so no helper imports the facade (the module
graph has no circle) and none may assign the facade's attributes: the facade alone replaces
its model, recipe, link or stream in flight.

    helper                 interface             what it adds to the core
    ─────────────────────  ────────────────────  ──────────────────────────────────────────
    (shared)               PipelineCore          model, runner, options, plan_age, event_log
    steps (train_step)     SteppedPipeline       drain, plan_from
    stream (2BW, PipeMare) StreamedPipeline      + comm, plan_for, hold_stream (its segment)
    build (plan, build)    BuiltPipeline         comm, schedule, recipe, planner, device
    elasticity             ElasticPipelineParts  + placement, triggers, link, rebalance...
    tryout                 TriedPipeline         + comm, n_stages, switch_plan
    tryout at a correction ChallengedPipeline    TriedPipeline + planner
    report (stats)         ReportedPipeline      (alone) model, comm, schedule, generation
    checkpoint             CheckpointedPipeline  (alone) + recipe, pipemare, optimizers
    weights                (explicit arguments: comm, model, seed, event log)

The interfaces are composed of four small roles rather than repeating their members:
`_Holding` (model, options), `_Talking` (comm), `_Scheduled` (schedule, auto_schedule,
n_stages) and `_Draining` (drain).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from pipeline.distributed.comm import Comm
from pipeline.distributed.events import EventLog
from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.migration import MigrationRecord
from pipeline.distributed.options import PipelineOptions
from pipeline.distributed.runner import StepRunner
from pipeline.distributed.triggers import PlanAge, ReplanTriggers
from pipeline.local.pipemare import PipeMareConfig
from pipeline.local.recipe import TrainingRecipe
from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.placement import Placement
from pipeline.pure.planner import Plan, Planner
from pipeline.pure.schedule import ScheduleLike, ScheduleSpec

__all__ = [
    "ActiveStream",
    "BuiltPipeline",
    "ChallengedPipeline",
    "CheckpointedPipeline",
    "ElasticPipelineParts",
    "PipelineCore",
    "ReportedPipeline",
    "SteppedPipeline",
    "StreamedPipeline",
    "TriedPipeline",
]


class ActiveStream(Protocol):
    """A `train` stream in flight (`pipeline.distributed.stream.Segment`)."""

    def drain(self) -> None: ...

    def held(self) -> dict[str, int]: ...


class _Holding(Protocol):
    """The model this process holds and the options it was built with."""

    @property
    def model(self) -> ModelHolder: ...
    @property
    def options(self) -> PipelineOptions: ...


class _Talking(Protocol):
    """The communicator between the stage processes."""

    @property
    def comm(self) -> Comm: ...


class _Scheduled(Protocol):
    """The schedule in use, whether it was chosen automatically, and its stage count."""

    @property
    def schedule(self) -> ScheduleSpec: ...
    @property
    def auto_schedule(self) -> bool: ...
    @property
    def n_stages(self) -> int: ...


class _Draining(Protocol):
    """Finishing the stream in flight, if any, before anything else runs."""

    def drain(self) -> None: ...


class PipelineCore(_Holding, Protocol):
    """What every step and every build touches: the model, its runner, options and log."""

    @property
    def runner(self) -> StepRunner: ...
    @property
    def plan_age(self) -> PlanAge: ...
    @property
    def event_log(self) -> EventLog: ...


class SteppedPipeline(PipelineCore, _Draining, Protocol):
    """What a flushed `train_step` and `forward` use (`pipeline.distributed.steps`)."""

    def plan_from(self, example: Any) -> None:
        """Plan and build from one micro-batch's input, unless built already."""


class StreamedPipeline(SteppedPipeline, _Talking, Protocol):
    """What a stream schedule's `train` uses (`pipeline.distributed.stream`)."""

    @property
    def active_stream(self) -> ActiveStream | None: ...

    def plan_for(self, x: Any) -> None:
        """Plan and build from a batch input, unless built already."""

    def hold_stream(self, segment: ActiveStream | None) -> None:
        """Make `segment` the stream in flight (None: none is)."""


class BuiltPipeline(PipelineCore, _Talking, _Scheduled, Protocol):
    """What planning and building a model use (`pipeline.distributed.build`)."""

    @property
    def device(self) -> torch.device: ...
    @property
    def recipe(self) -> TrainingRecipe: ...
    @property
    def planner(self) -> Planner: ...

    def adopt_schedule(self, schedule: ScheduleLike) -> None: ...


class TriedPipeline(PipelineCore, _Talking, _Scheduled, Protocol):
    """What trying several plans on the first steps uses (`pipeline.distributed.tryout`)."""

    def switch_plan(self, plan: Plan) -> None:
        """Run the model under `plan` from the next step, exactly where it is."""


class ChallengedPipeline(TriedPipeline, Protocol):
    """What trying other schedules' plans at a correction uses (`pipeline.distributed.tryout`)."""

    @property
    def planner(self) -> Planner: ...


class ElasticPipelineParts(BuiltPipeline, _Draining, TriedPipeline, Protocol):
    """What repartition, rebalance and reconfigure use (`pipeline.distributed.elasticity`)."""

    @property
    def placement(self) -> Placement: ...
    @property
    def triggers(self) -> ReplanTriggers: ...
    @property
    def link(self) -> LinkCost: ...

    def layer_costs(self) -> tuple[list[LayerCost], list[str]]: ...

    def rebalance(self, remaining_steps: int | None = None) -> MigrationRecord | None: ...

    def repartition(
        self, sizes: Any, actions: Any = None, handoff: Any = None
    ) -> MigrationRecord: ...


class ReportedPipeline(_Holding, _Talking, _Scheduled, Protocol):
    """What `stats` reads (`pipeline.distributed.report`)."""

    @property
    def placement(self) -> Placement: ...
    @property
    def generation(self) -> int: ...


class CheckpointedPipeline(_Holding, _Talking, _Scheduled, _Draining, Protocol):
    """What saving and resuming read of the facade."""

    @property
    def recipe(self) -> TrainingRecipe: ...
    @property
    def pipemare(self) -> PipeMareConfig | None: ...
    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]: ...
