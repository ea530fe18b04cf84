"""Live migration: repartitioning mid-training changes no loss, loses and duplicates nothing.

Every scenario trains the same model twice in the same stage processes, once with
repartitions and once without, and compares losses and full state dicts.
"""

from __future__ import annotations

import functools
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, MigrationError, PlanOptions, StageContext
from pipeline.local.models import mlp_stack, transformer_stack
from tests.pipeline.distributed.common import ADAM, max_state_diff

pytestmark = pytest.mark.multiprocess

MICROBATCHES = 4


def seq_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [
        (torch.randn(8, 5, 16, generator=g), torch.randn(8, 5, 16, generator=g)) for _ in range(n)
    ]


def flat_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(12)
    return [
        (torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)
    ]


def optimizer_state(pipe: ElasticPipeline) -> dict[str, list[dict[str, Any]]]:
    """{layer key: [state of each parameter]} gathered from every stage (test introspection)."""
    state = pipe.optimizer.state if pipe.optimizer is not None else {}
    mine = {
        key: [
            {k: v.clone() if torch.is_tensor(v) else v for k, v in state.get(p, {}).items()}
            for p in module.parameters()
        ]
        for key, module in pipe.layers.items()
    }
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    return {k: v for part in parts for k, v in part.items()}


def owned_keys(pipe: ElasticPipeline) -> list[list[str]]:
    keys: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(keys, list(pipe.layer_keys))
    return keys


def train(
    specs: list[LayerSpec],
    batches: list[Any],
    loss_fn: Any,
    start: list[int],
    plan: dict[int, list[int]],
) -> dict[str, Any]:
    """Train; before step s in `plan`, repartition to plan[s]."""
    pipe = ElasticPipeline(
        specs,
        optimizer=ADAM,
        loss_fn=loss_fn,
        n_microbatches=MICROBATCHES,
        seed=5,
        planning=PlanOptions(partition=start),
    )
    losses, records = [], []
    for step, (x, y) in enumerate(batches):
        if step in plan:
            records.append(pipe.repartition(plan[step]))
        losses.append(pipe.train_step(x, y))
    result: dict[str, Any] = {
        "losses": losses,
        "state": pipe.full_state_dict(),
        "records": records,
        "optimizer": optimizer_state(pipe),
        "owned": owned_keys(pipe),
        "events": pipe.events,
    }
    with tempfile.TemporaryDirectory() as tmp:
        result["svg"] = pipe.save_partition_picture(Path(tmp) / "p.svg").read_text()
        trace = pipe.save_timeline(Path(tmp) / "t.json")
        result["trace"] = json.loads(trace.read_text()) if trace else None
    pipe.close()
    return result


def scenarios(ctx: StageContext) -> dict[str, Any]:
    specs = transformer_stack(6, 16, 2, dropout=0.1)
    bn = mlp_stack([6, 16, 16, 16, 16, 3], dropout=0.2, batch_norm=True)
    seq, flat = seq_batches(6), flat_batches(6)
    moves = {2: [1, 1, 1, 3], 4: [2, 2, 1, 1]}  # layers 1,2 leave stage 0 for stages 1 and 2
    bn_moves = {1: [1, 1, 2, 1], 3: [1, 2, 1, 1]}
    return {
        "static": train(specs, seq, F.mse_loss, [3, 1, 1, 1], {}),
        "moved": train(specs, seq, F.mse_loss, [3, 1, 1, 1], moves),
        "bn_static": train(bn, flat, F.cross_entropy, [2, 1, 1, 1], {}),
        "bn_moved": train(bn, flat, F.cross_entropy, [2, 1, 1, 1], bn_moves),
    }


@functools.cache
def results() -> dict[str, Any]:
    return pipeline.launch(scenarios, 4, threads_per_stage=1, timeout_s=60)[0]


@pytest.mark.parametrize("name", ["moved", "bn_moved"])
def test_repartition_changes_no_loss_and_no_state(name: str) -> None:
    r, static = results()[name], results()[name.replace("moved", "static")]
    assert r["losses"] == pytest.approx(static["losses"], abs=1e-6)
    assert max_state_diff(r["state"], static["state"]) <= 1e-6
    for key, states in r["optimizer"].items():  # Adam moments and step counts came along
        for mine, ref in zip(states, static["optimizer"][key], strict=True):
            assert float(mine["step"]) == float(ref["step"])
            assert torch.allclose(mine["exp_avg"], ref["exp_avg"], atol=1e-7)


def test_buffers_travel_exactly() -> None:
    moved, static = results()["bn_moved"]["state"], results()["bn_static"]["state"]
    for key in moved:
        for name in ("norm.running_mean", "norm.running_var", "norm.num_batches_tracked"):
            if name in moved[key]:
                assert torch.equal(moved[key][name], static[key][name]), (key, name)


