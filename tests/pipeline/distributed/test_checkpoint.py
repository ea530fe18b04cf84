"""Checkpoints: save anywhere, resume under any partition, schedule or rank count, exactly.

Three launches share one folder. The first (2 ranks) trains a Transformer stack with
dropout, Adam and a StepLR schedule for 6 steps without interruption (a live repartition
before step 2, a checkpoint after step 3) and resumes that checkpoint under another
partition and schedule, with recompute, with two stages per rank, with partition="auto"
and into a pipeline that trained another model (`reconfigure(checkpoint=...)`); a 2BW
stream the same way (automatic saves every 2 steps); then the faults: a corrupt and a
missing shard, another model's checkpoint, a save that fails mid-write. The second
(2 ranks) saves every 2 steps and loses a rank to SIGKILL at step 5. The third (3 ranks)
resumes the first's checkpoint and the killed run's newest. Every resumed run must end
within 1e-6 of the uninterrupted one (losses and full state), which equals
`ReferenceTrainer` with the same lr schedule.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import pipeline
from pipeline import (
    CheckpointError,
    CheckpointOptions,
    ElasticPipeline,
    LayerSpec,
    Plan,
    PlanOptions,
    StageContext,
    StageFailedError,
)
from pipeline.local.models import transformer_stack
from pipeline.local.reference import ReferenceTrainer
from tests.pipeline.distributed.common import max_state_diff

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(420)]

STEPS, SAVED, M = 6, 3, 4
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)
SCHEDULE = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=2, gamma=0.5)


def specs(width: int = 16) -> list[LayerSpec]:
    return transformer_stack(4, width, 2, dropout=0.1)


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (torch.randn(8, 6, 16, generator=g), torch.randn(8, 6, 16, generator=g))
        for _ in range(STEPS)
    ]


def make(
    partition: Any,
    schedule: Any = "1f1b",
    checkpoint: CheckpointOptions | None = None,
    model: list[LayerSpec] | None = None,
) -> ElasticPipeline:
    return ElasticPipeline(
        specs() if model is None else model,
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        schedule=schedule,
        n_microbatches=M,
        seed=3,
        planning=PlanOptions(partition=partition),
        lr_scheduler=SCHEDULE,
        checkpoint=checkpoint,
    )


def lrs(pipe: ElasticPipeline) -> dict[str, float]:
    """{layer key: its lr} over every rank's optimizers."""
    mine = {g["layer"]: g["lr"] for opt in pipe.optimizers for g in opt.param_groups}
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def finish(pipe: ElasticPipeline, losses: list[float], **extra: Any) -> dict[str, Any]:
    result = {"losses": losses, "state": pipe.full_state_dict(), "lrs": lrs(pipe), **extra}
    result["sizes"], result["step"] = pipe.sizes, pipe.step
    pipe.close()
    return result


# -- launch 1: uninterrupted runs, resumed runs, faults (2 ranks) ------------------------------
def uninterrupted(folder: Path) -> dict[str, Any]:
    pipe, data, losses, at_save = make([2, 2]), batches(), [], None
    for step, (x, y) in enumerate(data):
        if step == 2:
            pipe.repartition([1, 3])  # the lr schedules travel with their layers
        if step == SAVED:
            at_save = pipe.full_state_dict()
            pipe.save_checkpoint(folder / "a")
        losses.append(pipe.train_step(x, y))
    return finish(pipe, losses, at_save=at_save)


def resumed(folder: Path, partition: Any, schedule: Any = "1f1b") -> dict[str, Any]:
    pipe = make(partition, schedule, CheckpointOptions(resume_from=folder / "a"))
    step = pipe.step
    losses = [pipe.train_step(x, y) for x, y in batches()[step:]]
    return finish(pipe, losses, resumed_at=step)


