"""launch(): failures surface in the caller quickly, nothing hangs, nothing is orphaned."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext, StageFailedError
from pipeline.distributed import procfs
from pipeline.local.models import mlp_stack

pytestmark = pytest.mark.multiprocess
SGD = functools.partial(torch.optim.SGD, lr=0.1)


def ranks_and_devices(ctx: StageContext) -> tuple[int, int, str, int]:
    return ctx.rank, dist.get_world_size(), str(ctx.device), torch.get_num_threads()


def test_results_come_back_in_rank_order() -> None:
    results = pipeline.launch(ranks_and_devices, 3, threads_per_stage=1, timeout_s=30)
    assert results == [(r, 3, "cpu", 1) for r in range(3)]


def raise_on_stage_one(ctx: StageContext) -> None:
    if ctx.rank == 1:
        raise ValueError("boom from stage one")
    x = torch.empty(1)
    dist.recv(x, src=1)  # would wait for the whole 60 s timeout without the caller's help


def test_a_failing_stage_raises_in_the_caller_within_seconds() -> None:
    start = time.monotonic()
    with pytest.raises(StageFailedError, match="(?s)stage 1 failed.*ValueError: boom") as info:
        pipeline.launch(raise_on_stage_one, 2, threads_per_stage=1, timeout_s=60)
    assert time.monotonic() - start < 20
    assert info.value.stage == 1
    assert multiprocessing.active_children() == []  # no stage process outlives launch


KILLED_CALLER = """
import os, sys, time
import pipeline

def sleep_here(ctx):
    with open(f"{sys.argv[1]}.{ctx.rank}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"{sys.argv[1]}.{ctx.rank}.tmp", f"{sys.argv[1]}.{ctx.rank}")
    time.sleep(600)

if __name__ == "__main__":
    pipeline.launch(sleep_here, 2, threads_per_stage=1, timeout_s=60)
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc")
def test_stages_leave_when_their_caller_is_killed(tmp_path: Path) -> None:
    """Under the forkserver a stage's parent is the server, which outlives the caller while
    any stage lives: the stages watch the caller itself."""
    script = tmp_path / "caller.py"
    script.write_text(KILLED_CALLER)
    caller = subprocess.Popen([sys.executable, str(script), str(tmp_path / "stage")])
    try:
        files = [tmp_path / f"stage.{rank}" for rank in range(2)]
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in files) and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(f.read_text()) for f in files]
        assert all(procfs.running(pid) for pid in pids)
    finally:
        caller.kill()  # no cleanup of its own: only the stages' watch can end them
        caller.wait()
    deadline = time.monotonic() + 15
    while any(procfs.running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(procfs.running(pid) for pid in pids)


PRELOADING_CALLER = """
import sys
import pipeline
from pipeline.distributed.server import prestart

PROBES = ("xml.dom.minidom", "broken_on_import")

def imported(ctx):
    return [name for name in PROBES if name in sys.modules]

if __name__ == "__main__":
    sys.path.insert(0, sys.argv[1])  # broken_on_import.py: raises as it is imported
    prestart(preload=sys.argv[2:])
    print(pipeline.launch(imported, 1, threads_per_stage=1, timeout_s=60)[0])
"""


def test_a_stage_starts_with_the_modules_its_caller_preloads(tmp_path: Path) -> None:
    """`prestart(preload=...)`: the server imports them, so a stage has them on its first
    line; one that raises, or does not exist, leaves the server (and the launch) working."""
    (tmp_path / "broken_on_import.py").write_text("raise RuntimeError('not here')\n")
    script = tmp_path / "caller.py"
    script.write_text(PRELOADING_CALLER)

    def stage_has(*preload: str) -> str:
        cmd = [sys.executable, str(script), str(tmp_path), *preload]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert stage_has() == "[]"
    assert stage_has("xml.dom.minidom", "broken_on_import", "no_such_module") == (
        "['xml.dom.minidom']"
    )


def die_on_stage_zero(ctx: StageContext) -> None:
    if ctx.rank == 0:
        os._exit(3)
    dist.barrier()


def test_a_stage_that_dies_is_reported() -> None:
    with pytest.raises(StageFailedError, match="exited with code 3"):
        pipeline.launch(die_on_stage_zero, 2, threads_per_stage=1, timeout_s=60)


def collective_timeout(ctx: StageContext) -> None:
    if ctx.rank == 0:
        dist.recv(torch.empty(1), src=1)  # stage 1 never sends
    else:
        time.sleep(30)


def test_collectives_time_out() -> None:
    start = time.monotonic()
    with pytest.raises(StageFailedError, match="(?i)timed out"):
        pipeline.launch(collective_timeout, 2, threads_per_stage=1, timeout_s=2)
    assert time.monotonic() - start < 20


def bad_arguments(ctx: StageContext) -> dict[str, str]:
    """Each bad argument raises a clear error; collect the messages."""
    specs = mlp_stack([4, 8, 3])
    cases: dict[str, Any] = {
        "more stages than layers": lambda: ElasticPipeline(
            specs[:1], optimizer=SGD, loss_fn=F.cross_entropy
        ),
        "unknown schedule": lambda: ElasticPipeline(
            specs, optimizer=SGD, loss_fn=F.cross_entropy, schedule="interleaved"
        ),
        "bad partition": lambda: ElasticPipeline(
            specs, optimizer=SGD, loss_fn=F.cross_entropy, planning=PlanOptions(partition=[2, 1])
        ),
        "not a module": lambda: ElasticPipeline(
            [LayerSpec("a", nn.ReLU), LayerSpec("b", lambda: "no module")],  # type: ignore[arg-type,return-value]
            optimizer=SGD,
            loss_fn=F.cross_entropy,
        ).train_step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long)),  # planned, then built
        "not an optimizer": lambda: ElasticPipeline(
            specs,
            optimizer=lambda groups: groups,  # type: ignore[arg-type,return-value]
            loss_fn=F.cross_entropy,
        ),
        "infeasible budget": lambda: ElasticPipeline(
            specs,
            optimizer=SGD,
            loss_fn=F.cross_entropy,
            n_microbatches=2,
            planning=PlanOptions(memory_budget=64),
        ).train_step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long)),  # planned on rank 0
        "indivisible batch": lambda: ElasticPipeline(
            specs, optimizer=SGD, loss_fn=F.cross_entropy, n_microbatches=4
        ).train_step(torch.randn(6, 4), torch.zeros(6, dtype=torch.long)),
    }
    errors = {}
    for name, case in cases.items():
        try:
            case()
        except (ValueError, TypeError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
        dist.barrier()  # a failed pipeline leaves no messages in flight
    return errors


def test_bad_arguments_give_clear_errors() -> None:
    results = pipeline.launch(bad_arguments, 2, threads_per_stage=1, timeout_s=30)
    errors = results[1]
    assert "ValueError: cannot split 1 layers over 2 stages" in errors["more stages than layers"]
    assert "unknown schedule 'interleaved'" in errors["unknown schedule"]
    assert "holds 3 layers, the model has 2" in errors["bad partition"]
    assert "layer 'b' returned a str" in errors["not a module"]
    assert "must return a torch.optim.Optimizer" in errors["not an optimizer"]
    assert "batch size 6, which n_microbatches=4 does not divide" in errors["indivisible batch"]
    for rank_errors in results:  # rank 0 planned; every rank raised the same clear error
        message = rank_errors["infeasible budget"]
        assert "no plan fits a memory budget of 64 bytes per stage" in message


def mismatched_shapes(ctx: StageContext) -> None:
    specs = [
        LayerSpec("a", functools.partial(nn.Linear, 4, 8)),
        LayerSpec("b", functools.partial(nn.Linear, 5, 3)),
    ]
    pipe = ElasticPipeline(
        specs, optimizer=SGD, loss_fn=F.cross_entropy, planning=PlanOptions(partition=[1, 1])
    )
    pipe.train_step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))


