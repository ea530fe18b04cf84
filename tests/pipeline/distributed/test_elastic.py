"""Pipelined training equals single-process training: real processes, gloo, 1 thread each.

The contract every schedule signs (`test_every_registered_schedule_matches_its_reference`):
each schedule of the registry (`pipeline.pure.schedule.SCHEDULES`, read when the tests are
collected, so a newly registered schedule is checked without editing this file) trains the
mixed model (a two-tensor carry, Linear and Transformer layers) through `pipe.train`, cut
evenly into the schedule's stages, and equals `ReferenceTrainer` applying the rule its spec
declares (`reference_options`: synchronous training, 2BW's rule for a stream that keeps two
weight copies, PipeMare's for an asynchronous one). The modules of single schedules
(test_zero_bubble, test_placement, test_two_bw, test_pipemare) cover what is theirs: other
micro-batch counts, recomputed layers, repartitions, failures mid-stream.

Each launch runs several configurations in the same stage processes (one process group,
one start-up cost) and returns their losses and full state dicts; the assertions compare
them with `ReferenceTrainer`, which trains the same specs in this process.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import pipeline
from pipeline import Action, Op, ScheduleSpec, StageContext
from pipeline.local.models import transformer_stack
from pipeline.local.pipemare import PipeMareConfig
from pipeline.local.reference import ReferenceTrainer
from pipeline.pure.schedule import SCHEDULES, get_schedule, placement_of
from tests.pipeline.distributed.common import (
    ADAM,
    MICROBATCHES,
    STEPS,
    assert_same_trajectory,
    batches,
    max_state_diff,
    mixed_stack,
    model_pipeline,
    reference_run,
)

pytestmark = pytest.mark.multiprocess

CONTRACT_RANKS = 2  # the contract runs on 2 ranks (4 stages under 2 stages per rank)


def _eager_1f1b(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """A user's schedule, from a spec outside the package: 1F1B with one more warm-up forward
    on every stage (more in flight; backwards still in micro-batch order, so exact)."""
    warmup = min(n_stages - stage, n_microbatches)
    actions = [Action(Op.FORWARD, i, stage) for i in range(warmup)]
    for i in range(n_microbatches):
        if warmup + i < n_microbatches:
            actions.append(Action(Op.FORWARD, warmup + i, stage))
        actions.append(Action(Op.BACKWARD, i, stage))
    return [*actions, Action(Op.OPTIMIZER_STEP)]


EAGER_1F1B = ScheduleSpec("eager_1f1b", _eager_1f1b)


def train(model: str, schedule: str | ScheduleSpec, partition: Any) -> dict[str, Any]:
    pipe, data = model_pipeline(model, schedule, MICROBATCHES, partition)
    losses = [pipe.train_step(x, y) for x, y in data]
    result = {"losses": losses, "state": pipe.full_state_dict()}
    pipe.close()
    return result


def even_sizes(n_layers: int, n_stages: int) -> list[int]:
    """`n_layers` cut into `n_stages` stages as evenly as they go, the larger ones first."""
    return [n_layers // n_stages + (s < n_layers % n_stages) for s in range(n_stages)]


def train_schedule(name: str) -> dict[str, Any]:
    """The contract's run of schedule `name`: the mixed model cut evenly into the stages the
    schedule places on `CONTRACT_RANKS` ranks (no profile to pay for), through `pipe.train`
    (a flushed schedule's steps are its `train_step`s, a stream's one stream)."""
    n_stages = placement_of(name, CONTRACT_RANKS).n_stages
    sizes = even_sizes(len(mixed_stack()), n_stages)
    pipe, data = model_pipeline("mixed", name, MICROBATCHES, sizes)
    losses = list(pipe.train(data))
    result = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "steps": pipe.step,
        "partition": tuple(pipe.stats().partition),
    }
    pipe.close()
    return result


Config = tuple[str, str | ScheduleSpec, Any]  # model, schedule, partition
CONFIGS: dict[int, list[Config]] = {
    2: [
        *[(m, s, "auto") for m in ("transformer", "mlp") for s in ("gpipe", "1f1b")],
        ("transformer", "1f1b", [1, 3]),
        ("transformer", "1f1b", [2, 2]),
        ("tuple", "gpipe", [3, 2]),
        ("transformer", EAGER_1F1B, "auto"),
        ("tuple", EAGER_1F1B, [3, 2]),
    ],
    4: [(m, s, "auto") for m in ("transformer", "mlp") for s in ("gpipe", "1f1b", EAGER_1F1B)],
}


def run_configs(ctx: StageContext, n_stages: int) -> dict[str, dict[Any, Any]]:
    contract = sorted(SCHEDULES) if n_stages == CONTRACT_RANKS else []
    return {
        "schedules": {name: train_schedule(name) for name in contract},
        "configs": {(m, s, str(p)): train(m, s, p) for m, s, p in CONFIGS[n_stages]},
    }


@functools.cache
def pipelined(n_stages: int) -> dict[str, dict[Any, Any]]:
    results = pipeline.launch(
        functools.partial(run_configs, n_stages=n_stages),
        n_stages,
        threads_per_stage=1,
        timeout_s=60,
    )
    assert all(r["configs"].keys() == results[0]["configs"].keys() for r in results)
    return results[0]  # every rank returns the same losses; rank 0 holds the state


def reference_options(spec: ScheduleSpec, partition: tuple[int, ...]) -> dict[str, Any]:
    """The rule `ReferenceTrainer` applies for `spec`, read off its facts: synchronous
    training, unless it is asynchronous (PipeMare's rule, with the pipeline's default
    config, per stage of `partition`) or a stream keeping two weight copies (2BW's)."""
    if spec.asynchronous:
        return {"pipemare": PipeMareConfig(), "stage_sizes": partition}
    if spec.stream and spec.weight_copies == 2:
        return {"pipedream_2bw": True}
    if spec.stream or spec.weight_copies != 1:
        pytest.fail(
            f"schedule {spec.name!r} (stream={spec.stream}, weight_copies="
            f"{spec.weight_copies}): ReferenceTrainer has no rule for it; add one here"
        )
    return {}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_registered_schedule_matches_its_reference(name: str) -> None:
    torch.set_num_threads(1)
    result = pipelined(CONTRACT_RANKS)["schedules"][name]
    options = reference_options(get_schedule(name), result["partition"])
    ref_losses, ref_state = reference_run("mixed", MICROBATCHES, **options)
    what = f"{name} on {CONTRACT_RANKS} ranks, stages {result['partition']}"
    assert len(result["losses"]) == STEPS and result["steps"] == STEPS, what
    assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
    assert max_state_diff(result["state"], ref_state) <= 1e-5, what
    # training did something: the weights moved away from their initial values
    assert result["losses"][-1] != result["losses"][0], what


@pytest.mark.parametrize("n_stages", [2, 4])
def test_pipeline_matches_single_process(n_stages: int) -> None:
    torch.set_num_threads(1)
    for (model, schedule, partition), result in pipelined(n_stages)["configs"].items():
        ref_losses, ref_state = reference_run(model)
        what = f"{model} {schedule} {partition} on {n_stages} stages"
        assert result["losses"] == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(result["state"], ref_state) <= 1e-5, what
        assert result["losses"][-1] != result["losses"][0], what


def test_partition_changes_nothing() -> None:
    results = pipelined(2)["configs"]
    a = results[("transformer", "1f1b", "[2, 2]")]
    b = results[("transformer", "1f1b", "[1, 3]")]
    assert_same_trajectory(a, b)


def test_dropout_is_active() -> None:
    """The reference with dropout differs from the same model without: masks are applied."""
    torch.set_num_threads(1)
    x, y = batches("seq")[0]
    losses = []
    for p in (0.1, 0.0):
        ref = ReferenceTrainer(
            transformer_stack(4, 16, 2, dropout=p),
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            n_microbatches=MICROBATCHES,
            seed=3,
        )
        losses.append(ref.train_step(x, y))
    assert losses[0] != losses[1]
