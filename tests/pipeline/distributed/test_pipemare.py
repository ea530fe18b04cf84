"""PipeMare (`schedule="pipemare"`) through `pipe.train`: real processes, gloo, 1 thread each.

The weights and losses after 5 steps equal `ReferenceTrainer(pipemare=...)`, which applies
the rule `pipeline.local.asynchronous` defines (<= 1e-5), with T1 and T2 off and one update
per step (update_every = M), and also with them on and an update per micro-batch; also
across a drain (two streams: a synchronisation point, `ReferenceTrainer.drain()`) and a
repartition between two streams (`drain(new sizes)`: the layers keep weights, optimizer
state, T2's buffers and T1's counter, and follow the rule of their new stage); a failure
mid-stream raises `StageError` on every rank.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from pipeline.local.pipemare import PipeMareConfig
from tests.pipeline.distributed.common import (
    STEPS,
    launch_configs,
    max_state_diff,
    model_pipeline,
    reference_run,
)
from tests.pipeline.distributed.fault_injection import assert_stream_failures

pytestmark = pytest.mark.multiprocess

OFF = PipeMareConfig(lr_reschedule=False, correction=False, update_every=4)
ON = PipeMareConfig(warmup_updates=6, correction_decay=0.5, update_every=1)
HALF = PipeMareConfig(warmup_updates=3, update_every=2)
Split = tuple[int, list[int]] | None  # (steps of the first stream, sizes for the second)


def train(model: str, config: PipeMareConfig, sizes: list[int], split: Split) -> dict[str, Any]:
    pipe, data = model_pipeline(model, "pipemare", 4, sizes, pipemare=config)
    if split is None:
        losses = list(pipe.train(data))
    else:  # two streams, a repartition between them
        losses = list(pipe.train(data[: split[0]]))
        pipe.repartition(split[1])
        losses += list(pipe.train(data[split[0] :]))
    result = {"losses": losses, "state": pipe.full_state_dict(), "steps": pipe.step}
    pipe.close()
    return result


def configs(n_stages: int) -> dict[str, tuple[Any, ...]]:
    """name: (model, config, sizes, split)."""
    if n_stages == 2:
        return {
            "mlp off": ("mlp", OFF, [2, 3], None),
            "mlp on": ("mlp", ON, [2, 3], None),
            "transformer half": ("transformer", HALF, [1, 3], None),
            "transformer moved": ("transformer", HALF, [1, 3], (2, [3, 1])),
            "transformer two": ("transformer", HALF, [1, 3], (2, [1, 3])),
        }
    return {
        "mlp off": ("mlp", OFF, [2, 2, 1], None),
        "mlp on": ("mlp", ON, [2, 2, 1], None),
        "mlp moved": ("mlp", ON, [2, 2, 1], (3, [1, 2, 2])),
        "mlp two": ("mlp", ON, [2, 2, 1], (3, [2, 2, 1])),
        "transformer on": ("transformer", ON, [1, 2, 1], None),
    }


@functools.cache
def pipelined(n_stages: int) -> dict[str, Any]:
    return launch_configs(train, configs(n_stages), n_stages, timeout_s=90)


def reference(
    model: str, config: PipeMareConfig | None, sizes: list[int], split: Split = None
) -> tuple[list[float], dict[str, Any]]:
    """`ReferenceTrainer` applying PipeMare's rule to `sizes`, drained at `split`."""
    drain_at = None if split is None else (split[0], tuple(split[1]))
    return reference_run(model, 4, drain_at=drain_at, pipemare=config, stage_sizes=tuple(sizes))


@pytest.mark.parametrize("n_stages", [2, 3])
def test_pipemare_matches_its_reference(n_stages: int) -> None:
    torch.set_num_threads(1)
    for name, (model, config, sizes, split) in configs(n_stages).items():
        result = pipelined(n_stages)[name]
        ref_losses, ref_state = reference(model, config, sizes, split)
        what = f"{name} on {n_stages} stages"
        assert len(result["losses"]) == STEPS and result["steps"] == STEPS, what
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what


def test_the_pipemare_rule_is_not_synchronous_training() -> None:
    """The reference differs from gradient accumulation and from itself with T1/T2 off."""
    torch.set_num_threads(1)
    sync = reference("mlp", None, [2, 2, 1])[1]
    off, on = reference("mlp", OFF, [2, 2, 1])[1], reference("mlp", ON, [2, 2, 1])[1]
    assert max_state_diff(sync, off) > 1e-5 and max_state_diff(off, on) > 1e-5


@pytest.mark.parametrize(
    "n_stages,a,b", [(2, "transformer moved", "transformer two"), (3, "mlp moved", "mlp two")]
)
def test_repartition_between_pipemare_streams_keeps_the_rule(n_stages: int, a: str, b: str) -> None:
    """Under PipeMare a layer's staleness is its stage's, so a move changes the trajectory by
    definition; what must hold is the rule with the new partition from the move on, with
    weights, optimizer state, T2's buffers and T1's counter carried (the reference test
    checks "moved" against `ReferenceTrainer.drain(new sizes)`), and the drain alone is a
    synchronisation point ("two"). Here: the move is not a no-op (the test has teeth)."""
    torch.set_num_threads(1)
    model, config, sizes, split = configs(n_stages)[a]
    moved, ref_state = pipelined(n_stages)[a], reference(model, config, sizes, split)[1]
    assert max_state_diff(moved["state"], ref_state) <= 1e-5
    assert max_state_diff(moved["state"], pipelined(n_stages)[b]["state"]) > 1e-5


@pytest.mark.parametrize("n_stages", [2, 3])
def test_a_failure_mid_pipemare_stream_raises_on_every_rank(n_stages: int) -> None:
    cases = [(n_stages - 1, "forward", 2, 1), (0, "backward", 1, 3), (n_stages - 1, "loss", 3, 0)]
    assert_stream_failures("pipemare", cases, n_stages)