def test_an_error_in_a_layer_names_the_layer_and_its_input() -> None:
    with pytest.raises(
        StageFailedError,
        match="(?s)cannot be multiplied.*in the forward of "
        r"layer 'b' on stage 1, input shapes \[\(1, 8\)\]",
    ):
        pipeline.launch(mismatched_shapes, 2, threads_per_stage=1, timeout_s=30)


def test_launch_validates_its_own_arguments() -> None:
    with pytest.raises(ValueError, match="n_stages"):
        pipeline.launch(ranks_and_devices, 0)
    with pytest.raises(ValueError, match="backend"):
        pipeline.launch(ranks_and_devices, 1, backend="mpi")


TORCHRUN_SCRIPT = """
import functools, torch, torch.nn.functional as F, pipeline
from pipeline import ElasticPipeline
from pipeline.distributed.comm import Comm
from pipeline.local.models import mlp_stack

KEPT = []  # what a program (or a reference cycle the collector has not reached) still holds

def main(ctx):
    pipe = ElasticPipeline(mlp_stack([4, 8, 8, 3]), loss_fn=F.cross_entropy,
                           optimizer=functools.partial(torch.optim.SGD, lr=0.1))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 3, (8,), generator=g)
    losses = [pipe.train_step(x, y) for _ in range(3)]
    comm = Comm()  # messages and an agreement, waited for and kept until the job exits
    message = comm.send(torch.ones(2), 1) if ctx.rank == 0 else comm.recv(torch.empty(2), 0)
    message.wait()
    agreement = comm.all_reduce_async([1.0])
    agreement.wait()
    KEPT.extend([message, agreement, pipe])
    return losses

if __name__ == "__main__":
    import atexit, json, os, sys
    import torch.distributed as dist
    out = {}

    def record():  # registered first, so it runs after launch's own teardown at exit
        tasks = "/proc/self/task"  # Linux: the names of this process's threads
        out["threads_at_exit"] = [open(f"{tasks}/{t}/comm").read().strip()
                                  for t in os.listdir(tasks)] if os.path.isdir(tasks) else []
        with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
            json.dump(out, f)

    atexit.register(record)
    out["losses"] = pipeline.launch(main, n_stages=2, threads_per_stage=1, timeout_s=30)
    out["again"] = pipeline.launch(main, n_stages=2, threads_per_stage=1, timeout_s=30)
    out["kept"] = dist.is_initialized()
"""


def test_joins_torchrun_process_group(tmp_path: Path) -> None:
    """Two launches in one torchrun job share the group it creates; it is gone at exit, with
    every thread of its transport, even while the program still holds finished messages."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--standalone",
        str(script),
        str(tmp_path),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[:3000]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    results = [rank["losses"] for rank in ranks]
    assert results[0] == results[1]  # both processes got every stage's losses
    assert len(results[0]) == 2 and len(results[0][0]) == 3
    assert all(rank["again"] == rank["losses"] and rank["kept"] for rank in ranks)  # relaunched
    for rank in ranks:  # the group is gone at exit: no gloo thread left to outlive Python
        assert not [t for t in rank["threads_at_exit"] if "gloo" in t], rank["threads_at_exit"]
