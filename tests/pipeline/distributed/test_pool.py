"""A stage pool: models grown and shrunk live train exactly as one process; jobs side by side;
a process that dies is replaced and leaves nothing behind."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pipeline import (
    ElasticPipeline,
    PlanOptions,
    PoolClient,
    PoolContext,
    PoolService,
    StageFailedError,
    StagePool,
)
from pipeline.local.models import transformer_stack
from pipeline.local.reference import ReferenceTrainer
from tests.pipeline.distributed.common import ADAM, assert_same_trajectory

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(240)]
SEED, STEPS = 5, 3


def batches(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(4, 5, 16, generator=g), torch.randn(4, 5, 16, generator=g))
        for _ in range(STEPS)
    ]


def train(ctx: PoolContext, n_layers: int, partition: list[int], data_seed: int) -> dict[str, Any]:
    """A pool job: n_layers Transformer layers from the weights it took (if any), trained
    and kept; what it measured on rank 0."""
    pipe = ElasticPipeline(
        transformer_stack(n_layers, 16, 2),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=2,
        seed=SEED,
        planning=PlanOptions(partition=partition),
        inherit_from=ctx.resident,
    )
    losses = [pipe.train_step(x, y) for x, y in batches(data_seed)]
    if ctx.keep_as is not None:
        ctx.keep(pipe.snapshot())
    state = pipe.full_state_dict()
    took = [e.details for e in pipe.events if e.kind == "inherit"]
    pipe.close()
    return {"losses": losses, "state": state, "took": took, "pid": os.getpid()}


Trained = tuple[list[float], dict[str, dict[str, torch.Tensor]]]  # losses, state


def reference(n_layers: int, data_seed: int, start: Trained | None) -> Trained:
    """One process: the same model from `start`'s weights where keys match, trained (on
    one thread, as the stages: the keys' biases get gradients of rounding noise alone,
    which Adam scales up to full steps, so any other order of sums shows there)."""
    torch.set_num_threads(1)
    ref = ReferenceTrainer(
        transformer_stack(n_layers, 16, 2),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=2,
        seed=SEED,
    )
    for spec, layer in zip(ref.specs, ref.layers, strict=True):
        if start is not None and spec.key in start[1]:
            layer.load_state_dict(start[1][spec.key])
    losses = [ref.train_step(x, y) for x, y in batches(data_seed)]
    return losses, ref.full_state_dict()


def assert_same(result: dict[str, Any], ref: Trained) -> None:
    assert_same_trajectory(result, {"losses": ref[0], "state": ref[1]})


@pytest.fixture(scope="module")
def pool() -> Any:
    with StagePool(2, timeout_s=60) as pool:
        yield pool


def test_a_model_grown_from_one_to_two_stages_and_shrunk_back_trains_as_one_process(
    pool: StagePool,
) -> None:
    pids = pool.pids
    restarts = pool.restarts
    parent = pool.run(
        functools.partial(train, n_layers=4, partition=[4], data_seed=1), 1, keep="parent"
    )[0]
    holder = pool.resident()["parent"]
    # grown: the 4 parent layers and 2 new ones on 2 stages; 2 parent layers move live
    child = pool.run(
        functools.partial(train, n_layers=6, partition=[3, 3], data_seed=2),
        2,
        take="parent",
        keep="child",
    )[0]
    assert set(pool.resident()["child"]) == {0, 1}
    # shrunk: 4 of the child's layers on 1 stage, the other process hands its part over
    grandchild = pool.run(
        functools.partial(train, n_layers=4, partition=[4], data_seed=3), 1, take="child"
    )[0]

    ref_parent = reference(4, 1, None)
    ref_child = reference(6, 2, ref_parent)
    ref_grandchild = reference(4, 3, ref_child)
    assert_same(parent, ref_parent)
    assert_same(child, ref_child)
    assert_same(grandchild, ref_grandchild)
    # what was taken, and from where: live, never a fresh start
    assert child["took"][0]["layers"] == 4 and child["took"][0]["moved"] == 1  # block3
    assert grandchild["took"][0]["layers"] == 4 and grandchild["took"][0]["moved"] == 0
    assert grandchild["took"][0]["fresh_tensors"] == 0
    # the pool's processes, never one started: the grown pipeline kept its holder at rank 0
    assert pool.pids == pids and pool.restarts == restarts
    assert holder == (0,) and child["pid"] == pids[0]


def meet(ctx: PoolContext, folder: str, me: str, other: str, data_seed: int) -> dict[str, Any]:
    """Wait (up to 60 s) until the other job has started too, then train."""
    Path(folder, me).touch()
    deadline = time.monotonic() + 60
    while not Path(folder, other).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {other} never ran beside job {me}")
        time.sleep(0.01)
    return train(ctx, 4, [4], data_seed)


def test_two_models_train_side_by_side_each_as_one_process(pool: StagePool, tmp_path: Path) -> None:
    first = pool.submit(
        functools.partial(meet, folder=str(tmp_path), me="a", other="b", data_seed=4), 1
    )
    second = pool.submit(
        functools.partial(meet, folder=str(tmp_path), me="b", other="a", data_seed=5), 1
    )
    a, b = first.result(timeout=120)[0], second.result(timeout=120)[0]
    assert a["pid"] != b["pid"]
    assert_same(a, reference(4, 4, None))
    assert_same(b, reference(4, 5, None))


def die_on_rank_one(ctx: PoolContext) -> None:
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    train(ctx, 4, [2, 2], data_seed=6)


def raise_on_rank_zero(ctx: PoolContext) -> None:
    if ctx.rank == 0:
        raise KeyError("a layer the user forgot")
    train(ctx, 4, [2, 2], data_seed=6)


def test_a_job_that_dies_or_raises_fails_alone_and_the_pool_replaces_its_processes(
    pool: StagePool,
) -> None:
    before = pool.pids
    with pytest.raises(StageFailedError, match="without a report") as died:
        pool.run(die_on_rank_one, 2)
    assert died.value.stage == 1
    with pytest.raises(StageFailedError, match="a layer the user forgot") as raised:
        pool.run(raise_on_rank_zero, 2)
    assert raised.value.stage == 0
    assert pool.restarts >= 2 and set(pool.pids).isdisjoint(before)
    for pid in before:  # nothing left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    after = pool.run(functools.partial(train, n_layers=4, partition=[2, 2], data_seed=7), 2)
    assert_same(after[0], reference(4, 7, None))


def wait_for_go(ctx: PoolContext, folder: str, data_seed: int) -> dict[str, Any]:
    """Say it started, wait (up to 60 s) for the file `go`, then train."""
    Path(folder, "started").touch()
    deadline = time.monotonic() + 60
    while not Path(folder, "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("no go")
        time.sleep(0.01)
    return train(ctx, 4, [4], data_seed)


def train_on_any(ctx: PoolContext, data_seed: int) -> dict[str, Any]:
    """Train on whatever stage count the pool lent: one stage, or two of two layers."""
    return train(ctx, 4, [4] if ctx.world_size == 1 else [2, 2], data_seed)


def test_a_job_that_can_run_on_fewer_stages_takes_the_processes_free_now(
    pool: StagePool, tmp_path: Path
) -> None:
    blocker = pool.submit(functools.partial(wait_for_go, folder=str(tmp_path), data_seed=8), 1)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():  # it holds one process of the two
        assert time.monotonic() < deadline, "the blocking job never started"
        time.sleep(0.01)
    narrow = pool.run(functools.partial(train_on_any, data_seed=10), (2, 1))
    assert not blocker.done()  # it ran beside the blocking job, on the one process free
    (tmp_path / "go").touch()
    blocker.result(timeout=120)
    wide = pool.run(functools.partial(train_on_any, data_seed=10), (2, 1))  # both free: 2
    assert (len(narrow), len(wide)) == (1, 2)
    assert_same(narrow[0], reference(4, 10, None))
    assert_same(wide[0], reference(4, 10, None))


def as_client(client: PoolClient, folder: str) -> None:
    """Another process's job on the served pool (killed before it ends, in the test)."""
    client.run(functools.partial(wait_for_go, folder=folder, data_seed=8), 1)


