"""The model and costs the shape tests share: equal layers whose costs scale with the
micro-batch (`test_shape`, `test_pool_shape`)."""

from __future__ import annotations

import dataclasses

from pipeline.pure.costs import LayerCost
from pipeline.pure.shape import CostsAt, RuntimeOverheads, Shape, ShapeOption

OVERHEADS = RuntimeOverheads(microbatch_s=4e-4, message_s=8e-4, step_s=1e-3)
BATCH = 32


def model(n_layers: int, forward_s: float, param_bytes: int) -> list[LayerCost]:
    """Layers of equal cost per sample, `forward_s` for the whole batch."""
    return [
        LayerCost(
            key=f"layer{i}",
            forward_s=forward_s,
            backward_s=2 * forward_s,
            activation_bytes=1 << 20,
            output_bytes=1 << 16,
            param_bytes=param_bytes,
            grad_bytes=param_bytes,
            optimizer_bytes=2 * param_bytes,
        )
        for i in range(n_layers)
    ]


def costs_at_for(layers: list[LayerCost], thread_speedup: float = 1.0) -> CostsAt:
    """Costs proportional to the micro-batch; T threads divide compute by speedup**(T-1)."""

    def costs_at(threads: int, microbatch: int) -> list[LayerCost]:
        scale = microbatch / BATCH / thread_speedup ** (threads - 1)
        return [
            LayerCost(
                key=c.key,
                forward_s=c.forward_s * scale,
                backward_s=c.backward_s * scale,
                activation_bytes=int(c.activation_bytes * microbatch / BATCH),
                output_bytes=int(c.output_bytes * microbatch / BATCH),
                param_bytes=c.param_bytes,
                grad_bytes=c.grad_bytes,
                optimizer_bytes=c.optimizer_bytes,
            )
            for c in layers
        ]

    return costs_at


def per_process_option(
    planned: ShapeOption, stages: int, microbatches: int, rate: float
) -> ShapeOption:
    """`planned` as an option of `stages` stages at `microbatches` predicted at `rate`
    samples/s per process (options built for the choice among them alone)."""
    return dataclasses.replace(
        planned,
        shape=Shape(1, stages, 1, microbatches),
        predicted_samples_per_s=rate * stages,
    )