def test_migration_records() -> None:
    records = results()["moved"]["records"]
    assert [r.version for r in records] == [1, 2]
    first = records[0]
    assert first.old_sizes == (3, 1, 1, 1) and first.new_sizes == (1, 1, 1, 3)
    assert ("block2", 0, 2) in first.moved  # two stages away in one move
    # bytes = parameters + Adam's two moments + step counters + buffers of the moved layers
    state = results()["moved"]["state"]
    expected = 0
    for key, _, _ in first.moved:
        params = [v for k, v in state[key].items()]
        expected += sum(3 * v.numel() * v.element_size() + 4 for v in params)
    assert first.bytes_moved == expected
    assert first.pause_s > 0
    owned = results()["moved"]["owned"]
    assert owned == [["block0", "block1"], ["block2", "block3"], ["block4"], ["block5"]]


def test_event_log_and_pictures() -> None:
    r = results()["moved"]
    kinds = [(e.kind, e.step) for e in r["events"]]
    assert kinds == [("build", 0), ("migration", 2), ("migration", 4)]
    assert r["events"][1].details["new_sizes"] == (1, 1, 1, 3)
    assert "(2 changes)" in r["svg"] and "block5: stage 3, steps 2-3" in r["svg"]
    names = {(e["tid"], e["name"]) for e in r["trace"]["traceEvents"] if e["ph"] == "X"}
    for stage in range(4):  # every stage ran every micro-batch's forward and backward
        assert {(stage, f"{d}{i}") for d in "FB" for i in range(MICROBATCHES)} <= names


# -- random sequences: every layer owned exactly once, every state intact --------------------
def random_walk(ctx: StageContext, seed: int) -> list[str]:
    rng = random.Random(seed)
    specs = mlp_stack([6, 12, 12, 12, 12, 12, 12, 3], dropout=0.1, batch_norm=True)
    pipe = ElasticPipeline(specs, optimizer=ADAM, loss_fn=F.cross_entropy, n_microbatches=2, seed=1)
    problems = []
    for step, (x, y) in enumerate(flat_batches(8)):
        pipe.train_step(x, y)
        cuts = sorted(rng.sample(range(1, len(specs)), 2))
        sizes = [cuts[0], cuts[1] - cuts[0], len(specs) - cuts[1]]
        before, opt_before = pipe.full_state_dict(), optimizer_state(pipe)
        pipe.repartition(sizes)
        after, opt_after = pipe.full_state_dict(), optimizer_state(pipe)
        owned = owned_keys(pipe)
        flat = [k for keys in owned for k in keys]
        if flat != [s.key for s in specs] or [len(k) for k in owned] != sizes:
            problems.append(f"step {step}: owners {owned} for sizes {sizes}")
        if ctx.rank == 0 and max_state_diff(before, after) != 0:
            problems.append(f"step {step}: module state changed")
        for key in opt_before:
            for a, b in zip(opt_before[key], opt_after[key], strict=True):
                if any(not torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a):
                    problems.append(f"step {step}: optimizer state of {key} changed")
    pipe.close()
    return problems


@pytest.mark.parametrize("seed", [0, 1])
def test_random_repartitions_keep_every_layer_once_and_intact(seed: int) -> None:
    problems = pipeline.launch(
        functools.partial(random_walk, seed=seed), 3, threads_per_stage=1, timeout_s=60
    )
    assert problems == [[], [], []]


# -- an interrupted migration -----------------------------------------------------------------
class RefusesStageOne(nn.Linear):
    """Builds anywhere but on stage 1: a receiver that fails in the middle of a migration."""

    def __init__(self) -> None:
        if dist.is_initialized() and dist.get_rank() == 1:
            raise RuntimeError("injected failure: cannot build on stage 1")
        super().__init__(16, 16)


def interrupted(ctx: StageContext) -> dict[str, Any]:
    specs = [
        *transformer_stack(2, 16, 2),
        LayerSpec("fragile", RefusesStageOne),
        *transformer_stack(3, 16, 2)[2:],
    ]
    batches = seq_batches(4)
    out: dict[str, Any] = {}
    for attempt in (False, True):
        pipe = ElasticPipeline(
            specs,
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            n_microbatches=MICROBATCHES,
            planning=PlanOptions(partition=[3, 1]),
        )
        losses = [pipe.train_step(*batches[0]), pipe.train_step(*batches[1])]
        if attempt:
            try:
                pipe.repartition([2, 2])  # would move "fragile" to stage 1
            except MigrationError as exc:
                out["error"] = str(exc)
        losses += [pipe.train_step(*batches[2]), pipe.train_step(*batches[3])]
        out["attempt" if attempt else "plain"] = {
            "losses": losses,
            "sizes": pipe.sizes,
            "version": pipe.version,
            "owned": owned_keys(pipe),
            "state": pipe.full_state_dict(),
        }
        pipe.close()
    return out


def test_failed_migration_rolls_back() -> None:
    results = pipeline.launch(interrupted, 2, threads_per_stage=1, timeout_s=60)
    for r in results:  # every rank raised, with the receiver's reason
        assert "injected failure: cannot build on stage 1" in r["error"]
        assert "old plan stays in force" in r["error"]
    r = results[0]
    assert r["attempt"]["sizes"] == [3, 1] and r["attempt"]["version"] == 0
    assert r["attempt"]["owned"] == [["block0", "block1", "fragile"], ["block2"]]
    assert r["attempt"]["losses"] == r["plain"]["losses"]
    assert max_state_diff(r["attempt"]["state"], r["plain"]["state"]) == 0
