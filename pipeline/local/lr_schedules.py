"""Learning-rate schedules that follow their layers: the user's scheduler, one per layer.

`ElasticPipeline(lr_scheduler=lambda optimizer: StepLR(optimizer, 10))` takes a factory as
a user writes it for one optimizer. A stage's optimizer holds one parameter group per
layer, and a migration moves groups from one stage's optimizer to another's; a torch
scheduler keeps per-group lists (`base_lrs`, `_last_lr`) for the optimizer it was built on,
so one scheduler per stage would break the first time a layer arrived or left. Instead each
group gets its own scheduler, built by the factory over a one-group view of the stage's
optimizer (`GroupView`, which shares the group's dict), and every stage optimizer steps its
groups' schedulers right after each of its steps (a step post-hook): once per training step
for the flushed schedules and 2BW. Every scheduler of `torch.optim.lr_scheduler` computes a
group's lr from that group alone, so this equals one scheduler over one optimizer holding
every layer, which is what `ReferenceTrainer(lr_scheduler=...)` runs.

A layer's schedule is its group's settings (lr, initial_lr, ...) and its scheduler's
`state_dict()` (last_epoch, ...). Both travel with the layer:

    migration   `stash` writes each scheduler's state into its group's dict, which a
                migration carries whole (`pipeline.distributed.migration`); `sync` then
                gives every group its schedule: the same scheduler where the group stayed,
                one restored from the stash where it arrived (built by the factory, its
                group's settings put back, its state loaded), a new one for a new layer
    checkpoint  `state(key)` and `load(key, state)` (`pipeline.local.layer_state`)

`ReduceLROnPlateau` (which steps on a metric) and PipeMare (whose updates happen inside the
backward, lr rescaled) are refused where the pipeline is configured.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from pipeline.local.objective import OptimizerFactory

__all__ = ["GroupView", "LayerSchedules", "LrSchedulerFactory", "check_lr_scheduler"]

LrSchedulerFactory = Callable[[torch.optim.Optimizer], LRScheduler]
_STASH = "lr_scheduler_state"  # a group's key while its layer migrates (`stash`)


class GroupView(torch.optim.Optimizer):
    """One parameter group of a stage's optimizer, seen as an optimizer of its own.

    It shares the group's dict, so a scheduler built on it sets that layer's lr in the
    stage's optimizer; it never steps (the stage's optimizer does; `defaults` are that
    optimizer's, which OneCycleLR and CyclicLR read for momentum).
    """

    def __init__(self, group: dict[str, Any], defaults: dict[str, Any]) -> None:
        # not Optimizer.__init__: that would copy the group; a scheduler reads only these
        self.param_groups = [group]
        self.defaults = defaults
        self.state: defaultdict[torch.Tensor, Any] = defaultdict(dict)
        self._opt_called = True  # the stage's optimizer steps before its schedules do

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        raise RuntimeError("a layer's schedule only sets its lr; the stage's optimizer steps")


def check_lr_scheduler(
    factory: LrSchedulerFactory | None, optimizer: OptimizerFactory
) -> LrSchedulerFactory | None:
    """`factory` if it builds an `LRScheduler` on the optimizer it is given (tried once on a
    throw-away parameter); TypeError saying what it returned otherwise."""
    if factory is None:
        return None
    if not callable(factory):
        raise TypeError(
            f"lr_scheduler must be a factory optimizer -> LRScheduler, e.g. "
            f"lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, 10); got {factory!r}"
        )
    probe = optimizer([{"params": [torch.nn.Parameter(torch.zeros(1))], "layer": "probe"}])
    view = GroupView(probe.param_groups[0], probe.defaults)
    scheduler = factory(view)
    if isinstance(scheduler, ReduceLROnPlateau):
        raise TypeError(
            "lr_scheduler: ReduceLROnPlateau steps on a metric; the pipeline steps its "
            "schedules once per training step: use a schedule of the step count "
            "(StepLR, CosineAnnealingLR, OneCycleLR, LambdaLR, ...)"
        )
    if not isinstance(scheduler, LRScheduler) or scheduler.optimizer is not view:
        raise TypeError(
            f"the lr_scheduler factory returned a {type(scheduler).__name__}; it must "
            "return a torch.optim.lr_scheduler.LRScheduler built on the optimizer it is "
            "given, e.g. lambda optimizer: StepLR(optimizer, step_size=10)"
        )
    return factory


class LayerSchedules:
    """Each layer's scheduler on this rank, by layer key (module doc)."""

    def __init__(self, factory: LrSchedulerFactory | None) -> None:
        self.factory = factory
        self._by_key: dict[str, LRScheduler] = {}
        self._hooked: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def reset(self, factory: LrSchedulerFactory | None = None) -> None:
        """Forget every schedule (a new model: its layers start their schedules afresh),
        built from now on by `factory` when given (checked: `check_lr_scheduler`)."""
        self._by_key = {}
        if factory is not None:
            self.factory = factory

    def sync(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Give every group of `optimizers` (this rank's stages') its schedule (module doc);
        drop the schedules of layers no longer here."""
        if self.factory is None:
            return
        live: dict[str, LRScheduler] = {}
        for optimizer in optimizers:
            if optimizer not in self._hooked:
                optimizer.register_step_post_hook(self._after_step)
                self._hooked.add(optimizer)
            for group in optimizer.param_groups:
                key, stash = group["layer"], group.pop(_STASH, None)
                current = self._by_key.get(key)
                if current is not None and current.optimizer.param_groups[0] is group:
                    live[key] = current  # stayed (or a migration was rolled back)
                elif stash is not None:
                    live[key] = self._restored(group, optimizer.defaults, stash)
                else:
                    live[key] = self.factory(GroupView(group, optimizer.defaults))
        self._by_key = live

    def stash(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Write every scheduler's state into its group, for a migration to carry."""
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                scheduler = self._by_key.get(group["layer"])
                if scheduler is not None:
                    group[_STASH] = scheduler.state_dict()

    def state(self, key: str) -> dict[str, Any] | None:
        """Layer `key`'s scheduler state (None: it has no schedule)."""
        scheduler = self._by_key.get(key)
        return None if scheduler is None else scheduler.state_dict()

    def load(self, key: str, state: dict[str, Any]) -> None:
        """Continue layer `key`'s schedule from `state` (its group's settings are the
        caller's to restore); ignored when the layer has no schedule here."""
        scheduler = self._by_key.get(key)
        if scheduler is not None:
            scheduler.load_state_dict(dict(state))

    def last_lrs(self) -> dict[str, float]:
        """{layer key: its current lr} (a view for tests and logs)."""
        return {key: float(s.optimizer.param_groups[0]["lr"]) for key, s in self._by_key.items()}

    def _restored(
        self, group: dict[str, Any], defaults: dict[str, Any], state: dict[str, Any]
    ) -> LRScheduler:
        assert self.factory is not None
        settings = {k: v for k, v in group.items() if k != "params"}
        scheduler = self.factory(GroupView(group, defaults))
        group.update(settings)  # the factory's first step set the lr (and more) anew
        scheduler.load_state_dict(state)
        return scheduler

    def _after_step(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """The stage's optimizer stepped: every layer's schedule steps once."""
        for group in optimizer.param_groups:
            scheduler = self._by_key.get(group.get("layer", ""))
            if scheduler is not None and scheduler.optimizer.param_groups[0] is group:
                scheduler.step()
