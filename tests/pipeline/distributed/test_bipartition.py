"""Bi-Partition trains exactly like one process: real processes, gloo, 1 thread each.

One launch per stage count runs every configuration in the same stage processes: handed
backwards under GPipe, 1F1B and ZB-H1, a stage that both receives and hands on, the cut
moved by repartitions, the planner's own choice, a failure inside a handed backward, and
the refusals. Losses and full state dicts are compared with `ReferenceTrainer` (<= 1e-5
after 5 steps) and with the same run without the repartitions (<= 1e-6).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext, StageError
from pipeline.local.models import MLPBlock
from pipeline.local.reference import ReferenceTrainer
from tests.pipeline.distributed.common import (
    ADAM,
    SEED,
    STEPS,
    assert_same_trajectory,
    batches,
    max_state_diff,
)

pytestmark = pytest.mark.multiprocess


class Brittle(nn.Linear):
    """A Linear whose handed backward fails on large inputs (registered in the stage
    processes only, by `failing`: the contract test holds every registered type to autograd)."""


def _brittle_backward(
    module: nn.Module, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    assert isinstance(module, nn.Linear)
    if x.abs().max() > 1e3:
        raise RuntimeError("brittle backward: input too large")
    g2 = g.reshape(-1, g.shape[-1])
    grads = {"weight": g2.t().mm(x.reshape(-1, x.shape[-1])), "bias": g2.sum(0)}
    return g.matmul(module.weight), grads


class Twice(nn.Linear):
    """A registered type that breaks the rule: it returns two tensors."""

    def forward(self, x: torch.Tensor) -> Any:
        y = super().forward(x)
        return y, y


def specs(brittle: bool = False, twice: bool = False) -> list[LayerSpec]:
    """in b0 p0 p1 | b1 p2 | head: Linear layers (p*) where stages can cut backwards."""
    p1 = Brittle if brittle else Twice if twice else nn.Linear
    return [
        LayerSpec("in", functools.partial(nn.Linear, 12, 32)),
        LayerSpec("b0", functools.partial(MLPBlock, 32, 32, 0.1, False)),
        LayerSpec("p0", functools.partial(nn.Linear, 32, 24)),
        LayerSpec("p1", functools.partial(p1, 24, 32)),
        LayerSpec("b1", functools.partial(MLPBlock, 32, 16, 0.1, False)),
        LayerSpec("p2", functools.partial(nn.Linear, 16, 16)),
        LayerSpec("head", functools.partial(nn.Linear, 16, 5)),
    ]


WIDE = 1024


def wide() -> list[LayerSpec]:
    """Three big Linear layers between two small ones: whole layers cannot balance them
    (wide enough that compute, not the link's latency, decides the plan)."""
    return [
        LayerSpec("in", functools.partial(nn.Linear, 12, WIDE)),
        *[LayerSpec(f"h{i}", functools.partial(nn.Linear, WIDE, WIDE)) for i in range(3)],
        LayerSpec("head", functools.partial(nn.Linear, WIDE, 5)),
    ]


def activated() -> list[LayerSpec]:
    """Linear layers with their activations as layers of their own: a cut hands on both."""
    return [
        LayerSpec("in", functools.partial(nn.Linear, 12, 32)),
        LayerSpec("a0", nn.GELU),
        LayerSpec("p", functools.partial(nn.Linear, 32, 32)),
        LayerSpec("a1", nn.SiLU),
        LayerSpec("head", functools.partial(nn.Linear, 32, 5)),
    ]


Moves = dict[int, tuple[list[int], list[int]]]  # step -> (sizes, handoff)
CONFIGS: dict[int, dict[str, tuple[str, Any, Any, Moves]]] = {
    # name: (schedule, partition, handoff, repartitions)
    2: {
        "1f1b": ("1f1b", [4, 3], [2], {}),
        "gpipe": ("gpipe", [4, 3], [1], {}),
        "zbh1": ("zbh1", [4, 3], [2], {}),
        "1f1b moved": ("1f1b", [4, 3], [2], {2: ([3, 4], [1]), 3: ([5, 2], [0]), 4: ([4, 3], [2])}),
        "1f1b edited": ("1f1b", [4, 3], [2], {}),
    },
    3: {
        "1f1b": ("1f1b", [4, 2, 1], [2, 1], {}),
        "zbh1": ("zbh1", [3, 3, 1], [1, 1], {}),
        "zbh1 moved": ("zbh1", [3, 3, 1], [1, 1], {1: ([4, 2, 1], [2, 1]), 3: ([3, 3, 1], [1, 1])}),
    },
}


EDIT_AT = 2


def edit_weights(layers: Any) -> None:
    """The user changes a handed layer's weights between two steps."""
    if "p1" in layers:
        with torch.no_grad():
            layers["p1"].weight.mul_(0.5)


def flat_pipeline(
    layers: list[LayerSpec], schedule: str = "1f1b", **planning: Any
) -> ElasticPipeline:
    """`layers` pipelined on the flat batches' cross entropy, seeded as `reference` trains
    them (`planning`: `PlanOptions`' fields)."""
    return ElasticPipeline(
        layers,
        optimizer=ADAM,
        loss_fn=F.cross_entropy,
        schedule=schedule,
        n_microbatches=4,
        seed=SEED,
        planning=PlanOptions(**planning),
    )


def train(
    schedule: str, partition: Any, handoff: Any, moves: Moves, edit: bool = False
) -> dict[str, Any]:
    pipe = flat_pipeline(specs(), schedule, partition=partition, handoff=handoff)
    losses, cuts = [], [pipe.handoff]
    for step, (x, y) in enumerate(batches("flat")):
        if step in moves:
            pipe.repartition(moves[step][0], handoff=moves[step][1])
            cuts.append(pipe.handoff)
        if edit and step == EDIT_AT:
            edit_weights(pipe.layers)  # only this rank's layers: the owner of p1 edits it
        losses.append(pipe.train_step(x, y))
    result = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "cuts": cuts,
        "output": pipe.forward(batches("flat")[0][0]),
    }
    pipe.close()
    return result


