"""The facade's read-only views of the model in force: what a user inspects between steps.

`ElasticPipeline` inherits them; each reads the facade's `model` (`ModelHolder`) and
changes nothing, so the facade itself keeps to composing its parts and its methods.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
from torch import nn

from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.migration import MigrationRecord
from pipeline.local.history import StepHistory
from pipeline.local.layer import StageLayer
from pipeline.local.spec import LayerSpec
from pipeline.pure.partition import bounds
from pipeline.pure.planner import Plan

__all__ = ["ModelViews"]


class ModelViews:
    """Read-only properties over `self.model` (mixed into `ElasticPipeline`)."""

    model: ModelHolder

    @property
    def specs(self) -> list[LayerSpec]:
        """The model's layers in forward order."""
        return self.model.specs

    @property
    def plan(self) -> Plan | None:
        """The plan in force (None before one is made, or after explicit sizes)."""
        return self.model.plan

    @property
    def sizes(self) -> list[int]:
        """Layers per stage ([] until planned)."""
        return self.model.sizes

    @property
    def handoff(self) -> tuple[int, ...]:
        """Bi-Partition's cut in force (() before a build, or without one)."""
        return self.model.handoff

    @property
    def step(self) -> int:
        """Training steps applied to this model."""
        return self.model.step

    @property
    def version(self) -> int:
        """The plan version: +1 per committed migration."""
        return self.model.version

    @property
    def migrations(self) -> list[MigrationRecord]:
        """This model's committed migrations, oldest first."""
        return self.model.migrations

    @property
    def partition_history(self) -> list[tuple[int, list[int]]]:
        """(step, sizes) of each partition this model has had."""
        return self.model.partition_history

    @property
    def history(self) -> StepHistory:
        """What the steps measured, in bounded memory."""
        return self.model.history

    @property
    def layer_keys(self) -> tuple[str, ...]:
        """Keys of the layers this rank's stages hold now, in order (() before the first plan)."""
        return tuple(layer.key for layer in self._held_layers())

    @property
    def memory_actions(self) -> tuple[str, ...]:
        """This rank's per-layer memory actions ("keep", "recompute", "swap")."""
        return tuple(layer.action for layer in self._held_layers())

    @property
    def layers(self) -> Mapping[str, nn.Module]:
        """This rank's modules by layer key (a read-only view; empty before the first plan)."""
        return MappingProxyType({layer.key: layer.module for layer in self._held_layers()})

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """This stage's optimizer (one parameter group per layer, tagged "layer"); None before
        the first plan, and with several stages per rank (each has its own)."""
        stages = self.model.stages
        return stages[0].optimizer if len(stages) == 1 else None

    @property
    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """The optimizers of this rank's stages, one per stage (() before the first plan)."""
        return tuple(s.optimizer for s in self.model.stages if s.optimizer is not None)

    def stage_layer_keys(self) -> list[tuple[str, ...]]:
        """The keys every stage holds, from the current sizes (no message; [] before a plan)."""
        return [tuple(s.key for s in self.specs[a:b]) for a, b in bounds(self.sizes)]

    def _held_layers(self) -> list[StageLayer]:
        return [layer for stage in self.model.stages for layer in stage.layers]