def reconfigured(folder: Path) -> dict[str, Any]:
    """Another model trains a step, then the pipeline takes this one from checkpoint "a"."""
    pipe = make([2, 2], model=specs(32))
    pipe.train_step(torch.randn(8, 6, 32), torch.randn(8, 6, 32))
    pipe.reconfigure(
        specs(), partition=[3, 1], checkpoint=CheckpointOptions(resume_from=folder / "a")
    )
    step = pipe.step
    losses = [pipe.train_step(x, y) for x, y in batches()[step:]]
    return finish(pipe, losses, resumed_at=step)


def stream(folder: Path) -> dict[str, Any]:
    """2BW: a stream of 3 steps, a checkpoint, a stream of 3 (saves every 2 as well)."""
    auto = CheckpointOptions(directory=folder / "auto", every=2, keep_last=2)
    pipe, data = make([2, 2], "2bw", auto), batches()
    losses = list(pipe.train(data[:SAVED]))
    pipe.save_checkpoint(folder / "b")
    losses += list(pipe.train(data[SAVED:]))
    return finish(pipe, losses, kept=sorted(os.listdir(folder / "auto")))


def stream_resumed(folder: Path) -> dict[str, Any]:
    pipe = make([3, 1], "2bw", CheckpointOptions(resume_from=folder / "b"))
    return finish(pipe, list(pipe.train(batches()[pipe.step :])))


def error_of(build: Any) -> str:
    try:
        build()
    except CheckpointError as error:
        return str(error)
    return "no error"


def damaged(ctx: StageContext, folder: Path, name: str, damage: Any) -> str:
    """Resume from a copy of checkpoint "a" that `damage` changed (on rank 0)."""
    copy = folder / name
    if ctx.rank == 0:
        shutil.copytree(folder / "a", copy)
        damage(copy)
    dist.barrier()
    return error_of(lambda: make([2, 2], checkpoint=CheckpointOptions(resume_from=copy)))


def flip_bytes(copy: Path) -> None:
    shard = copy / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    shard.write_bytes(bytes(data))


class Unpicklable:
    def __reduce__(self) -> Any:
        raise RuntimeError("injected: the disk is full")


class FlakyLinear(nn.Linear):
    """A layer whose extra state cannot be written while `fail` is set (on one rank)."""

    fail = False

    def __init__(self) -> None:
        super().__init__(16, 16)

    def get_extra_state(self) -> Any:
        return Unpicklable() if FlakyLinear.fail else {"ok": True}

    def set_extra_state(self, state: Any) -> None:
        assert state == {"ok": True}


def weights(pipe: ElasticPipeline) -> dict[str, dict[str, torch.Tensor]]:
    """Every rank's layers' tensors (full_state_dict takes no extra state)."""
    mine = {
        key: {k: v.clone() for k, v in module.state_dict().items() if torch.is_tensor(v)}
        for key, module in pipe.layers.items()
    }
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def crash_during_save(ctx: StageContext, folder: Path) -> dict[str, Any]:
    model = [
        LayerSpec("lin", functools.partial(nn.Linear, 16, 16)),
        LayerSpec("flaky", FlakyLinear),
    ]
    pipe, data = make([1, 1], model=model), batches()
    pipe.train_step(*data[0])
    pipe.save_checkpoint(folder / "crash")
    saved = weights(pipe)
    pipe.train_step(*data[1])
    FlakyLinear.fail = ctx.rank == 1
    error = error_of(lambda: pipe.save_checkpoint(folder / "crash"))
    FlakyLinear.fail = False
    pipe.close()
    back = make([1, 1], model=model, checkpoint=CheckpointOptions(resume_from=folder / "crash"))
    result = {"error": error, "step": back.step, "saved": saved, "loaded": weights(back)}
    result["files"] = sorted(os.listdir(folder))
    back.close()
    return result


