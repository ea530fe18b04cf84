"""An elastic pipeline-parallel training runtime for PyTorch.

Give it a list of layers (`LayerSpec`: a stable key and a picklable factory); it splits them
into stages, one per process (or several: interleaved 1F1B, ZB-V), and trains them with a
pipeline schedule so that the result equals single-process training with gradient
accumulation::

    import functools, torch, pipeline
    from pipeline import ElasticOptions, ElasticPipeline, LayerSpec, PlanOptions

    def main(ctx):                      # runs in every stage process
        pipe = ElasticPipeline(specs, optimizer=functools.partial(torch.optim.AdamW, lr=1e-3),
                               loss_fn=torch.nn.functional.cross_entropy,
                               schedule="1f1b", n_microbatches=8,
                               planning=PlanOptions(memory_budget=2 << 30),
                               elastic=ElasticOptions(rebalance_on_drift=0.1))
        for x, y in batches:            # the same batches on every rank
            loss = pipe.train_step(x, y)
        return pipe.stats()

    pipeline.launch(main, n_stages=2)   # local processes, or joins torchrun's group

This package imports only torch and numpy, and those only when a name below is first used
(PEP 562: `pipeline.ElasticPipeline`, `from pipeline import launch`): its torch-free parts
(`pipeline.pure`, `pipeline.distributed.server`) import in milliseconds, so that a program
can start the stage processes' server before it imports torch itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.distributed.elastic import ElasticPipeline
    from pipeline.distributed.events import PipelineEvent
    from pipeline.distributed.inheritance import WeightSnapshot
    from pipeline.distributed.launch import StageContext, launch, lead_process, under_torchrun
    from pipeline.distributed.migration import MigrationRecord
    from pipeline.distributed.options import (
        CheckpointOptions,
        ElasticOptions,
        PipelineOptions,
        PlanOptions,
    )
    from pipeline.distributed.pool import PoolContext, StagePool
    from pipeline.distributed.pool_service import PoolClient, PoolService
    from pipeline.distributed.report import PipelineStats, StageStats
    from pipeline.errors import (
        MigrationError,
        NonFiniteLossError,
        PipelineError,
        StageError,
        StageFailedError,
    )
    from pipeline.local.cost_cache import CostCache
    from pipeline.local.reference import ReferenceTrainer
    from pipeline.local.separable import separable
    from pipeline.local.sequential import partition_from_split_points, specs_from_sequential
    from pipeline.local.spec import LayerSpec
    from pipeline.pure.checkpoint_format import CheckpointError
    from pipeline.pure.costs import LayerCost
    from pipeline.pure.planner import InfeasibleBudgetError, Plan, Planner
    from pipeline.pure.schedule import (
        SCHEDULES,
        Action,
        Op,
        ScheduleError,
        ScheduleSpec,
        get_schedule,
        register_schedule,
    )

__all__ = [
    "SCHEDULES",
    "Action",
    "CheckpointError",
    "CheckpointOptions",
    "CostCache",
    "ElasticOptions",
    "ElasticPipeline",
    "InfeasibleBudgetError",
    "LayerCost",
    "LayerSpec",
    "MigrationError",
    "MigrationRecord",
    "NonFiniteLossError",
    "Op",
    "PipelineError",
    "PipelineEvent",
    "PipelineOptions",
    "PipelineStats",
    "Plan",
    "PlanOptions",
    "Planner",
    "PoolClient",
    "PoolContext",
    "PoolService",
    "ReferenceTrainer",
    "ScheduleError",
    "ScheduleSpec",
    "StageContext",
    "StageError",
    "StageFailedError",
    "StagePool",
    "StageStats",
    "WeightSnapshot",
    "get_schedule",
    "launch",
    "lead_process",
    "partition_from_split_points",
    "register_schedule",
    "separable",
    "specs_from_sequential",
    "under_torchrun",
]

_HOMES = {  # the module each name lives in
    "pipeline.distributed.elastic": ("ElasticPipeline",),
    "pipeline.distributed.events": ("PipelineEvent",),
    "pipeline.distributed.inheritance": ("WeightSnapshot",),
    "pipeline.distributed.launch": (
        "StageContext",
        "launch",
        "lead_process",
        "under_torchrun",
    ),
    "pipeline.distributed.migration": ("MigrationRecord",),
    "pipeline.distributed.options": (
        "CheckpointOptions",
        "ElasticOptions",
        "PipelineOptions",
        "PlanOptions",
    ),
    "pipeline.distributed.pool": (
        "PoolContext",
        "StagePool",
    ),
    "pipeline.distributed.pool_service": (
        "PoolClient",
        "PoolService",
    ),
    "pipeline.distributed.report": (
        "PipelineStats",
        "StageStats",
    ),
    "pipeline.errors": (
        "MigrationError",
        "NonFiniteLossError",
        "PipelineError",
        "StageError",
        "StageFailedError",
    ),
    "pipeline.local.cost_cache": ("CostCache",),
    "pipeline.local.reference": ("ReferenceTrainer",),
    "pipeline.local.separable": ("separable",),
    "pipeline.local.sequential": (
        "partition_from_split_points",
        "specs_from_sequential",
    ),
    "pipeline.local.spec": ("LayerSpec",),
    "pipeline.pure.checkpoint_format": ("CheckpointError",),
    "pipeline.pure.costs": ("LayerCost",),
    "pipeline.pure.planner": (
        "InfeasibleBudgetError",
        "Plan",
        "Planner",
    ),
    "pipeline.pure.schedule": (
        "SCHEDULES",
        "Action",
        "Op",
        "ScheduleError",
        "ScheduleSpec",
        "get_schedule",
        "register_schedule",
    ),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """`name` imported from its module on first use, then kept here."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
