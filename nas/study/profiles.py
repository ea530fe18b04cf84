"""The layer costs of candidate models, profiled on demand, each (threads, micro-batch) once.

Choosing a shape (`nas.study.shape`) or a candidate's stages asks a model's layer costs at
several thread counts and micro-batch sizes; profiling is the slow part (each distinct
layer timed in a sandbox, `pipeline.local.profiler.sandbox`), so a `CandidateProfile`
profiles a size only when first asked and keeps what it measured, and the machine's cost
cache keeps every layer it timed for the next candidate that has it. Where a memory budget
rules a size out, its layers' bytes alone decide it (`sizes_at`: one counted forward each,
nothing timed): a small study's candidates fit no pipeline at the whole batch, whose
timing was the dearest of their profile (0.8-1.0 s of 2.0-2.2 s, measured on 2 cores).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from nas.settings import NasSettings
from nas.study import training
from nas.tasks import get_task
from pipeline import CostCache
from pipeline.local.microbatch import split_microbatches
from pipeline.local.profiler import (
    LayerShape,
    on_threads,
    optimizer_state_ratio,
    sandbox,
    sized,
    trace_shapes,
)
from pipeline.pure.costs import LayerCost
from search_spaces.architecture import Architecture

__all__ = ["CandidateProfile", "profile_candidates"]


@dataclass
class CandidateProfile:
    """One model's layer costs at (threads, micro-batch size), profiled on demand, once."""

    specs: list[Any]
    batch: Any
    opt_ratio: float
    costs: CostCache
    known: dict[tuple[int, int], list[LayerCost]] = dataclasses.field(default_factory=dict)
    traced: dict[int, list[LayerShape]] = dataclasses.field(default_factory=dict)
    counted: dict[int, list[LayerCost]] = dataclasses.field(default_factory=dict)

    def costs_at(self, threads: int, microbatch: int) -> list[LayerCost]:
        if (threads, microbatch) not in self.known:
            self.known[threads, microbatch] = self._profile(threads, microbatch)
        return self.known[threads, microbatch]

    def sizes_at(self, microbatch: int) -> list[LayerCost]:
        """The layers' bytes at `microbatch` as a real run saves them, their seconds where
        the cost cache holds them, else 0 (`pipeline.local.profiler.sized`)."""
        if microbatch not in self.counted:
            shapes = on_threads(self._traced(microbatch), 1)  # the bytes: any thread count
            device = torch.device("cpu")
            self.counted[microbatch] = sized(self.specs, shapes, device, self.opt_ratio, self.costs)
        return self.counted[microbatch]

    def _traced(self, microbatch: int) -> list[LayerShape]:
        """The layers' shapes at `microbatch`, traced once (they do not depend on threads)."""
        if microbatch not in self.traced:
            first = self.batch[0] if isinstance(self.batch, tuple | list) else self.batch
            n = int(first.shape[0]) // microbatch
            example = split_microbatches(self.batch, n, "the example batch")[0]
            self.traced[microbatch] = trace_shapes(self.specs, example, count_flops=False)
        return self.traced[microbatch]

    def _profile(self, threads: int, microbatch: int) -> list[LayerCost]:
        """Time each distinct layer not in the cache on `threads` threads (`sandbox`); its
        shapes signed for the threads (the cache's keys name them)."""
        shapes = on_threads(self._traced(microbatch), threads)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return sandbox(self.specs, shapes, torch.device("cpu"), self.opt_ratio, self.costs)
        finally:
            torch.set_num_threads(before)


def profile_candidates(
    settings: NasSettings,
    architectures: Sequence[Architecture],
    costs: CostCache,
    task: Any = None,
    *,
    budgeted: bool | None = None,
) -> list[CandidateProfile]:
    """A profile of each of `architectures` as `settings` train them (the task's planning
    batch, the optimizer's state per parameter), measuring into `costs`; `budgeted`: the
    batch a memory budget is planned for (`nas.study.training.planning_input`)."""
    task = task if task is not None else get_task(settings.task.name, **settings.task.options)
    x = training.planning_input(settings, task, budgeted=budgeted)
    ratio = optimizer_state_ratio(training.rates(settings.train).optimizer())
    return [
        CandidateProfile(
            training.compile_model(arch, task, settings.train.dropout)[0], x, ratio, costs
        )
        for arch in architectures
    ]
