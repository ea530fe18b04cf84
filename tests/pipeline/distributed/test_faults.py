"""Failures in one stage are errors on every rank, fast, and the processes stay usable.

Injected: an exception in a layer's forward or backward (on the input side, or on the
weight side, which ZB-H1 runs in its deferred W actions), in the loss, or in the optimizer
step, at random steps, stages and micro-batches, under GPipe, 1F1B and ZB-H1; a NaN loss; a stage
killed or exiting mid-step; a failure in each phase of a migration. Every rank must raise
the same error within seconds; afterwards a `reconfigure` trains exactly like a fresh
pipeline, and a rolled-back migration leaves every layer's state as it was.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import (
    ElasticPipeline,
    LayerSpec,
    MigrationError,
    NonFiniteLossError,
    PlanOptions,
    StageContext,
    StageError,
    StageFailedError,
)
from pipeline.local.models import mlp_stack
from pipeline.pure.placement import Placement
from pipeline.pure.schedule import placement_of
from tests.pipeline.distributed.fault_injection import (
    OPT,
    WIDTHS,
    Case,
    Fault,
    M,
    data,
    error_record,
    faulty_loss,
    faulty_pipeline,
    faulty_stack,
)

pytestmark = pytest.mark.multiprocess


def clean_losses(pipe: ElasticPipeline, n: int) -> list[float]:
    pipe.reconfigure(mlp_stack(WIDTHS, dropout=0.1), partition=pipe.sizes)
    return [pipe.train_step(x, y) for x, y in data(n, seed=1)]


def injected(ctx: StageContext, schedule: str, cases: list[Case]) -> Any:
    """Each case: arm a fault, train until it fires, record the error, then reconfigure."""
    n_stages = placement_of(schedule, ctx.world_size).n_stages
    sizes = [5 - 2 * (n_stages - 1)] + [2] * (n_stages - 1) if n_stages < 4 else [2, 1, 1, 1]
    pipe = faulty_pipeline(schedule, sizes)
    fresh = clean_losses(pipe, 3)  # what a clean model trains like on these processes
    out: list[dict[str, Any]] = []
    for rank, phase, step, microbatch in cases:
        pipe.reconfigure(faulty_stack(), partition=sizes, loss_fn=faulty_loss)
        Fault.arm(rank, phase, step, microbatch)
        record: dict[str, Any] = {"case": (rank, phase, step, microbatch)}
        for x, y in data(step + 1):
            start = time.monotonic()
            try:
                pipe.train_step(x, y)
            except StageError as error:
                record.update(error_record(error), text=str(error))
                record["seconds"] = time.monotonic() - start
                break
        Fault.arm(-1, "", -1, -1)
        record["after"] = clean_losses(pipe, 3)
        record["fresh"] = fresh
        out.append(record)
    pipe.close()
    return out


def random_cases(placement: Placement, count: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    cases = []
    loss_rank = placement.rank_of(placement.n_stages - 1)
    for phase in ["forward", "backward", "weight", "loss", "optimizer", "nan"]:
        for _ in range(count):
            rank = loss_rank if phase in ("loss", "nan") else rng.randrange(placement.n_ranks)
            microbatch = -1 if phase == "optimizer" else rng.randrange(M)
            cases.append((rank, phase, rng.randrange(3), microbatch))
    return cases


@pytest.mark.parametrize(
    "schedule,n_ranks",
    [("1f1b", 2), ("gpipe", 3), ("zbh1", 3), ("zbv", 2), ("interleaved_1f1b", 2)],
)
def test_an_injected_failure_raises_on_every_rank_and_the_processes_stay_usable(
    schedule: str, n_ranks: int
) -> None:
    placement = placement_of(schedule, n_ranks)
    cases = random_cases(placement, 2, seed=n_ranks)
    fn = functools.partial(injected, schedule=schedule, cases=cases)
    results = pipeline.launch(fn, n_ranks, threads_per_stage=1, timeout_s=60)
    for rank_records in results:
        for record, (rank, phase, step, microbatch) in zip(rank_records, cases, strict=True):
            where = record["case"]
            expected = "NonFiniteLossError" if phase == "nan" else "StageError"
            assert record.get("type") == expected, where
            assert record["stage"] in placement.stages_of(rank), where  # a stage it holds
            assert record["step"] == step, where
            phases = {"nan": "loss", "weight": "backward"}  # W is half of a backward
            assert record["phase"] == phases.get(phase, phase), where
            if phase in ("forward", "backward", "weight"):
                assert record["layer"] in {f"f{i}" for i in range(5)}, where
                assert record["microbatch"] == microbatch, where
                assert f"injected {phase} failure" in record["text"], where
            if phase == "weight" and schedule == "zbh1" and rank > 0:  # stage 0: no split
                assert "weight-gradient backward (W)" in record["text"], where
            assert record["seconds"] < 10, where  # generous: it takes milliseconds
            assert record["after"] == record["fresh"], where  # trains like a fresh pipeline
    texts = [[r["text"] for r in rank_records] for rank_records in results]
    assert all(t == texts[0] for t in texts)  # the same error on every rank


# -- a NaN loss is not applied anywhere ------------------------------------------------------
def nan_step(ctx: StageContext) -> dict[str, Any]:
    pipe = faulty_pipeline("1f1b", [3, 2])
    batches = data(3)
    pipe.train_step(*batches[0])
    before = pipe.full_state_dict()
    Fault.arm(ctx.world_size - 1, "nan", 0, 2)  # counts from here: the next step, mb 2
    out: dict[str, Any] = {}
    try:
        pipe.train_step(*batches[1])
    except NonFiniteLossError as error:
        out["error"] = (error.stage, error.step, error.microbatch)
    Fault.arm(-1, "", -1, -1)
    after = pipe.full_state_dict()  # a collective: {} on other ranks than 0
    out["unchanged"] = all(
        torch.equal(before[k][n], v) for k, s in after.items() for n, v in s.items()
    )
    out["next"] = pipe.train_step(*batches[1])  # the same batch again, now finite
    pipe.close()
    return out


def test_a_nan_loss_raises_everywhere_and_changes_no_weight() -> None:
    results = pipeline.launch(nan_step, 2, threads_per_stage=1, timeout_s=60)
    for r in results:
        assert r["error"] == (1, 1, 2)
        assert r["unchanged"]
        assert r["next"] == r["next"] and r["next"] == results[0]["next"]  # finite, agreed


# -- a stage process dies mid-step ------------------------------------------------------------
class Dies(nn.Linear):
    """Kills its own process (SIGKILL, or exits) in the third step's forward on stage 1."""

    def __init__(self, a: int, b: int, how: str) -> None:
        super().__init__(a, b)
        self.how, self.calls = how, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if dist.get_rank() == 1 and self.calls == 2 * M + 2:
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(7)
        return super().forward(x)


