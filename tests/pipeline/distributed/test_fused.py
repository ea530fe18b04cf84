"""A stage run as one graph trains exactly as one run layer by layer, under every schedule.

Steps that measure nothing per layer run each stage's layers as one autograd graph
(`pipeline.local.fused`). Every schedule trains the same model twice in one launch: with
`measure_memory_every=1` (every step layer by layer) and with the default (the first step of
each plan measures, the rest are fused). Losses and full state must agree within 1e-6, both
must match one process, and `stats()` must show which path ran. The configurations cover
recomputed layers, several stages per rank, 2BW and PipeMare streams, a repartition between
a measuring and a fused step. A stage under Bi-Partition is never fused (its handed layers
need their own inputs): `test_bipartition` covers it beside fused neighbours.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from pipeline import ElasticOptions
from pipeline.local.pipemare import PipeMareConfig
from tests.pipeline.distributed.common import (
    assert_same_trajectory,
    launch_configs,
    max_state_diff,
    model_pipeline,
    recomputing,
    reference_run,
)

pytestmark = pytest.mark.multiprocess

PIPEMARE = PipeMareConfig(lr_reschedule=False, correction=False, update_every=4)
STREAMS = ("2bw", "pipemare")


# name: (schedule, partition, handoff, a repartition before step 2)
CONFIGS: dict[str, tuple[str, Any, list[int] | None, list[int] | None]] = {
    "gpipe": ("gpipe", [2, 2], None, None),
    "1f1b recompute": ("1f1b", recomputing([2, 2], "1f1b", 4), None, None),
    "zbh1 moved": ("zbh1", [1, 3], None, [3, 1]),
    "zbh1 recompute": ("zbh1", recomputing([2, 2], "zbh1", 4), None, None),
    "interleaved": ("interleaved_1f1b", [1, 1, 1, 1], None, None),
    "zbv recompute": ("zbv", recomputing([1, 1, 1, 1], "zbv", 4), None, None),
    "2bw": ("2bw", [2, 2], None, None),
    "pipemare": ("pipemare", [2, 2], None, None),
}


def train(schedule: str, partition: Any, handoff: Any, move: Any, every: int) -> dict[str, Any]:
    pipe, data = model_pipeline(
        "transformer",
        schedule,
        4,
        partition,
        handoff=handoff,
        pipemare=PIPEMARE if schedule == "pipemare" else None,
        elastic=ElasticOptions(measure_memory_every=every),
    )
    if schedule in STREAMS:
        losses = list(pipe.train(data))
    else:
        losses = []
        for step, (x, y) in enumerate(data):
            if step == 2 and move is not None:
                pipe.repartition(move)
            losses.append(pipe.train_step(x, y))
    shares = [s.fused_share for s in pipe.stats(last_steps=len(data)).stages]
    result = {"losses": losses, "state": pipe.full_state_dict(), "fused_share": shares}
    pipe.close()
    return result


def configs() -> dict[str, tuple[Any, ...]]:
    out = {}
    for name, config in CONFIGS.items():
        out[f"{name} per layer"] = (*config, 1)
        out[f"{name} fused"] = (*config, 10)
    return out


@functools.cache
def trained() -> dict[str, Any]:
    return launch_configs(train, configs(), 2, timeout_s=150)


@functools.cache
def reference() -> tuple[list[float], dict[str, Any]]:
    torch.set_num_threads(1)  # as each stage runs: the same sums in the same order
    return reference_run("transformer", 4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_steps_train_exactly_as_steps_measured_per_layer(name: str) -> None:
    per_layer, fused = trained()[f"{name} per layer"], trained()[f"{name} fused"]
    assert_same_trajectory(fused, per_layer)
    assert per_layer["fused_share"] == [0.0, 0.0], name
    # the first step of each plan measures (a stream's first two), the others run fused
    assert all(share >= 0.4 for share in fused["fused_share"]), (name, fused)
    if CONFIGS[name][0] not in STREAMS:  # streams are compared with their own references
        ref_losses, ref_state = reference()
        assert fused["losses"] == pytest.approx(ref_losses, abs=1e-5), name
        assert max_state_diff(fused["state"], ref_state) <= 1e-5, name
