"""Several stages per rank train exactly like one process: interleaved 1F1B and ZB-V.

Real processes, gloo, 1 thread each, one launch per rank count running every configuration:
a stack of mixed layer types (a two-tensor carry with an int64 half, a Transformer encoder
layer, Linear layers), planned or explicit sizes over S = 2R stages, recomputed layers, and
a repartition mid-training that moves layers between ranks and between two stages of one
rank. Losses and full state dicts are compared with `ReferenceTrainer` (<= 1e-5), and the
moved run with the same run unmoved (<= 1e-6); `forward` with the reference's model. The
contract every schedule signs (the same model, cut evenly) is `test_elastic`'s.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from pipeline.local.spec import build_layer
from tests.pipeline.distributed.common import (
    SEED,
    STEPS,
    assert_same_trajectory,
    batches,
    launch_configs,
    max_state_diff,
    mixed_stack,
    model_pipeline,
    recomputing,
    reference_run,
    timeline_spans,
)

pytestmark = pytest.mark.multiprocess

# before step k: (k, sizes, memory actions) repartitions; (k, "rebalance") re-plans from the
# measured costs and migrates; (0, "reconfigure") trains another model for two steps first
# and then takes this one on the same processes
Move = tuple[int, list[int], list[str] | None] | tuple[int, str]


def configs(n_ranks: int) -> dict[str, tuple[str, int, Any, Move | None]]:
    """name: (schedule, micro-batches, partition, a repartition)."""
    if n_ranks == 2:
        return {
            "interleaved auto M=4": ("interleaved_1f1b", 4, "auto", None),
            "interleaved recompute M=8": (
                "interleaved_1f1b",
                8,
                recomputing([2, 2, 1, 2], "interleaved_1f1b", 8),
                None,
            ),
            "interleaved static M=4": ("interleaved_1f1b", 4, [2, 2, 1, 2], None),
            "interleaved moved M=4": (
                "interleaved_1f1b",
                4,
                [2, 2, 1, 2],
                (2, [1, 3, 2, 1], ["recompute"] * 7),
            ),
            "zbv auto M=4": ("zbv", 4, "auto", None),
            "zbv recompute M=2": ("zbv", 2, recomputing([1, 2, 2, 2], "zbv", 2), None),
            "zbv static M=4": ("zbv", 4, [2, 2, 1, 2], None),
            "zbv moved M=4": ("zbv", 4, [2, 2, 1, 2], (2, [3, 1, 2, 1], None)),
            "auto M=4": ("auto", 4, "auto", None),
            "interleaved rebalanced M=4": ("interleaved_1f1b", 4, [1, 1, 1, 4], (2, "rebalance")),
            "zbv reconfigured M=4": ("zbv", 4, [2, 2, 1, 2], (0, "reconfigure")),
        }
    return {
        "interleaved M=8": ("interleaved_1f1b", 8, [1, 1, 1, 2, 1, 1], None),
        "interleaved recompute M=2": (
            "interleaved_1f1b",
            2,
            recomputing([2, 1, 1, 1, 1, 1], "interleaved_1f1b", 2),
            None,
        ),
        "zbv static M=4": ("zbv", 4, [1, 1, 2, 1, 1, 1], None),
        "zbv moved M=4": ("zbv", 4, [1, 1, 2, 1, 1, 1], (3, [2, 1, 1, 1, 1, 1], None)),
    }


def train(schedule: str, m: int, partition: Any, move: Move | None) -> dict[str, Any]:
    model = "other" if move == (0, "reconfigure") else "mixed"
    pipe, data = model_pipeline(model, schedule, m, partition)
    if move == (0, "reconfigure"):
        for x, y in data[:2]:
            pipe.train_step(x, y)
        pipe.reconfigure(mixed_stack(), partition=partition)
    losses = []
    for step, (x, y) in enumerate(data):
        if move is not None and step == move[0] and move[1] == "rebalance":
            pipe.rebalance(remaining_steps=10**6)  # any faster plan pays back
        elif move is not None and step == move[0] and isinstance(move[1], list):
            pipe.repartition(*move[1:])
        losses.append(pipe.train_step(x, y))
    output = pipe.forward(batches("tokens")[0][0])
    lanes = sorted({row for row, _, _ in timeline_spans(pipe)})
    stats = pipe.stats()
    result = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "output": output,
        "lanes": lanes,
        "partition": list(stats.partition),
        "stats_layers": [list(s.layers) for s in stats.stages],
        "schedule": [e.details for e in pipe.events if e.kind == "schedule"],
        "tryouts": [e.details for e in pipe.events if e.kind == "tryout"],
        "running": pipe.schedule.name,
        "n_stages": pipe.n_stages,
        # a tryout may switch plans after the last step: the plan in force then trained none
        "trained_in_force": not any(e.kind == "switch" and e.step >= STEPS for e in pipe.events),
    }
    pipe.close()
    return result


@functools.cache
def pipelined(n_ranks: int) -> dict[str, Any]:
    return launch_configs(train, configs(n_ranks), n_ranks, timeout_s=90)


@functools.cache
def reference(m: int) -> tuple[list[float], dict[str, Any], torch.Tensor]:
    losses, state = reference_run("mixed", m)
    return losses, state, evaluated(state, batches("tokens")[0][0])


def evaluated(state: dict[str, Any], x: Any) -> torch.Tensor:
    """The trained model's output on x in eval mode, run layer by layer in one process."""
    out = x
    with torch.no_grad():
        for spec in mixed_stack():
            layer = build_layer(spec, SEED, torch.device("cpu"))
            layer.load_state_dict(state[spec.key])
            out = layer.eval()(out)
    assert isinstance(out, torch.Tensor)
    return out