def with_activations() -> dict[str, Any]:
    """Stage 0 = in a0 p a1, handing p and a1 (a Linear and its activation) under zbh1."""
    pipe = flat_pipeline(activated(), "zbh1", partition=[4, 1], handoff=[2])
    losses = [pipe.train_step(x, y) for x, y in batches("flat")]
    result = {"losses": losses, "state": pipe.full_state_dict(), "handoff": pipe.handoff}
    pipe.close()
    return result


def planned() -> dict[str, Any]:
    """planner="bipartition" on the estimate profile (FLOPs: deterministic costs), then a
    re-plan from measured costs mid-training (whatever it decides, training stays exact)."""
    pipe = flat_pipeline(wide(), planner="bipartition", profile="estimate")
    losses, first = [], None
    for step, (x, y) in enumerate(batches("flat")):
        if step == 3:
            assert pipe.plan is not None
            first = (pipe.handoff, pipe.sizes, pipe.plan.to_dict())
            pipe.rebalance(remaining_steps=10**6)
        losses.append(pipe.train_step(x, y))
    assert first is not None and pipe.plan is not None
    result = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "handoff": first[0],
        "sizes": first[1],
        "plan": first[2],
        "after_replan": (pipe.handoff, pipe.plan.handoff or (0,)),
    }
    pipe.close()
    return result


def failing() -> dict[str, Any]:
    """Step 2's batch is huge: the handed backward of p1 raises on the stage after its own."""
    pipeline.separable(Brittle)(_brittle_backward)
    pipe = flat_pipeline(specs(brittle=True), partition=[4, 3], handoff=[1])
    losses, errors = [], []
    for step, (x, y) in enumerate(batches("flat")):
        try:
            losses.append(pipe.train_step(x * 1e6 if step == 2 else x, y))
        except StageError as error:
            errors.append((error.stage, error.phase, error.layer, error.step, str(error)))
    result = {"losses": losses, "errors": errors, "state": pipe.full_state_dict()}
    pipe.close()
    return result


def refusals() -> dict[str, str]:
    bad: dict[str, tuple[str, dict[str, Any]]] = {  # name: (schedule, planning)
        "auto": ("1f1b", dict(partition="auto", handoff=[1])),
        "not separable": ("1f1b", dict(partition=[4, 3], handoff=[3])),
        "too many": ("1f1b", dict(partition=[4, 3], handoff=[4])),
        "stream": ("2bw", dict(partition=[4, 3], handoff=[1])),
    }
    out = {}
    pipeline.separable(Twice)(_brittle_backward)
    pipe = flat_pipeline(specs(twice=True), partition=[4, 3], handoff=[1])
    try:
        pipe.train_step(*batches("flat")[0])
        out["two outputs"] = "accepted"
    except StageError as error:
        out["two outputs"] = f"{error.stage} {error.phase} {error.layer}: {error}"
    pipe.close()
    for name, (schedule, planning) in bad.items():
        try:  # "auto" is refused by PlanOptions itself, before any process talks
            flat_pipeline(specs(), schedule, **planning).close()
            out[name] = "accepted"
        except ValueError as error:
            out[name] = str(error)
    return out