def test_another_process_runs_jobs_on_a_served_pool_and_one_killed_mid_job_costs_nothing(
    pool: StagePool, tmp_path: Path
) -> None:
    pids, restarts = pool.pids, pool.restarts
    with PoolService(pool) as service:
        client = service.client()
        away = multiprocessing.get_context("spawn").Process(
            target=as_client, args=(client, str(tmp_path))
        )
        away.start()
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():  # its job holds a process of the pool
            assert time.monotonic() < deadline and away.is_alive(), "its job never started"
            time.sleep(0.01)
        away.kill()
        away.join()
        (tmp_path / "go").touch()  # the job ends; nobody reads its result
        # both processes: the killed client's came back to the pool
        both = client.run(functools.partial(train, n_layers=4, partition=[2, 2], data_seed=9), 2)
        assert_same(both[0], reference(4, 9, None))
        assert pool.pids == pids and pool.restarts == restarts  # no process was lost
        with pytest.raises(ValueError, match="n_stages=3: a job of this pool runs on 1 to 2"):
            client.run(die_on_rank_one, 3)  # refused as the pool refuses it
        with pytest.raises(StageFailedError, match="a layer the user forgot"):
            client.run(raise_on_rank_zero, 2)
    with pytest.raises(ConnectionError, match="is gone"):
        client.run(die_on_rank_one, 1)


def test_bad_jobs_are_refused_at_the_door(pool: StagePool) -> None:
    with pytest.raises(ValueError, match="n_stages=3: a job of this pool runs on 1 to 2"):
        pool.submit(die_on_rank_one, 3)
    with pytest.raises(TypeError, match="fn must pickle"):
        pool.submit(lambda ctx: None, 1)
    with pytest.raises(ValueError, match="take=''"):
        pool.submit(die_on_rank_one, 1, take="")
    with pytest.raises(ValueError, match=r"n_stages=3: a job of this pool runs on 1 to 2"):
        pool.submit(die_on_rank_one, (2, 3))
    for counts in ((), (1, 1)):
        with pytest.raises(ValueError, match="give a count, or distinct counts"):
            pool.submit(die_on_rank_one, counts)


def test_a_closed_pool_leaves_no_process_behind() -> None:
    pool = StagePool(2, timeout_s=30)
    pids = pool.pids
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(die_on_rank_one, 1)


def test_a_program_whose_processes_cannot_start_is_told_why(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"  # no `if __name__ == "__main__":`: each process
    script.write_text(  # re-runs it as it starts, and dies there
        "import pipeline\npool = pipeline.StagePool(1, timeout_s=30)\npool.run(print, 1)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode != 0
    assert "must guard its entry point with `if __name__ == '__main__':`" in done.stderr