@pytest.mark.parametrize("n_ranks", [2, 3])
def test_several_stages_per_rank_match_single_process(n_ranks: int) -> None:
    torch.set_num_threads(1)
    for name, (_, m, _, _) in configs(n_ranks).items():
        result, (ref_losses, ref_state, ref_output) = pipelined(n_ranks)[name], reference(m)
        what = f"{name} on {n_ranks} ranks"
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what
        assert torch.allclose(result["output"], ref_output, atol=1e-5), what
        assert result["losses"][-1] != result["losses"][0], what
        if result["trained_in_force"]:  # its last step drew a row per stage
            assert result["lanes"] == list(range(result["n_stages"])), what


@pytest.mark.parametrize(
    "n_ranks,moved,static",
    [
        (2, "interleaved moved M=4", "interleaved static M=4"),
        (2, "zbv moved M=4", "zbv static M=4"),
        (3, "zbv moved M=4", "zbv static M=4"),
    ],
)
def test_repartition_under_several_stages_per_rank_keeps_the_trajectory(
    n_ranks: int, moved: str, static: str
) -> None:
    a, b = pipelined(n_ranks)[moved], pipelined(n_ranks)[static]
    assert a["partition"] != b["partition"]
    assert_same_trajectory(a, b)


def test_stats_report_each_rank_with_all_its_stages() -> None:
    result = pipelined(2)["zbv static M=4"]  # V: rank 0 holds stages 0 and 3
    keys = [s.key for s in mixed_stack()]
    assert result["stats_layers"] == [keys[:2] + keys[5:], keys[2:5]]


def test_auto_plans_every_exact_schedule_and_runs_the_fastest_predicted() -> None:
    """The first plan is the fastest predicted; where others are predicted too close to
    rank, they are tried on the next steps (`pipeline.distributed.tryout`), so the plan in
    force is one of those, on its own stage count."""
    result = pipelined(2)["auto M=4"]
    [choice] = result["schedule"]
    tried = {c["schedule"]: c for c in choice["candidates"]}
    assert set(tried) == {"1f1b", "zbh1", "interleaved_1f1b", "zbv"}
    predicted = {
        name: c["predicted_iteration_s"]
        for name, c in tried.items()
        if c["predicted_iteration_s"] is not None
    }
    fastest = choice["chosen"]
    assert predicted[fastest] == min(predicted.values())
    contenders = [t["schedule"] for t in result["tryouts"][0]["tried"]] if result["tryouts"] else []
    assert result["running"] == fastest or result["running"] in contenders
    assert result["n_stages"] == tried[result["running"]]["n_stages"] == len(result["partition"])


def test_rebalance_under_interleaving_moves_layers_and_stays_exact() -> None:
    result = pipelined(2)["interleaved rebalanced M=4"]
    assert result["partition"] != [1, 1, 1, 4]  # the planner moved layers off stage 3
