"""The learning rate of a training run, step by step: warm-up, then constant or cosine decay.

A short trial ranks architectures only if every candidate gets a fair start: a linear
warm-up keeps the first updates of a freshly initialised model small, and a cosine decay to
`min_lr_ratio` x lr lets each run finish converged for its budget (the trial's, or the
retrain's). The schedule is a pure function of the step, so every rank computes the same.

The runtime builds each stage's optimizer (and rebuilds it after a reconfigure or
migration) with the factory it was given; `ScheduledOptimizer` is that factory, building
AdamW at the current learning rate, and `set_step` moves every parameter group of the
stage's live optimizer to the step's rate before the step runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["SCHEDULES", "ScheduledOptimizer", "learning_rate"]

SCHEDULES = ("constant", "cosine")


def learning_rate(
    step: int,
    *,
    base: float,
    total: int,
    warmup: int = 0,
    schedule: str = "constant",
    min_ratio: float = 0.0,
) -> float:
    """The rate of update `step` (0-based) of `total`: `base * (step + 1) / warmup` during
    the warm-up, then `base` ("constant") or a cosine from `base` to `min_ratio * base` at
    the last step ("cosine")."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not valid; valid: {', '.join(SCHEDULES)}")
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant" or total - warmup <= 1:
        return base
    progress = min(1.0, (step - warmup) / (total - warmup - 1))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class ScheduledOptimizer:
    """An optimizer factory for `ElasticPipeline` whose rate follows a schedule.

    `set_step(step, optimizers)` before each step: later optimizers are built at that rate,
    and the live ones (this rank's stages', `pipe.optimizers`; none before the first plan)
    move to it.
    """

    def __init__(
        self,
        base: float,
        total: int,
        *,
        warmup: int = 0,
        schedule: str = "constant",
        min_ratio: float = 0.0,
        weight_decay: float = 0.01,
    ) -> None:
        self.base, self.total, self.warmup = base, total, warmup
        self.schedule, self.min_ratio, self.weight_decay = schedule, min_ratio, weight_decay
        self.current = self.rate(0)

    def rate(self, step: int) -> float:
        return learning_rate(
            step,
            base=self.base,
            total=self.total,
            warmup=self.warmup,
            schedule=self.schedule,
            min_ratio=self.min_ratio,
        )

    def __call__(self, groups: Sequence[dict[str, Any]]) -> torch.optim.Optimizer:
        return torch.optim.AdamW(groups, lr=self.current, weight_decay=self.weight_decay)

    def set_step(self, step: int, optimizers: Sequence[torch.optim.Optimizer] = ()) -> None:
        self.current = self.rate(step)
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = self.current
