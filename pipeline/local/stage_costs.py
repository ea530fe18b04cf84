"""What one stage's layers cost, as measured while they train: what the planner reads back.

Kept apart from `pipeline.local.stage` so the stage stays short; its `seed_meters`,
`measured_cost`, `state_bytes` and `end_step` delegate here. Each layer has a
`pipeline.local.meter.LayerMeter`, started from the profiled costs when the stage is built
from a plan; every step that succeeds adds the per-micro-batch times and bytes of what it
ran one layer at a time (`update_meters`; a fused step, `pipeline.local.fused`, adds
nothing), and a re-plan reads them back as `pipeline.pure.costs.LayerCost`s
(`pipeline.distributed.agreement.measured_costs` gathers them from every stage). The last
layer's forward time includes the loss, which always runs where that layer does.

What a meter keeps when a step cannot measure a number:

    activation bytes   a recomputed or swapped layer saves less than it would keep: its
                       meter keeps the bytes it keeps when kept (measured then, or profiled),
                       which is what plans use; steps that do not measure memory, and
                       streams (whose micro-batches interleave across steps), leave it as is
    backward time      a handed layer's backward runs on the next stage (Bi-Partition): its
                       meter keeps its estimate
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.local.asynchronous import AsyncWeights
from pipeline.local.carry import nbytes
from pipeline.local.layer import StageLayer
from pipeline.local.meter import LayerMeter
from pipeline.local.separable import HandedLayers, is_separable
from pipeline.local.versions import WeightVersions
from pipeline.pure.costs import LayerCost

__all__ = ["measured_cost", "seed_meters", "state_bytes", "update_meters"]


def seed_meters(layers: Sequence[StageLayer], costs: Sequence[LayerCost]) -> None:
    """Start each layer's meter from profiled costs: what it reports until the first step
    that measures, whose numbers then replace them (a profile taken alone, or a stale
    cache, is not averaged into what the stage measures); later steps are smoothed."""
    for layer, cost in zip(layers, costs, strict=True):
        layer.meter = LayerMeter(
            cost.forward_s,
            cost.backward_s,
            cost.activation_bytes,
            cost.output_bytes,
            steps=0,
            input_bytes=cost.input_bytes,
        )


def update_meters(
    layers: Sequence[StageLayer], n_microbatches: int, handoff_out: int, sums: bool
) -> None:
    """Add the step that just succeeded (its sums over `n_microbatches` micro-batches) to
    every layer's meter; `sums`: the step's byte sums are whole (measured, not a stream)."""
    m = n_microbatches
    first_handed = len(layers) - handoff_out
    for position, layer in enumerate(layers):
        meter = layer.meter
        if not (layer.forward_n or layer.backward_n):
            continue  # a fused step: nothing measured per layer
        # A recomputed or swapped layer saves less than it would keep (module doc).
        kept = sums and layer.action == "keep"
        activation = layer.activation_bytes / m if kept else meter.activation_bytes
        output = layer.output_bytes / m if sums else meter.output_bytes
        forward = layer.forward_s / layer.forward_n if layer.forward_n else meter.forward_s
        backward = layer.backward_s / layer.backward_n if layer.backward_n else meter.backward_s
        # a handed layer's backward runs on the next stage: its meter keeps its estimate
        if position >= first_handed:
            backward = meter.backward_s
        meter.update(forward, backward, activation, output)


def measured_cost(layer: StageLayer, optimizer: torch.optim.Optimizer | None) -> LayerCost:
    """The layer's costs as measured here: smoothed times, bytes, state bytes."""
    meter, params = layer.meter, list(layer.module.parameters())
    state = optimizer.state if optimizer is not None else {}
    return LayerCost(
        key=layer.key,
        forward_s=meter.forward_s,
        backward_s=meter.backward_s,
        activation_bytes=round(meter.activation_bytes),
        output_bytes=round(meter.output_bytes),
        param_bytes=sum(nbytes(p) for p in params),
        grad_bytes=sum(nbytes(p) for p in params if p.requires_grad),
        optimizer_bytes=sum(
            nbytes(v)
            for p in params
            for v in state.get(p, {}).values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ),
        separable=is_separable(layer.module),
        input_bytes=meter.input_bytes,
    )


def state_bytes(
    layers: Sequence[StageLayer],
    optimizer: torch.optim.Optimizer | None,
    versions: WeightVersions | AsyncWeights | None,
    handed_in: HandedLayers | None,
) -> int:
    """Parameters + gradients + optimizer state of the layers (what the planner counts), with
    2BW's second weight version or PipeMare's T2 buffers (`versions`), and Bi-Partition's
    replicas of the previous stage's handed layers (`handed_in`: parameters and gradients)."""
    total = sum(measured_cost(layer, optimizer).state_bytes for layer in layers)
    if versions is not None:
        total += versions.nbytes()
    if handed_in is not None:
        total += 2 * sum(nbytes(p) for p in handed_in.parameters())
    return total