def dying(ctx: StageContext, how: str) -> None:
    specs = [*mlp_stack([6, 12, 12]), LayerSpec("dies", functools.partial(Dies, 12, 3, how))]
    pipe = ElasticPipeline(
        specs,
        optimizer=OPT,
        loss_fn=F.cross_entropy,
        n_microbatches=M,
        planning=PlanOptions(partition=[2, 1]),
    )
    for x, y in data(5):
        pipe.train_step(x, y)


@pytest.mark.parametrize("how,detail", [("kill", "code -9"), ("exit", "code 7")])
def test_a_stage_that_dies_mid_step_makes_launch_raise_in_seconds(how: str, detail: str) -> None:
    start = time.monotonic()
    with pytest.raises(StageFailedError, match=detail) as info:
        pipeline.launch(functools.partial(dying, how=how), 2, threads_per_stage=1, timeout_s=120)
    assert time.monotonic() - start < 30  # the timeout is 120 s; detection takes ~1-2 s
    assert info.value.stage == 1
    assert multiprocessing.active_children() == []


# -- a failure in each phase of a migration ---------------------------------------------------
class Fragile(nn.Linear):
    """A layer that fails to pack (state_dict), to serialise, or to build on stage 1."""

    fail = ""

    def __init__(self, a: int, b: int) -> None:
        if Fragile.fail == "build" and dist.get_rank() == 1:
            raise RuntimeError("injected build failure")
        super().__init__(a, b)

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        if Fragile.fail == "pack":
            raise RuntimeError("injected pack failure")
        return super().state_dict(*args, **kwargs)


class CommitFails(torch.optim.SGD):
    """An optimizer that refuses new parameter groups on stage 1 (the commit phase)."""

    def add_param_group(self, group: dict[str, Any]) -> None:
        if Fragile.fail == "commit" and dist.get_rank() == 1:
            raise RuntimeError("injected commit failure")
        super().add_param_group(group)
        if Fragile.fail == "serialise":
            self.state[group["params"][0]]["unpicklable"] = lambda: None


def migrations(ctx: StageContext) -> dict[str, Any]:
    specs = [
        *mlp_stack([6, 12, 12, 12])[:2],
        LayerSpec("fragile", functools.partial(Fragile, 12, 12)),
        LayerSpec("out", functools.partial(nn.Linear, 12, 3)),
    ]
    opt = functools.partial(CommitFails, lr=0.1, momentum=0.9)
    out: dict[str, Any] = {}
    for phase in ["pack", "serialise", "build", "commit"]:
        Fragile.fail = "serialise" if phase == "serialise" else ""  # a lambda in the state
        pipe = ElasticPipeline(
            specs,
            optimizer=opt,
            loss_fn=F.cross_entropy,
            n_microbatches=M,
            planning=PlanOptions(partition=[3, 1]),
        )
        batches = data(3)
        pipe.train_step(*batches[0])
        before = pipe.full_state_dict()
        Fragile.fail = phase
        error = ""
        try:
            pipe.repartition([2, 2])  # moves "fragile" from stage 0 to stage 1
        except MigrationError as exc:
            error = str(exc)
        Fragile.fail = ""
        after = pipe.full_state_dict()
        same = all(torch.equal(before[k][n], v) for k, s in after.items() for n, v in s.items())
        out[phase] = {
            "error": error,
            "sizes": pipe.sizes,
            "same": same,
            "keys": pipe.layer_keys,
            "loss": pipe.train_step(*batches[1]),
        }
        pipe.close()
    return out


def test_a_failure_in_any_migration_phase_rolls_back_everywhere() -> None:
    results = pipeline.launch(migrations, 2, threads_per_stage=1, timeout_s=60)
    expected_keys = [("mlp0", "mlp1", "fragile"), ("out",)]
    for rank, r in enumerate(results):
        for phase, outcome in r.items():
            assert "rolled back" in outcome["error"], (phase, outcome["error"])
            assert outcome["sizes"] == [3, 1] and outcome["same"], phase
            assert outcome["keys"] == expected_keys[rank], phase
    for phase in ["pack", "build", "commit"]:
        assert f"injected {phase} failure" in results[0][phase]["error"]
    assert "pickle" in results[0]["serialise"]["error"].lower()
    # after the rollback the next step is the same on every rank
    assert all(r[p]["loss"] == results[0][p]["loss"] for r in results for p in r)
