"""Parts that fail on purpose, for the fault tests: a tracker and a sampler with a bug, a
task that kills its stage process, and one that waits for a gate before it trains.

They are named by import path in a study's settings (`tracker.name=tests.nas.harness.
faulty:FailingTracker`), as a user names their own parts, so the stage processes import them
the same way. Each fails at one chosen point and works everywhere else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.distributions import BaseDistribution
from optuna.samplers import RandomSampler

from nas.tasks import CharLM
from nas.tracking import JsonlTracker, Metrics

TRACKER = "tests.nas.harness.faulty:FailingTracker"
SAMPLER = "tests.nas.harness.faulty:FailingSampler"
DYING_TASK = "tests.nas.harness.faulty:DyingCharLM"
GATED_TASK = "tests.nas.harness.faulty:GatedCharLM"


class TrackerBug(RuntimeError):
    """What FailingTracker raises."""


class SamplerBug(RuntimeError):
    """What FailingSampler raises."""


class FailingTracker(JsonlTracker):
    """A JSONL tracker whose `log_step` raises at `step` of trial `trial`, and whose
    `end_study` raises if `fail_end_study`."""

    def __init__(
        self, directory: str, *, trial: int = -1, step: int = 1, fail_end_study: bool = False
    ) -> None:
        super().__init__(directory)
        self.fail_trial, self.fail_step, self.fail_end_study = trial, step, fail_end_study

    def _on_step(self, step: int, metrics: Metrics) -> None:
        if self._trial == self.fail_trial and step == self.fail_step:
            raise TrackerBug(f"log_step failed at step {step} of trial {self._trial}")
        super()._on_step(step, metrics)

    def _on_end_study(self, trials_table: Any, pareto_front: Any, summary: Any) -> None:
        super()._on_end_study(trials_table, pareto_front, summary)
        if self.fail_end_study:
            raise TrackerBug("end_study failed")


class FailingSampler(RandomSampler):
    """Random search with a bug at trial `trial`: raises while a parameter is sampled
    (`where="sample"`, after the trial exists) or in `before_trial` (`where="ask"`)."""

    def __init__(self, seed: int | None = None, *, trial: int = 2, where: str = "sample") -> None:
        super().__init__(seed=seed)
        self.fail_trial, self.where = trial, where

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if self.where == "ask" and trial.number == self.fail_trial:
            raise SamplerBug(f"before_trial failed for trial {trial.number}")
        super().before_trial(study, trial)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: optuna.trial.FrozenTrial,
        name: str,
        distribution: BaseDistribution,
    ) -> Any:
        if self.where == "sample" and trial.number == self.fail_trial:
            raise SamplerBug(f"sample_independent failed for {name} of trial {trial.number}")
        return super().sample_independent(study, trial, name, distribution)


class DyingCharLM(CharLM):
    """The character language model whose rank 0 process dies (`os._exit`) when a trial
    starts training, the first `deaths` times of all (counted by files in `marker_dir`):
    every trial until then kills its worker, as an architecture too big for the machine
    would."""

    def __init__(self, *, marker_dir: str, deaths: int = 3, seq_len: int = 64) -> None:
        super().__init__(seq_len=seq_len)
        self.marker_dir, self.deaths = Path(marker_dir), deaths

    def batches(
        self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        rank0 = torch.distributed.is_initialized() and torch.distributed.get_rank() == 0
        died = len(list(self.marker_dir.glob("death-*")))
        if split == "train" and epoch == 0 and rank0 and died < self.deaths:
            (self.marker_dir / f"death-{died}").touch()
            os._exit(3)
        return super().batches(split, batch_size, seed=seed, epoch=epoch)


class GatedCharLM(CharLM):
    """The character language model whose trials start training only once the file `gate`
    exists (at most `wait_s` seconds): a test opens it when every worker has asked a trial,
    so that no worker can take every trial before the others ask one, however loaded the
    machine."""

    def __init__(self, *, gate: str, wait_s: float = 240.0, seq_len: int = 64) -> None:
        super().__init__(seq_len=seq_len)
        self.gate, self.wait_s = Path(gate), wait_s

    def batches(
        self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        deadline = time.monotonic() + self.wait_s
        while split == "train" and not self.gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self.gate} never opened")
            time.sleep(0.05)
        return super().batches(split, batch_size, seed=seed, epoch=epoch)


def summaries(records: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """trial number -> its end state, from a JSONL tracker's records."""
    return {r["trial"]: r["state"] for r in records if r["kind"] == "trial_end"}
