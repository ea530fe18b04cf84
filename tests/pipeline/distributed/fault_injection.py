"""Injected failures that the fault tests share: where to fail, and layers that fail there.

`Fault` is armed in every stage process before a case; `Faulty` layers, `faulty_loss` and
`FaultySGD` read it and raise on the chosen rank, phase, step and micro-batch only. The
flushed schedules' cases live in `test_faults`; the streams' (`failing_stream`, checked by
`assert_stream_failures`) are run by `test_two_bw` and `test_pipemare`, so the machinery
lives here rather than in one of those test modules.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext, StageError

Case = tuple[int, str, int, int]  # (rank, phase, step, micro-batch; -1: none)

M, BATCH = 4, 8
WIDTHS = [6, 12, 12, 12, 12, 3]  # five layers


class Fault:
    """Where to fail: on which rank, in which phase, at which step and micro-batch.

    Set in every stage process before a case runs (the same on all ranks); the layers, the
    loss and the optimizer read it and raise on the chosen rank only.
    """

    rank, phase, step, microbatch = -1, "", -1, -1
    calls: dict[str, int] = {}

    @classmethod
    def arm(cls, rank: int, phase: str, step: int, microbatch: int) -> None:
        cls.rank, cls.phase, cls.step, cls.microbatch, cls.calls = rank, phase, step, microbatch, {}

    @classmethod
    def due(cls, phase: str, per_step: int, who: str = "") -> bool:
        """Count this call (per caller); True at the armed step and micro-batch and rank."""
        n = cls.calls[phase + who] = cls.calls.get(phase + who, -1) + 1
        if phase != cls.phase or dist.get_rank() != cls.rank:
            return False
        return n == cls.step * per_step + max(cls.microbatch, 0)


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, who: str) -> torch.Tensor:
        ctx.who = who
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if Fault.due("backward", M, ctx.who):
            raise RuntimeError("injected backward failure")
        return grad, None


class _RaiseInWeightGrad(torch.autograd.Function):
    """Identity on the weight: its backward lies on the weight-gradient side only."""

    @staticmethod
    def forward(ctx: Any, w: torch.Tensor, who: str) -> torch.Tensor:
        ctx.who = who
        return w.view_as(w)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if Fault.due("weight", M, ctx.who):
            raise RuntimeError("injected weight failure")
        return grad, None


class Faulty(nn.Linear):
    """A linear layer that raises in its forward or backward when `Fault` says so."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        who = str(id(self))
        if Fault.due("forward", M, who):
            raise ValueError("injected forward failure")
        weight = _RaiseInWeightGrad.apply(self.weight, who)
        return _RaiseInBackward.apply(F.linear(x, weight, self.bias), who)


def faulty_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if Fault.due("loss", M):
        raise ArithmeticError("injected loss failure")
    if Fault.due("nan", M):
        return out.sum() * float("nan")
    return F.cross_entropy(out, y)


class FaultySGD(torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:
        if Fault.due("optimizer", 1, str(id(self))):  # per optimizer: one per stage
            raise RuntimeError("injected optimizer failure")
        return super().step(closure)


OPT = functools.partial(FaultySGD, lr=0.1)


def faulty_stack() -> list[LayerSpec]:
    """Five layers, each a `Faulty` (so the chosen stage's first layer raises)."""
    pairs = list(itertools.pairwise(WIDTHS))
    return [LayerSpec(f"f{i}", functools.partial(Faulty, a, b)) for i, (a, b) in enumerate(pairs)]


def data(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(BATCH, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g))
        for _ in range(n)
    ]


def faulty_pipeline(schedule: str, sizes: list[int]) -> ElasticPipeline:
    """`faulty_stack` cut into `sizes` under `schedule`, trained by `OPT` on `faulty_loss`."""
    return ElasticPipeline(
        faulty_stack(),
        optimizer=OPT,
        loss_fn=faulty_loss,
        schedule=schedule,
        n_microbatches=M,
        planning=PlanOptions(partition=sizes),
    )


def error_record(error: StageError) -> dict[str, Any]:
    """What a case records of the error it raised (compared across ranks)."""
    return {
        "type": type(error).__name__,
        "stage": error.stage,
        "phase": error.phase,
        "step": error.step,
        "layer": error.layer,
        "microbatch": error.microbatch,
    }


def failing_stream(ctx: StageContext, schedule: str, cases: list[Case]) -> Any:
    """For stream schedules (2bw, pipemare): each case arms a fault, trains a `pipe.train`
    stream into it, records the error every rank raised, and checks the pipeline trains on."""
    sizes = [5 - 2 * (ctx.world_size - 1)] + [2] * (ctx.world_size - 1)
    pipe = faulty_pipeline(schedule, sizes)
    out = []
    for rank, phase, step, microbatch in cases:
        pipe.reconfigure(faulty_stack(), partition=sizes, loss_fn=faulty_loss)
        Fault.arm(rank, phase, step, microbatch)
        record: dict[str, Any] = {"losses": []}
        try:
            for loss in pipe.train(data(step + 3)):
                record["losses"].append(loss)
        except StageError as error:
            record.update(error_record(error))
        Fault.arm(-1, "", -1, -1)
        record["steps"] = pipe.step
        record["after"] = list(pipe.train(data(2, seed=1)))  # still usable
        out.append(record)
    pipe.close()
    return out


def assert_stream_failures(schedule: str, cases: list[Case], n_stages: int) -> None:
    """Run `failing_stream` on `n_stages` processes: every rank raised each case's
    `StageError`, the steps before the failing one stand, and the pipeline trained on."""
    run = functools.partial(failing_stream, schedule=schedule, cases=cases)
    results = pipeline.launch(run, n_stages, threads_per_stage=1, timeout_s=60)
    for records in results:
        for record, (rank, phase, step, microbatch) in zip(records, cases, strict=True):
            assert record.get("type") == "StageError", record
            assert (record["stage"], record["phase"], record["step"]) == (rank, phase, step)
            assert record["microbatch"] == (None if microbatch < 0 else microbatch)
            # the steps before the failing one stand (a failure can stop the step before it
            # on a neighbour that learns of it first); an optimizer step fails after its
            # step's loss was agreed and yielded
            done = len(record["losses"])
            assert record["steps"] == done, record
            assert done == step + 1 if phase == "optimizer" else step - 1 <= done <= step
            assert len(record["after"]) == 2
    assert all(r == results[0] for r in results)
