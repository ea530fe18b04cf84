"""The learning rate of a training run, step by step: warm-up, then constant or cosine decay.

A short trial ranks architectures only if every candidate gets a fair start: a linear
warm-up keeps the first updates of a freshly initialised model small, and a cosine decay to
`min_lr_ratio` x lr lets each run finish converged for its budget (the trial's, or the
retrain's). The schedule is a pure function of the step, so every rank computes the same.

The runtime steps it: `LrSchedule` is an `lr_scheduler=` factory for `ElasticPipeline`,
building torch's `LambdaLR` over the factor `learning_rate(step, base=1)`, so each layer's
rate is `base` (the optimizer's lr) times it; the runtime steps every layer's scheduler once
per training step (update `step` runs at `learning_rate(step)`, step 0 included) and keeps
it through migrations and checkpoints (`pipeline.local.lr_schedules`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch.optim.lr_scheduler import LambdaLR

from pipeline.pure.checks import is_int

__all__ = ["SCHEDULES", "LrSchedule", "learning_rate"]

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
    the last step ("cosine"). Always `base` times the rate at base 1, to the last bit."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not valid; valid: {', '.join(SCHEDULES)}")
    if step < warmup:
        return base * ((step + 1) / warmup)
    if schedule == "constant" or total - warmup <= 1:
        return base
    progress = min(1.0, (step - warmup) / (total - warmup - 1))
    return base * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass(frozen=True)
class LrSchedule:
    """`learning_rate` over a run of `total` steps: the `lr_scheduler=` factory (a plain,
    picklable object: it may cross to the stage processes) and, `optimizer()`, the optimizer
    factory whose lr it scales."""

    base: float
    total: int
    warmup: int = 0
    schedule: str = "constant"
    min_ratio: float = 0.0
    weight_decay: float = 0.01

    def __post_init__(self) -> None:
        if not self.base > 0:
            raise ValueError(f"base={self.base!r} is not valid; the rate must be > 0")
        if not is_int(self.total) or self.total < 1:
            raise ValueError(f"total={self.total!r} is not valid; use a step count >= 1")
        self.factor(0)  # the schedule's name

    def factor(self, step: int) -> float:
        """The rate of update `step` at base 1 (LambdaLR's multiplier)."""
        return learning_rate(
            step,
            base=1.0,
            total=self.total,
            warmup=self.warmup,
            schedule=self.schedule,
            min_ratio=self.min_ratio,
        )

    def rate(self, step: int) -> float:
        """The rate update `step` runs at: `learning_rate(step, base=base, ...)`, exactly."""
        return self.base * self.factor(step)

    def optimizer(self) -> functools.partial[torch.optim.AdamW]:
        """The optimizer factory the schedule scales: AdamW at lr=`base`."""
        return functools.partial(torch.optim.AdamW, lr=self.base, weight_decay=self.weight_decay)

    def __call__(self, optimizer: torch.optim.Optimizer) -> LambdaLR:
        """The `lr_scheduler=` factory: `base` x `factor(step)` on `optimizer`'s groups."""
        return LambdaLR(optimizer, self.factor)
