"""torch.distributed.pipelining as the peer, on 2 ranks, checked before it is timed.

Why it exists: `schedules.py` and `lm_split.py` run torch's schedules (one stage per rank,
or several chunks per rank in a loop or a V) on the same layers as ours, and a timed run
counts only once one step with dropout off has matched a single process's loss and
gradients. Building the chunks, the schedule and that check is the same in both; it lives
here once. (`common.torch_pipelining_step` is the unchecked one-stage-per-rank step.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage

from pipeline import LayerSpec, StageContext
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds

STAGES = 2
Layout = Literal["single", "loop", "v"]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Grads = list[list[torch.Tensor | None]]  # per layer, per parameter (None: it had none)


def chunks_of(layout: str, rank: int) -> tuple[int, list[int]]:
    """(number of chunks, the chunk indices `rank` holds, in its stage order): "single" 2
    chunks, rank r holds r; "loop" 4 chunks, r and r+2; "v" 4 chunks, V (rank 0 holds 0
    and 3)."""
    if layout == "single":
        return STAGES, [rank]
    if layout == "loop":
        return 2 * STAGES, [rank, rank + STAGES]
    if layout == "v":
        return 2 * STAGES, [rank, 2 * STAGES - 1 - rank]
    raise ValueError(f"unknown layout {layout!r}; valid: single, loop, v")


class Chain(nn.Module):
    """Layers in a row whose input may be several tensors (torch passes a tuple carry
    between stages as positional arguments; `nn.Sequential` takes one)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *carry: Any) -> Any:
        h = carry[0] if len(carry) == 1 else carry
        for layer in self.layers:
            h = layer(h)
        return h


def chain(specs: Sequence[LayerSpec], device: torch.device) -> Chain:
    """The layers of `specs` built with seed 0 (as `ElasticPipeline`'s default), in a row."""
    return Chain([build_layer(s, 0, device) for s in specs])


def reference_grads(
    model: Chain, data: tuple[torch.Tensor, torch.Tensor], m: int, loss_fn: LossFn
) -> tuple[float, Grads]:
    """Dropout off: the mean micro-batch loss and each layer's gradients, accumulated over
    the batch's `m` micro-batches."""
    model.eval()
    total = 0.0
    for xi, yi in zip(*(t.chunk(m) for t in data), strict=True):
        loss = loss_fn(model(xi), yi)
        (loss / m).backward()
        total += float(loss.detach())
    grads = [
        [None if p.grad is None else p.grad.clone() for p in layer.parameters()]
        for layer in model.layers
    ]
    return total / m, grads


def grad_error(got: Sequence[torch.Tensor | None], want: Sequence[torch.Tensor | None]) -> float:
    """The largest max |g - ref| / max |ref| over a layer's parameters (inf where one side
    has a gradient the other lacks)."""
    if [g is None for g in got] != [w is None for w in want]:
        return math.inf
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g is not None and w is not None:
            diff = float((g - w).abs().max())
            worst = max(worst, diff / float(w.abs().max().clamp_min(1e-30)))
    return worst


def agreed_check(
    loss: float | None, worst_grad: float, ref_loss: float, tolerances: tuple[float, float]
) -> dict[str, Any]:
    """A torch schedule's first step against one process, agreed by every rank: `loss` is
    the step's (None where this rank has no last chunk), `worst_grad` this rank's largest
    max |g - ref| / max |ref|; `tolerances` (loss abs, grad rel)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (loss, worst_grad))
    step_loss = next(v[0] for v in gathered if v[0] is not None)
    grad_error = max(v[1] for v in gathered)
    return {
        "first_step_loss": step_loss,
        "single_process_loss": ref_loss,
        "loss_abs_diff": abs(step_loss - ref_loss),
        "max_rel_grad_diff": grad_error,
        "correct": abs(step_loss - ref_loss) <= tolerances[0] and grad_error <= tolerances[1],
    }


@dataclass(frozen=True)
class TorchSchedule:
    """One torch schedule on this rank's chunks: `forward_backward` runs a step without the
    optimizer (`losses` filled on the last chunk's rank), `step` a whole training step."""

    forward_backward: Callable[[list[torch.Tensor]], None]
    step: Callable[[], None]
    params: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    check: dict[str, Any]


@dataclass(frozen=True)
class Workload:
    """What a torch schedule trains: the layers, the batch, the loss and the optimizer."""

    specs: Sequence[LayerSpec]
    data: tuple[torch.Tensor, torch.Tensor]
    loss_fn: LossFn
    optimizer: Callable[..., torch.optim.Optimizer]


def checked_torch_schedule(
    ctx: StageContext,
    work: Workload,
    schedule: tuple[type, str],
    sizes: Sequence[int],
    m: int,
    reference: tuple[float, Grads],
    tolerances: tuple[float, float],
) -> TorchSchedule:
    """`schedule` (class, layout) on this rank's chunks of the split `sizes`, checked first:
    one step with dropout off must give `reference`'s loss and gradients (`agreed_check`,
    a collective), then every chunk is back in train mode."""
    cls, layout = schedule
    n_chunks, mine = chunks_of(layout, ctx.rank)
    spans = bounds(list(sizes))
    modules = [chain(work.specs[slice(*spans[c])], ctx.device) for c in mine]
    stages = [
        PipelineStage(mod, c, n_chunks, ctx.device) for mod, c in zip(modules, mine, strict=True)
    ]
    runner = cls(
        stages[0] if layout == "single" else stages, n_microbatches=m, loss_fn=work.loss_fn
    )
    params = [p for mod in modules for p in mod.parameters()]
    optimizer = work.optimizer(params)
    first, last = 0 in mine, n_chunks - 1 in mine
    x, y = work.data

    def forward_backward(losses: list[torch.Tensor]) -> None:
        kwargs: dict[str, Any] = {"target": y, "losses": losses} if last else {}
        runner.step(*((x,) if first else ()), **kwargs)

    for mod in modules:  # the check: dropout off, one step, loss and gradients
        mod.eval()
    losses: list[torch.Tensor] = []
    forward_backward(losses)
    loss = float(torch.stack([t.detach() for t in losses]).mean()) if last else None
    ref_loss, ref_grads = reference
    worst = max(
        (
            grad_error([p.grad for p in layer.parameters()], ref_grads[spans[c][0] + offset])
            for mod, c in zip(modules, mine, strict=True)
            for offset, layer in enumerate(mod.layers)
        ),
        default=0.0,
    )
    optimizer.zero_grad(set_to_none=True)
    for mod in modules:
        mod.train()
    check = agreed_check(loss, worst, ref_loss, tolerances)

    def step() -> None:
        forward_backward([])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TorchSchedule(forward_backward, step, params, optimizer, check)
