"""PipeDream-2BW and `train` streams: real processes, gloo, 1 thread each.

One launch per stage count runs every configuration in the same stage processes. Under
"2bw", the weights after 5 steps of `pipe.train(...)` equal `ReferenceTrainer` applying the
2BW rule (<= 1e-5); a repartition between two streams (and a stream split in two) keeps
the trajectory of one stream (<= 1e-6); `train` under 1f1b equals `train_step`. A failure
mid-stream raises `StageError` on every rank, from the generator, and the pipeline trains
on after it: the steps before the failing one stand.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tests.pipeline.distributed.common import (
    STEPS,
    assert_same_trajectory,
    launch_configs,
    max_state_diff,
    model_pipeline,
    reference_run,
)
from tests.pipeline.distributed.fault_injection import assert_stream_failures

pytestmark = pytest.mark.multiprocess

Split = tuple[int, list[int] | None] | None  # (steps before the break, new sizes or None)


def train(
    model: str, schedule: str, m: int, partition: Any, split: Split, stepwise: bool = False
) -> dict[str, Any]:
    pipe, data = model_pipeline(model, schedule, m, partition)
    if stepwise:
        losses = [pipe.train_step(x, y) for x, y in data]
    elif split is None:
        losses = list(pipe.train(data))
    elif split[1] is None:  # a stream left open, drained by a train_step-less call
        stream = pipe.train(data)
        losses = [next(stream) for _ in range(split[0])]
        pipe.full_state_dict()  # drains: the steps already pulled finish, losses kept
        losses += list(stream)  # ... and come out here, then a new segment goes on
    else:  # two streams, a repartition between them
        losses = list(pipe.train(data[: split[0]]))
        pipe.repartition(split[1])
        losses += list(pipe.train(data[split[0] :]))
    memory = [(s.activation_peak_bytes, s.state_bytes, s.param_bytes) for s in pipe.stats().stages]
    result = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "steps": pipe.step,
        "memory": memory,
    }
    pipe.close()
    return result


def configs(n_stages: int) -> dict[str, tuple[Any, ...]]:
    """name: (model, schedule, micro-batches, partition, split[, stepwise])."""
    if n_stages == 2:
        return {
            "transformer M=4": ("transformer", "2bw", 4, "auto", None),
            "mlp M=1": ("mlp", "2bw", 1, [2, 3], None),
            "transformer split": ("transformer", "2bw", 4, "auto", (2, None)),
            "transformer moved": ("transformer", "2bw", 4, [1, 3], (2, [3, 1])),
            "transformer static": ("transformer", "2bw", 4, [1, 3], None),
            "1f1b train": ("mlp", "1f1b", 4, [2, 3], None),
            "mlp M=4": ("mlp", "2bw", 4, [2, 3], None),
            "1f1b train_step": ("mlp", "1f1b", 4, [2, 3], None, True),
        }
    return {
        "mlp M=2": ("mlp", "2bw", 2, [2, 2, 1], None),
        "mlp M=4": ("mlp", "2bw", 4, "auto", None),
        "mlp moved": ("mlp", "2bw", 4, [2, 2, 1], (3, [1, 2, 2])),
        "mlp static": ("mlp", "2bw", 4, [2, 2, 1], None),
    }


@functools.cache
def pipelined(n_stages: int) -> dict[str, Any]:
    return launch_configs(train, configs(n_stages), n_stages, timeout_s=60)


def reference(model: str, m: int) -> tuple[list[float], dict[str, Any]]:
    """`ReferenceTrainer` applying the 2BW rule."""
    return reference_run(model, m, pipedream_2bw=True)


@pytest.mark.parametrize("n_stages", [2, 3])
def test_2bw_matches_the_2bw_reference(n_stages: int) -> None:
    torch.set_num_threads(1)
    for name, (model, schedule, m, *_) in configs(n_stages).items():
        if schedule != "2bw":
            continue
        result, (ref_losses, ref_state) = pipelined(n_stages)[name], reference(model, m)
        what = f"{name} on {n_stages} stages"
        assert len(result["losses"]) == STEPS and result["steps"] == STEPS, what
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what


def test_2bw_is_not_synchronous_training() -> None:
    """The reference rule differs from plain gradient accumulation (the test has teeth)."""
    sync = reference_run("transformer", 4)[1]
    assert max_state_diff(sync, reference("transformer", 4)[1]) > 1e-5


@pytest.mark.parametrize(
    "n_stages,a,b",
    [
        (2, "transformer moved", "transformer static"),
        (2, "transformer split", "transformer M=4"),
        (3, "mlp moved", "mlp static"),
    ],
)
def test_repartition_between_2bw_streams_keeps_the_trajectory(
    n_stages: int, a: str, b: str
) -> None:
    assert_same_trajectory(pipelined(n_stages)[a], pipelined(n_stages)[b])


def test_streams_measure_their_memory() -> None:
    """2BW keeps 1F1B's micro-batches in flight, and a second copy of the weights."""
    for (two_bw, state, params), (flush, flush_state, _) in zip(
        pipelined(2)["mlp M=4"]["memory"], pipelined(2)["1f1b train"]["memory"], strict=True
    ):
        assert two_bw > 0 and abs(two_bw - flush) <= 0.25 * flush, (two_bw, flush)
        assert state == flush_state + params


def test_train_under_1f1b_equals_train_step() -> None:
    one, other = pipelined(2)["1f1b train"], pipelined(2)["1f1b train_step"]
    assert one["losses"] == other["losses"]
    assert max_state_diff(one["state"], other["state"]) == 0.0


@pytest.mark.parametrize("n_stages", [2, 3])
def test_a_failure_mid_stream_raises_on_every_rank(n_stages: int) -> None:
    cases = [
        (n_stages - 1, "forward", 2, 1),
        (0, "backward", 1, 3),
        (n_stages - 1, "loss", 3, 0),
        (0, "optimizer", 2, -1),
    ]
    assert_stream_failures("2bw", cases, n_stages)
