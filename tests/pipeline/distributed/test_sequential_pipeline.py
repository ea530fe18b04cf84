"""A user's `nn.Sequential`, pipelined on 2 real processes, trains like the module itself.

The specs are made here, in the parent, and travel to the spawned stage processes as the
stage function's arguments (each factory pickles with its snapshot of the child). The
schedules are named as `torch.distributed.pipelining` names them, the stages cut where its
split points would cut; the losses and the final weights equal the user's own one-process
loop (gradient accumulation over the same micro-batches) to 1e-5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pipeline import (
    ElasticPipeline,
    LayerSpec,
    PlanOptions,
    partition_from_split_points,
    specs_from_sequential,
)
from tests.pipeline.common import (
    USER_ADAM,
    USER_MICROBATCHES,
    as_module_state,
    train_module,
    user_batches,
    user_model,
)
from tests.pipeline.distributed.common import launch_configs, max_state_diff

pytestmark = pytest.mark.multiprocess

# name: (torch's schedule name, torch's split_spec or None for the planner's partition)
CONFIGS: dict[str, tuple[str, Mapping[str, str] | None]] = {
    "1f1b planned": ("Schedule1F1B", None),
    "gpipe split": ("ScheduleGPipe", {"blocks.1": "beginning"}),
    # 2 stages per rank: 4 stages, proj | blocks.0 | blocks.1 | act norm head
    "interleaved split": (
        "ScheduleInterleaved1F1B",
        {"blocks.0": "beginning", "blocks": "end", "blocks.1": "beginning"},
    ),
}


def train(
    specs: list[LayerSpec], schedule: str, split_spec: Mapping[str, str] | None
) -> tuple[list[float], dict[str, Any]]:
    partition = "auto" if split_spec is None else partition_from_split_points(specs, split_spec)
    pipe = ElasticPipeline(
        specs,
        optimizer=USER_ADAM,
        loss_fn=F.mse_loss,
        schedule=schedule,
        n_microbatches=USER_MICROBATCHES,
        planning=PlanOptions(partition=partition),
    )
    losses = [pipe.train_step(x, y) for x, y in user_batches()]
    state = pipe.full_state_dict()
    pipe.close()
    return losses, state


def test_a_users_sequential_pipelined_trains_like_the_module_itself() -> None:
    torch.set_num_threads(1)
    specs = specs_from_sequential(user_model())
    configs = {name: (specs, *config) for name, config in CONFIGS.items()}
    results = launch_configs(train, configs, n_ranks=2)
    module = user_model()
    expected_losses = train_module(module, USER_MICROBATCHES)
    expected_state = {"module": module.state_dict()}
    for name, (losses, state) in results.items():
        assert losses == pytest.approx(expected_losses, abs=1e-5), name
        assert max_state_diff({"module": as_module_state(state)}, expected_state) <= 1e-5, name
        assert losses[-1] < losses[0], name