def run_all(ctx: StageContext, n_stages: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        name: train(*c, edit="edited" in name) for name, c in CONFIGS[n_stages].items()
    }
    if n_stages == 2:
        out.update(
            planned=planned(),
            failing=failing(),
            refusals=refusals(),
            activations=with_activations(),
        )
    return out


@functools.cache
def pipelined(n_stages: int) -> dict[str, Any]:
    results = pipeline.launch(
        functools.partial(run_all, n_stages=n_stages), n_stages, threads_per_stage=1, timeout_s=90
    )
    return results[0]  # rank 0 holds the full state; every rank the losses


def reference(
    make: Any, skip: int | None = None, edit: bool = False
) -> tuple[list[float], dict[str, Any], Any]:
    ref = ReferenceTrainer(
        make(), optimizer=ADAM, loss_fn=F.cross_entropy, n_microbatches=4, seed=SEED
    )
    losses = []
    for step, (x, y) in enumerate(batches("flat")):
        if edit and step == EDIT_AT:
            edit_weights({s.key: layer for s, layer in zip(ref.specs, ref.layers, strict=True)})
        if step != skip:
            losses.append(ref.train_step(x, y))
    with torch.no_grad():
        for layer in ref.layers:
            layer.eval()
        out = batches("flat")[0][0]
        for layer in ref.layers:
            out = layer(out)
    return losses, ref.full_state_dict(), out


@pytest.mark.parametrize("n_stages", [2, 3])
def test_bipartition_matches_single_process(n_stages: int) -> None:
    torch.set_num_threads(1)
    for name in CONFIGS[n_stages]:
        ref_losses, ref_state, ref_out = reference(specs, edit="edited" in name)
        result, what = pipelined(n_stages)[name], f"{name} on {n_stages} stages"
        assert result["cuts"][0] == tuple(CONFIGS[n_stages][name][2]), what
        assert len(result["losses"]) == STEPS
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what
        torch.testing.assert_close(result["output"], ref_out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "n_stages,moved,static", [(2, "1f1b moved", "1f1b"), (3, "zbh1 moved", "zbh1")]
)
def test_moving_the_cut_keeps_the_trajectory(n_stages: int, moved: str, static: str) -> None:
    a, b = pipelined(n_stages)[moved], pipelined(n_stages)[static]
    expected = [tuple(CONFIGS[n_stages][moved][2])]
    expected += [tuple(h) for _, h in sorted(CONFIGS[n_stages][moved][3].values())]
    assert sorted(a["cuts"]) == sorted(expected)
    assert_same_trajectory(a, b)


def test_a_cut_hands_on_a_linear_with_its_activation() -> None:
    result = pipelined(2)["activations"]
    ref_losses, ref_state, _ = reference(activated)
    assert result["handoff"] == (2,)
    assert result["losses"] == pytest.approx(ref_losses, abs=1e-5)
    assert max_state_diff(result["state"], ref_state) <= 1e-5


def test_the_planner_chooses_a_cut_that_trains_exactly() -> None:
    result = pipelined(2)["planned"]
    assert any(result["handoff"]) and result["plan"]["handoff"] == list(result["handoff"])
    in_force, planned = result["after_replan"]
    assert in_force == planned  # the re-plan's cut (or none) is the one in force
    ref_losses, ref_state, _ = reference(wide)
    assert result["losses"] == pytest.approx(ref_losses, abs=1e-5)
    assert max_state_diff(result["state"], ref_state) <= 1e-5


def test_a_failed_handed_backward_raises_everywhere_and_training_goes_on() -> None:
    result = pipelined(2)["failing"]
    assert len(result["errors"]) == 1
    stage, phase, layer, step, text = result["errors"][0]
    assert (stage, phase, layer, step) == (1, "backward", "p1", 2), text
    assert "brittle backward" in text
    ref_losses, ref_state, _ = reference(lambda: specs(brittle=True), skip=2)
    assert result["losses"] == pytest.approx(ref_losses, abs=1e-5)
    assert max_state_diff(result["state"], ref_state) <= 1e-5


def test_bad_cuts_are_refused_with_the_value_and_what_is_valid() -> None:
    errors = pipelined(2)["refusals"]
    assert "needs explicit stage sizes" in errors["auto"]
    assert "'b0' (MLPBlock) cannot" in errors["not separable"]
    assert "handoff[0]=4 is not valid" in errors["too many"] and "0..3" in errors["too many"]
    assert "needs a flushed schedule" in errors["stream"]
    assert errors["two outputs"].startswith("0 forward p1: ")
    assert "its output must be one floating-point tensor" in errors["two outputs"]
