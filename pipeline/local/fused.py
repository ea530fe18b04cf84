"""A stage's layers as one autograd graph: the compute of a step that measures nothing per layer.

A step that measures (`pipeline.distributed.triggers.PlanAge`: the first step of every
plan and every `measure_memory_every`-th) runs a stage's layers one at a time
(`pipeline.local.stage`), each on a detached leaf input, so each layer's time and saved
bytes can be read. That costs one autograd call per layer and a clock read around each. Every
other step runs the stage as torch's own pipelining does:

    forward   the layers one after another on the stage's input, no detach between them;
              each still seeded by (seed, step, micro-batch, key), so dropout draws what
              the per-layer path draws; a recomputed layer runs under
              `torch.utils.checkpoint` (non-reentrant, re-run with the same seed in the
              backward), a swapped one under `save_on_cpu`
    backward  one autograd call from the stage's outputs (or loss / M) to its input
    split     zero bubble (`pipeline.local.backward`): B and W over the whole stage graph,
              each node run once; a stage holding a recomputed layer runs its whole
              backward in B (W has nothing to do), as the per-layer path does for that
              layer, since W would unpack the recomputed tensors a second time

The results are those of the per-layer path (the same kernels on the same inputs; the
boundary gradients are summed by autograd instead of by the walk): the exactness tests
compare both with one process. Per-layer meters keep their values (the drift trigger
reads them on the steps that measure); the stage's times are the whole forward and
backward.

Not fused: a stage under Bi-Partition (`handoff`), whose handed layers need their own
inputs and outputs (`pipeline.local.separable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from pipeline.local.backward import backward_input, fused_backward
from pipeline.local.carry import Carry, floating
from pipeline.local.inflight import ComputeError, InFlight, StepTimes
from pipeline.local.layer import StageLayer

__all__ = ["FusedStage", "backward", "forward"]


class FusedStage(Protocol):
    """What the fused path uses of a stage (`pipeline.local.stage.Stage` is one)."""

    index: int
    layers: list[StageLayer]
    times: StepTimes

    @property
    def n_microbatches(self) -> int: ...

    def now(self) -> float: ...

    def call_layer(self, layer: StageLayer, i: int, carry: Carry) -> Carry: ...


def forward(stage: FusedStage, i: int, carry: Carry) -> InFlight:
    """Micro-batch i through the stage's layers as one graph; the loss is the caller's."""
    state = InFlight(fused=True)
    state.inputs.append(carry)
    for layer in stage.layers:
        carry = _call(stage, layer, i, carry)
    state.outputs.append(carry)
    return state


def _call(stage: FusedStage, layer: StageLayer, i: int, carry: Carry) -> Carry:
    if layer.action == "recompute" and torch.is_grad_enabled():

        def run(*tensors: torch.Tensor) -> Carry:
            return stage.call_layer(layer, i, tensors)

        # early stop ends a recompute with an exception, which `call_layer` would report
        with set_checkpoint_early_stop(False):
            out: Carry = checkpoint(run, *carry, use_reentrant=False, preserve_rng_state=False)
        return out
    if layer.action == "swap":
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return stage.call_layer(layer, i, carry)
    return stage.call_layer(layer, i, carry)


def backward(
    stage: FusedStage, state: InFlight, i: int, grads: Sequence[torch.Tensor], split: bool
) -> Sequence[torch.Tensor]:
    """The stage's backward of micro-batch i in one call (split: B now, W in `state.weight`)."""
    inputs, outputs = state.inputs[0], state.outputs[0]
    if state.loss is not None:
        loss = state.loss / stage.n_microbatches
        roots, grads = [loss], (torch.ones_like(loss),)
    else:
        roots = floating(outputs)
    wanted = floating(inputs) if stage.index > 0 else []
    state.outputs = []
    recomputes = any(layer.action == "recompute" for layer in stage.layers)
    try:
        if split and not recomputes:
            input_grads, work = backward_input(roots, grads, wanted)
            if work:
                state.weight[0] = work
        else:
            input_grads = fused_backward(roots, grads, wanted)
    except ComputeError:
        raise
    except Exception as error:
        keys = f"{stage.layers[0].key!r}..{stage.layers[-1].key!r}"
        error.add_note(f"in the backward of layers {keys} (fused) on stage {stage.index}")
        raise ComputeError("backward", stage.layers[-1].key, i, error) from error
    return input_grads if stage.index > 0 else ()


def backward_weight(stage: FusedStage, state: InFlight, i: int) -> None:
    """W of a fused micro-batch: the weight gradients B left, over the whole stage graph."""
    work = state.weight.pop(0, None)
    if work is None:
        return
    try:
        work.run()
    except Exception as error:
        error.add_note(f"in the weight-gradient backward (W) of stage {stage.index} (fused)")
        raise ComputeError("backward", stage.layers[-1].key, i, error) from error
