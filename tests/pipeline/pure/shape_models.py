"""The model and costs the shape tests share: equal layers whose costs scale with the
micro-batch (`test_shape`, `test_pool_shape`)."""

from __future__ import annotations

import dataclasses

from pipeline.pure.costs import LayerCost
from pipeline.pure.shape import CostsAt, RuntimeOverheads, Shape, ShapeOption, SizesAt

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


class Profiled:
    """`costs_at` that records the (threads, micro-batch) it was asked, and the model's
    bytes (`sizes`) with every second unknown, as a profile counts them untimed."""

    def __init__(self, costs_at: CostsAt) -> None:
        self.costs_at = costs_at
        self.asked: list[tuple[int, int]] = []

    def __call__(self, threads: int, microbatch: int) -> list[LayerCost]:
        self.asked.append((threads, microbatch))
        return list(self.costs_at(threads, microbatch))

    @property
    def sizes(self) -> SizesAt:
        def sizes_at(microbatch: int) -> list[LayerCost]:
            return [
                dataclasses.replace(c, forward_s=0.0, backward_s=0.0)
                for c in self.costs_at(1, microbatch)
            ]

        return sizes_at


def same_options(a: list[ShapeOption], b: list[ShapeOption]) -> bool:
    """The same shapes tried, each with the same plan (or none)."""
    return [(o.shape, o.plan) for o in a] == [(o.shape, o.plan) for o in b]