def first_launch(ctx: StageContext, folder: Path) -> dict[str, Any]:
    four_stages = pipeline.get_schedule("interleaved_1f1b", stages_per_rank=2)
    recompute = Plan((2, 2), ("recompute",) * 4, "zbh1", M, 0.0, (0.0, 0.0), (0, 0))
    results = {
        "uninterrupted": uninterrupted(folder),
        "same": resumed(folder, [1, 3]),
        "gpipe [3, 1]": resumed(folder, [3, 1], "gpipe"),
        "zbh1 recompute": resumed(folder, recompute, "zbh1"),
        "interleaved": resumed(folder, [1, 1, 1, 1], four_stages),
        "auto": resumed(folder, "auto"),
        "reconfigured": reconfigured(folder),
        "2bw": stream(folder),
        "2bw [3, 1]": stream_resumed(folder),
    }
    other = [*specs()[:2], LayerSpec("other2", specs()[2].factory), specs()[3]]
    results["errors"] = {
        "corrupt": damaged(ctx, folder, "corrupt", flip_bytes),
        "missing": damaged(ctx, folder, "missing", lambda c: (c / "__0_0.distcp").unlink()),
        "other keys": error_of(
            lambda: make(
                [2, 2], checkpoint=CheckpointOptions(resume_from=folder / "a"), model=other
            )
        ),
        "other shapes": error_of(
            lambda: make(
                [2, 2], checkpoint=CheckpointOptions(resume_from=folder / "a"), model=specs(32)
            )
        ),
    }
    results["crash"] = crash_during_save(ctx, folder)
    return results


# -- launch 2: a rank killed mid-run (2 ranks) -------------------------------------------------
def killed(ctx: StageContext, folder: Path) -> None:
    pipe = make([2, 2], checkpoint=CheckpointOptions(directory=folder / "k", every=2, keep_last=2))
    for step, (x, y) in enumerate(batches()):
        if step == 5 and ctx.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        pipe.train_step(x, y)


# -- launch 3: other rank counts (3 ranks) -----------------------------------------------------
def relaunched(ctx: StageContext, folder: Path) -> dict[str, Any]:
    again = CheckpointOptions(directory=folder / "k", every=2, resume_from="latest")
    pipe = make([2, 1, 1], checkpoint=again)
    step = pipe.step
    after_kill = finish(pipe, [pipe.train_step(x, y) for x, y in batches()[step:]], resumed_at=step)
    return {"3 ranks": resumed(folder, [1, 2, 1]), "after kill": after_kill}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("checkpoints")
    launch = functools.partial(pipeline.launch, threads_per_stage=1, timeout_s=60)
    results = launch(functools.partial(first_launch, folder=folder), 2)[0]
    with pytest.raises(StageFailedError, match="without a report"):
        launch(functools.partial(killed, folder=folder), 2)
    results["kept after kill"] = sorted(os.listdir(folder / "k"))
    results.update(launch(functools.partial(relaunched, folder=folder), 3)[0])
    results["folder"] = folder
    return results


