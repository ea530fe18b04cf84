"""What the facade's helpers may use of it: `ElasticPipeline`'s parts, as one typed interface.

`ElasticPipeline` composes parts that each own their state, and its longer methods run in
helper modules (`build`, `steps`, `stream`, `elasticity`, `weights`, `report`). Those
helpers are typed against `PipelineParts`, not against the facade's class, so no helper
imports the facade (the module graph has no circle) and what they can touch is listed here,
in one screen. The package docstring (`pipeline.distributed`) draws who owns what.
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
from pipeline.local.profiler import CostCache
from pipeline.local.recipe import TrainingRecipe
from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.placement import Placement
from pipeline.pure.planner import Planner
from pipeline.pure.schedule import ScheduleLike, ScheduleSpec

__all__ = ["ActiveStream", "PipelineParts"]


class ActiveStream(Protocol):
    """A `train` stream in flight (`pipeline.distributed.stream.Segment`)."""

    def drain(self) -> None: ...

    def held(self) -> dict[str, int]: ...


class PipelineParts(Protocol):
    """The facade as its helper modules see it (the attributes are `ElasticPipeline`'s)."""

    comm: Comm
    rank: int
    n_stages: int  # stages in all: stages_per_rank * ranks (`placement`)
    placement: Placement
    schedule: ScheduleSpec
    options: PipelineOptions
    planner: Planner
    cost_cache: CostCache
    device: torch.device
    runner: StepRunner
    recipe: TrainingRecipe
    model: ModelHolder
    event_log: EventLog
    plan_age: PlanAge
    triggers: ReplanTriggers
    generation: int
    auto_schedule: bool  # schedule="auto": each model's first step chooses one
    link: LinkCost  # the link as the last migration measured it
    active_stream: ActiveStream | None

    @property
    def n_microbatches(self) -> int: ...

    @property
    def memory_budget(self) -> int | None: ...

    @property
    def profile(self) -> str: ...

    @property
    def pipemare(self) -> PipeMareConfig | None: ...

    def drain(self) -> None: ...

    def adopt_schedule(self, schedule: ScheduleLike) -> None: ...

    def plan_for(self, x: Any) -> None: ...

    def repartition(
        self, sizes: Any, actions: Any = None, handoff: Any = None
    ) -> MigrationRecord: ...

    def rebalance(self, remaining_steps: int | None = None) -> MigrationRecord | None: ...

    def layer_costs(self) -> tuple[list[LayerCost], list[str]]: ...
