"""ZB-H1 trains exactly like one process: real processes, gloo, 1 thread each.

One launch per stage count runs every configuration in the same stage processes: several
models and micro-batch counts, recomputed layers, a repartition and a change of memory
actions mid-training. Losses and full state dicts are compared with `ReferenceTrainer`
(<= 1e-5 after 5 steps) and with the same run without the repartition (<= 1e-6). The
contract every schedule signs (the mixed model, a two-tensor carry) is `test_elastic`'s.
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
    recomputing,
    reference_run,
    timeline_spans,
)

pytestmark = pytest.mark.multiprocess

Moves = dict[int, tuple[list[int], list[str] | None]]  # step -> (sizes, memory actions)


def train(model: str, m: int, partition: Any, moves: Moves) -> dict[str, Any]:
    pipe, data = model_pipeline(model, "zbh1", m, partition)
    losses = []
    for step, (x, y) in enumerate(data):
        if step in moves:
            pipe.repartition(*moves[step])
        losses.append(pipe.train_step(x, y))
    spans = timeline_spans(pipe)
    result = {"losses": losses, "state": pipe.full_state_dict(), "spans": spans}
    pipe.close()
    return result


def configs(n_stages: int) -> dict[str, tuple[str, int, Any, Moves]]:
    """name: (model, micro-batches, partition, repartitions)."""
    if n_stages == 2:
        return {
            "transformer M=2": ("transformer", 2, "auto", {}),
            "transformer M=4": ("transformer", 4, [1, 3], {}),
            "transformer M=8": ("transformer", 8, "auto", {}),
            "mlp recompute M=4": ("mlp", 4, recomputing([3, 2], "zbh1", 4), {}),
            "transformer moved M=4": ("transformer", 4, [1, 3], {2: ([3, 1], None)}),
        }
    return {
        "transformer M=4": ("transformer", 4, "auto", {}),
        "mlp M=2": ("mlp", 2, [2, 2, 1], {}),
        "mlp M=8": ("mlp", 8, [1, 3, 1], {}),
        "mlp recompute M=4": ("mlp", 4, recomputing([2, 2, 1], "zbh1", 4), {}),
        "mlp static M=4": ("mlp", 4, [2, 2, 1], {}),
        "mlp moved M=4": (
            "mlp",
            4,
            [2, 2, 1],
            {2: ([1, 2, 2], None), 3: ([3, 1, 1], ["recompute"] * 5)},
        ),
    }


@functools.cache
def pipelined(n_stages: int) -> dict[str, Any]:
    return launch_configs(train, configs(n_stages), n_stages, timeout_s=60)


@pytest.mark.parametrize("n_stages", [2, 3])
def test_zbh1_matches_single_process(n_stages: int) -> None:
    torch.set_num_threads(1)
    for name, (model, m, _, _) in configs(n_stages).items():
        result, (ref_losses, ref_state) = pipelined(n_stages)[name], reference_run(model, m)
        what = f"{name} on {n_stages} stages"
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what
        assert result["losses"][-1] != result["losses"][0], what


@pytest.mark.parametrize(
    "n_stages,moved,static",
    [(2, "transformer moved M=4", "transformer M=4"), (3, "mlp moved M=4", "mlp static M=4")],
)
def test_repartition_under_zbh1_keeps_the_trajectory(
    n_stages: int, moved: str, static: str
) -> None:
    assert_same_trajectory(pipelined(n_stages)[moved], pipelined(n_stages)[static])


def test_the_timeline_shows_input_and_weight_backwards() -> None:
    spans = pipelined(3)["mlp M=8"]["spans"]
    for stage in range(3):
        names = {name: cat for tid, name, cat in spans if tid == stage}
        for i in range(8):
            assert names[f"F{i}"] == "forward"
            if stage == 0:  # it sends no gradient: its backwards are whole
                assert names[f"B{i}"] == "backward"
            else:
                assert names[f"BI{i}"] == "backward" and names[f"W{i}"] == "weight"
        whole = [name for name in names if name.startswith("B") and name[1:].isdigit()]
        assert (stage == 0) == bool(whole) and not (stage == 0 and "W0" in names)