@functools.cache
def reference(two_bw: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    ref = ReferenceTrainer(
        specs(),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=M,
        seed=3,
        pipedream_2bw=two_bw,
        lr_scheduler=SCHEDULE,
    )
    losses = [ref.train_step(x, y) for x, y in batches()]
    lr = {g["layer"]: g["lr"] for g in ref.optimizer.param_groups}
    return {"losses": losses, "state": ref.full_state_dict(), "lrs": lr}


@pytest.mark.parametrize("two_bw", [False, True])
def test_uninterrupted_runs_equal_the_reference_with_its_lr_schedule(
    runs: dict[str, Any], two_bw: bool
) -> None:
    run, ref = runs["2bw" if two_bw else "uninterrupted"], reference(two_bw)
    assert run["losses"] == pytest.approx(ref["losses"], abs=1e-5)
    assert max_state_diff(run["state"], ref["state"]) <= 1e-5
    assert run["lrs"] == pytest.approx(ref["lrs"], rel=1e-12)
    assert set(run["lrs"].values()) == {1e-3 * 0.5**3}  # StepLR halved it at steps 2, 4, 6


@pytest.mark.parametrize(
    "name",
    [
        "same",
        "gpipe [3, 1]",
        "zbh1 recompute",
        "interleaved",
        "auto",
        "reconfigured",
        "3 ranks",
        "after kill",
    ],
)
def test_a_resumed_run_goes_on_exactly(runs: dict[str, Any], name: str) -> None:
    run, whole = runs[name], runs["uninterrupted"]
    start = run["resumed_at"]
    assert start == (4 if name == "after kill" else SAVED)
    assert run["step"] == STEPS
    assert run["losses"] == pytest.approx(whole["losses"][start:], abs=1e-6)
    assert max_state_diff(run["state"], whole["state"]) <= 1e-6
    assert run["lrs"] == pytest.approx(whole["lrs"], rel=1e-12)


def test_auto_takes_the_checkpoints_partition(runs: dict[str, Any]) -> None:
    assert runs["auto"]["sizes"] == [1, 3]  # the partition in force when it was saved
    assert runs["3 ranks"]["sizes"] == [1, 2, 1]


def test_a_2bw_stream_resumes_under_another_partition(runs: dict[str, Any]) -> None:
    run, whole = runs["2bw [3, 1]"], runs["2bw"]
    assert run["losses"] == pytest.approx(whole["losses"][SAVED:], abs=1e-6)
    assert max_state_diff(run["state"], whole["state"]) <= 1e-6
    # every 2 steps (a stream's save lands where its drain ends), keep_last=2
    assert len(whole["kept"]) == 2 and whole["kept"][-1] == "step-00000006"


def test_torch_reads_the_checkpoint(runs: dict[str, Any], tmp_path: Path) -> None:
    folder = runs["folder"] / "a"
    metadata = FileSystemReader(str(folder)).read_metadata()
    assert "layers/block0/module/linear1.weight" in metadata.state_dict_metadata
    assert "layers/block2/optimizer/exp_avg/linear1.weight" in metadata.state_dict_metadata
    dcp_to_torch_save(folder, tmp_path / "whole.pt")
    whole = torch.load(tmp_path / "whole.pt", weights_only=False)
    for key, state in runs["uninterrupted"]["at_save"].items():
        for name, tensor in state.items():
            assert torch.equal(whole[f"layers/{key}/module/{name}"], tensor), (key, name)
    assert whole["layers/block1/lr_scheduler"]["last_epoch"] == SAVED
    assert sorted(os.listdir(folder)) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "pipeline.json",
    ]


def test_a_damaged_checkpoint_names_the_file(runs: dict[str, Any]) -> None:
    errors = runs["errors"]
    assert "__1_0.distcp is corrupt" in errors["corrupt"]
    assert "__0_0.distcp is missing" in errors["missing"]


def test_another_models_checkpoint_names_the_first_differing_layer(runs: dict[str, Any]) -> None:
    errors = runs["errors"]
    assert "checkpoint of another model: layer 2 is 'other2'" in errors["other keys"]
    assert "'block2' in the checkpoint" in errors["other keys"]
    assert "layer 'block0'" in errors["other shapes"] and "shape" in errors["other shapes"]


def test_a_failed_save_leaves_the_previous_checkpoint_whole(runs: dict[str, Any]) -> None:
    crash = runs["crash"]
    assert "writing checkpoint" in crash["error"] and "injected: the disk is full" in crash["error"]
    assert crash["step"] == 1  # the checkpoint of step 1, not the failed one of step 2
    assert max_state_diff(crash["loaded"], crash["saved"]) == 0
    assert not any(name.startswith(".crash") for name in crash["files"])  # no partial left


def test_a_killed_job_resumes_from_its_newest_checkpoint(runs: dict[str, Any]) -> None:
    assert runs["kept after kill"] == ["step-00000002", "step-00000004"]
    assert runs["after kill"]["resumed_at"] == 4
