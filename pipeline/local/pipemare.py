"""PipeMare's two corrections for asynchronous pipelines, as a stage applies them locally.

Asynchronous 1F1B (no flush, one weight copy, an update after every `update_every`
micro-batches) runs a micro-batch's backward on weights that moved since its forward: on
stage s of S, `delay(S, s, N)` updates happen in between (the last stage sees none). PipeMare
(Yang et al., arXiv 1910.05124, section 3) keeps such training stable with two techniques,
each switchable (`PipeMareConfig`):

T1, learning-rate rescheduling: stage s starts with its step size divided by a power of its
    delay that falls to zero over `warmup_updates` updates,

        lr(s, k) = lr(k) * tau_s ** -(1 - min(k / K, 1)),      tau_s = max(delay, 1),

    so the most delayed stages take the smallest steps early, and every stage runs the base
    schedule after K updates.

T2, discrepancy correction: the backward uses weights extrapolated back toward those its
    forward used, from an exponential moving average `delta` of the recent per-update
    weight changes:

        delta <- gamma * delta + (1 - gamma) * (w_new - w_old)      after each update
        u      = w - lag * delta                                      for the backward

    with lag the number of updates between the forward and the backward of a micro-batch
    (the runtime counts them per micro-batch; the stage's `delay` is the worst case) and
    gamma = decay ** (1 / delay) (so the average spans about one delay).

What was checked against what. The paper's section 3 could not be read from here: its arXiv
and MLSys pages, mirrors and summaries give the abstract and the two techniques' names
(learning-rate rescheduling, discrepancy correction) but not the formulas, and no public
implementation was found. So the formulas are docs/algorithms.md's restatement of section 3,
which this module implements exactly (`tests/pipeline/local/test_pipemare.py` pins each).
Checked by measurement instead, on the character LM of `benchmarks/pipemare.py` (8 stages):
the lags are those 1F1B produces (the reference on one stage equals synchronous training
bit for bit, and the pipeline equals the reference); on the real trajectory T2's weights
lie about 5x closer to the forward's than the current ones (median distance ratio 0.22 at
lag 7; `test_pipemare_convergence.py`); with a base rate that decays, T1 closes most of the
asynchronous gap. With a constant rate T1 cannot: after K updates a stage runs the full
rate at the full delay, i.e. plain asynchronous training, so at a rate where that is
unstable T1 postpones the blow-up instead of preventing it (why T1 alone went NaN there;
not a bug). Open: the paper's delay convention (if its tau counts the update a gradient
produces, tau = delay + 1 and T1 would also slow the delay-1 stage: measured, no difference
beyond seed noise) and how it picks K.

Both pieces are pure tensor arithmetic on a stage's parameters: the executor (which decides
when forwards, backwards and updates run) calls `rescaled_lr` before each update, `observe`
after it, and `backward_weights` to load the corrected weights for a backward.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.pure.checks import is_int

__all__ = ["DiscrepancyCorrection", "PipeMareConfig", "check_pipemare", "delay", "rescaled_lr"]


@dataclass(frozen=True)
class PipeMareConfig:
    """PipeMare's switches and their parameters (validated here, at the boundary)."""

    lr_reschedule: bool = True  # T1
    warmup_updates: int = 100  # K: updates until every stage runs the base learning rate
    correction: bool = True  # T2
    correction_decay: float = 0.1  # gamma = decay ** (1 / lag)
    update_every: int = 1  # micro-batches per weight update

    def __post_init__(self) -> None:
        for name in ("warmup_updates", "update_every"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValueError(f"{name}={value!r} is not valid; it must be a positive integer")
        if not 0.0 < self.correction_decay < 1.0:
            raise ValueError(
                f"correction_decay={self.correction_decay!r} is not valid; it must be in (0, 1)"
            )


def check_pipemare(
    schedule: str | None, config: PipeMareConfig | dict[str, Any] | None, n_microbatches: int
) -> PipeMareConfig | None:
    """The PipeMare configuration of a pipeline (None unless schedule="pipemare"), checked:
    a dict is taken as `PipeMareConfig`'s fields; `update_every` must divide the micro-batches
    of a step, so that every update falls inside one step."""
    if schedule != "pipemare":
        if config is not None:
            raise ValueError(f"pipemare= configures schedule='pipemare', not {schedule!r}")
        return None
    if config is None:
        config = PipeMareConfig()
    elif isinstance(config, dict):
        config = PipeMareConfig(**config)
    elif not isinstance(config, PipeMareConfig):
        raise TypeError(f"pipemare must be a PipeMareConfig or a dict, got {type(config).__name__}")
    if n_microbatches % config.update_every:
        raise ValueError(
            f"PipeMare's update_every={config.update_every} must divide n_microbatches="
            f"{n_microbatches}: an update would straddle two steps"
        )
    return config


def delay(n_stages: int, stage: int, update_every: int = 1) -> int:
    """Updates between a micro-batch's forward and its backward on `stage` under
    asynchronous 1F1B: the S-1-s backwards the stage runs in between, one update per
    `update_every` of them (rounded up: the worst micro-batch)."""
    if not 0 <= stage < n_stages:
        raise ValueError(f"stage={stage} is not valid for {n_stages} stages")
    return math.ceil((n_stages - 1 - stage) / update_every)


def rescaled_lr(base_lr: float, update: int, stage_delay: int, warmup_updates: int) -> float:
    """T1: the step size of a stage with `stage_delay` at its `update`-th update (from 0)."""
    progress = min(update / warmup_updates, 1.0)
    return base_lr * max(stage_delay, 1) ** -(1.0 - progress)


class DiscrepancyCorrection:
    """T2 for one stage: the moving average of weight changes, and the corrected weights."""

    def __init__(self, params: Iterable[torch.Tensor], lag: int, decay: float) -> None:
        self.params = list(params)
        self.lag = lag
        self.gamma = decay ** (1.0 / lag) if lag > 0 else 0.0
        self.delta = [torch.zeros_like(p) for p in self.params]
        self._before: list[torch.Tensor] | None = None

    def before_update(self) -> None:
        """Remember the weights the next update starts from."""
        self._before = [p.detach().clone() for p in self.params]

    def observe(self) -> None:
        """After an update: fold its weight change into the moving average."""
        if self._before is None:
            raise RuntimeError("observe() needs before_update() before the update")
        with torch.no_grad():
            for d, p, old in zip(self.delta, self.params, self._before, strict=True):
                d.mul_(self.gamma).add_(p.detach() - old, alpha=1.0 - self.gamma)
        self._before = None

    def backward_weights(self, lag: int | None = None) -> list[torch.Tensor]:
        """u = w - lag * delta: the weights a backward should use (new tensors); `lag`
        (default: the stage's) is the number of updates since the micro-batch's forward."""
        lag = self.lag if lag is None else lag
        return [p.detach() - lag * d for p, d in zip(self.params, self.delta, strict=True)]
