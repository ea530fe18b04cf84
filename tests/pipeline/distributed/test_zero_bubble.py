"""ZB-H1 trains exactly like one process: real processes, gloo, 1 thread each.

One launch per stage count runs every configuration in the same stage processes: several
models and micro-batch counts, recomputed layers, a repartition and a change of memory
actions mid-training. Losses and full state dicts are compared with `ReferenceTrainer`
(<= 1e-5 after 5 steps) and with the same run without the repartition (<= 1e-6).
"""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline import ElasticPipeline, Plan, PlanOptions
from pipeline.local.reference import ReferenceTrainer
from tests.pipeline.distributed.common import launch_configs
from tests.pipeline.distributed.test_elastic import ADAM, MODELS, STEPS, batches, max_state_diff

pytestmark = pytest.mark.multiprocess

Moves = dict[int, tuple[list[int], list[str] | None]]  # step -> (sizes, memory actions)


def train(model: str, m: int, partition: Any, moves: Moves) -> dict[str, Any]:
    make_specs, kind, loss_fn = MODELS[model]
    pipe = ElasticPipeline(
        make_specs(),
        optimizer=ADAM,
        loss_fn=loss_fn,
        schedule="zbh1",
        n_microbatches=m,
        seed=3,
        planning=PlanOptions(partition=partition),
    )
    losses = []
    for step, (x, y) in enumerate(batches(kind)):
        if step in moves:
            pipe.repartition(*moves[step])
        losses.append(pipe.train_step(x, y))
    with tempfile.TemporaryDirectory() as tmp:
        trace = pipe.save_timeline(Path(tmp) / "t.json")
        spans = (
            [
                (e["tid"], e["name"], e["cat"])
                for e in json.loads(trace.read_text())["traceEvents"]
                if e["ph"] == "X"
            ]
            if trace
            else []
        )
    result = {"losses": losses, "state": pipe.full_state_dict(), "spans": spans}
    pipe.close()
    return result


def recomputing(n_layers: int, sizes: list[int], m: int) -> Plan:
    actions = tuple("recompute" if i % 2 == 0 else "keep" for i in range(n_layers))
    return Plan(tuple(sizes), actions, "zbh1", m, 0.0, (0.0,) * len(sizes), (0,) * len(sizes))


def configs(n_stages: int) -> dict[str, tuple[str, int, Any, Moves]]:
    """name: (model, micro-batches, partition, repartitions)."""
    if n_stages == 2:
        return {
            "transformer M=2": ("transformer", 2, "auto", {}),
            "transformer M=4": ("transformer", 4, [1, 3], {}),
            "transformer M=8": ("transformer", 8, "auto", {}),
            "tuple M=4": ("tuple", 4, [3, 2], {}),
            "mlp recompute M=4": ("mlp", 4, recomputing(5, [3, 2], 4), {}),
            "transformer moved M=4": ("transformer", 4, [1, 3], {2: ([3, 1], None)}),
        }
    return {
        "transformer M=4": ("transformer", 4, "auto", {}),
        "mlp M=2": ("mlp", 2, [2, 2, 1], {}),
        "mlp M=8": ("mlp", 8, [1, 3, 1], {}),
        "mlp recompute M=4": ("mlp", 4, recomputing(5, [2, 2, 1], 4), {}),
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


@functools.cache
def reference(model: str, m: int) -> tuple[list[float], dict[str, Any]]:
    make_specs, kind, loss_fn = MODELS[model]
    ref = ReferenceTrainer(make_specs(), optimizer=ADAM, loss_fn=loss_fn, n_microbatches=m, seed=3)
    return [ref.train_step(x, y) for x, y in batches(kind)], ref.full_state_dict()


@pytest.mark.parametrize("n_stages", [2, 3])
def test_zbh1_matches_single_process(n_stages: int) -> None:
    torch.set_num_threads(1)
    for name, (model, m, _, _) in configs(n_stages).items():
        result, (ref_losses, ref_state) = pipelined(n_stages)[name], reference(model, m)
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
    a, b = pipelined(n_stages)[moved], pipelined(n_stages)[static]
    assert a["losses"] == pytest.approx(b["losses"], abs=1e-6)
    assert max_state_diff(a["state"], b["state"]) <= 1e-6


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
