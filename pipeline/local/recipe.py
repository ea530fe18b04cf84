"""`TrainingRecipe`: how a pipeline trains each stage it builds, as one typed value.

Every stage the facade builds (the first plan, a `reconfigure`, a re-plan's rebuild) takes
the same three things, and the planner one number derived from them. Keeping them in one
frozen value lets the parts that build stages (`pipeline.distributed.build`,
`pipeline.distributed.weights`) read them, and `reconfigure` replace them as one
(`changed`), without reaching into the facade.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.local.objective import LossFn, OptimizerFactory
from pipeline.local.profiler import optimizer_state_ratio

__all__ = ["TrainingRecipe"]


@dataclass(frozen=True)
class TrainingRecipe:
    seed: int  # layer initialisation and dropout (`pipeline.local.determinism`)
    optimizer: OptimizerFactory  # called with each stage's parameters
    loss_fn: LossFn  # the last stage's loss
    optimizer_state_ratio: float  # optimizer state bytes per parameter byte (the planner's)

    @classmethod
    def of(cls, seed: int, optimizer: OptimizerFactory, loss_fn: LossFn) -> TrainingRecipe:
        """The recipe, with the optimizer's state ratio measured (which checks the factory)."""
        return cls(seed, optimizer, loss_fn, optimizer_state_ratio(optimizer))

    def changed(
        self,
        optimizer: OptimizerFactory | None = None,
        loss_fn: LossFn | None = None,
        seed: int | None = None,
    ) -> TrainingRecipe:
        """This recipe with a new optimizer, loss and/or seed (None: keep the current one)."""
        loss_fn = self.loss_fn if loss_fn is None else loss_fn
        seed = self.seed if seed is None else seed
        if optimizer is None:
            return replace(self, loss_fn=loss_fn, seed=seed)
        return TrainingRecipe.of(seed, optimizer, loss_fn)  # a new state ratio
