"""The public surface a harness relies on, in one set of stage processes.

`full_state_dict` before the first step, a custom schedule planned with its own in-flight
counts, an inference failure and a build failure raised on every rank (the pipeline stays
usable), `on_nonfinite="ignore"`, and the read-only views of what a stage holds.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext, StageError
from pipeline.local.models import mlp_stack
from pipeline.local.spec import build_layer
from pipeline.pure.schedule import Action, gpipe

pytestmark = pytest.mark.multiprocess

SGD = functools.partial(torch.optim.SGD, lr=0.1)
WIDTHS = [6, 16, 16, 16, 3]


def all_forwards_first(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """A user's own schedule (GPipe's order under another name)."""
    return gpipe(n_stages, n_microbatches, stage)


class FailsOnStageOne(nn.Linear):
    """Builds on stage 0 only, or fails in eval-mode forwards, as `mode` says."""

    def __init__(self, a: int, b: int, mode: str) -> None:
        if mode == "build" and dist.get_rank() == 1:
            raise TypeError("injected: this layer cannot be built on stage 1")
        super().__init__(a, b)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "infer" and not self.training:
            raise RuntimeError("injected inference failure")
        return super().forward(x)


def with_layer(mode: str) -> list[LayerSpec]:
    layer = functools.partial(FailsOnStageOne, 16, 16, mode)
    return [
        *mlp_stack([6, 16, 16, 16, 16])[:-1],
        LayerSpec("x", layer),
        LayerSpec("out", functools.partial(nn.Linear, 16, 3)),
    ]


def surface(ctx: StageContext) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    out: dict[str, Any] = {}
    pipe = ElasticPipeline(
        mlp_stack(WIDTHS),
        optimizer=SGD,
        loss_fn=F.cross_entropy,
        schedule=all_forwards_first,
        n_microbatches=4,
        seed=3,
    )
    out["unbuilt_keys"] = pipe.layer_keys
    out["initial"] = pipe.full_state_dict()  # before the first step: built in turns
    pipe.train_step(x, y)
    assert pipe.plan is not None
    out["plan_schedule"] = pipe.plan.schedule
    out["keys"], out["views"] = pipe.layer_keys, pipe.stage_layer_keys()
    out["modules"] = sorted(pipe.layers)
    # an inference failure on stage 1, then inference and training go on
    for mode in ("infer", "build"):
        try:
            pipe.reconfigure(with_layer(mode), partition=[3, 2])
            pipe.forward(x)
        except (StageError, TypeError) as error:
            out[mode] = (type(error).__name__, str(error).split("\n")[0])
    pipe.reconfigure(with_layer("none"), partition=[3, 2])
    out["forward_after"] = tuple(pipe.forward(x).shape)
    # NaN losses train on when asked to
    nan = ElasticPipeline(
        mlp_stack(WIDTHS),
        optimizer=SGD,
        n_microbatches=2,
        planning=PlanOptions(partition=[2, 2]),
        loss_fn=lambda o, t: F.cross_entropy(o, t) * float("nan"),
        on_nonfinite="ignore",
    )
    out["nan"] = nan.train_step(x, y)
    pipe.close()
    nan.close()
    return out


def test_the_public_surface() -> None:
    results = pipeline.launch(surface, 2, threads_per_stage=1, timeout_s=60)
    cpu = torch.device("cpu")
    expected = {s.key: build_layer(s, 3, cpu).state_dict() for s in mlp_stack(WIDTHS)}
    initial = results[0]["initial"]
    assert list(initial) == list(expected)
    assert all(torch.equal(initial[k][n], v) for k, s in expected.items() for n, v in s.items())
    assert results[1]["initial"] == {}
    for rank, r in enumerate(results):
        assert r["unbuilt_keys"] == ()
        assert r["plan_schedule"] == "all_forwards_first"
        assert r["keys"] == r["views"][rank] and sorted(r["keys"]) == r["modules"]
        assert r["infer"] == ("StageError", r["infer"][1])
        assert "stage 1 failed in the forward of layer 'x'" in r["infer"][1]
        assert r["build"][0] == "TypeError" and "cannot be built on stage 1" in r["build"][1]
        assert r["forward_after"] == (8, 3)
        assert r["nan"] != r["nan"]  # NaN, returned on every rank
