"""What a study may optimise, and which way: each task's validation metrics and the runtime's.

The tasks declare their metrics and directions (`Task.metric_directions`); the runtime adds
throughput, memory and size. The study's settings check its objectives against these, and
the study, the retraining and the report rank by them (`direction`, `lower_is_better`).
"""

from __future__ import annotations

import math

from nas.tasks import Direction, known_tasks, task_class

__all__ = [
    "DIRECTIONS",
    "RUNTIME_OBJECTIVES",
    "direction",
    "lower_is_better",
    "objectives",
    "task_metrics",
]

# What a study may optimise besides its task's validation metrics, with the direction.
RUNTIME_OBJECTIVES: dict[str, Direction] = {
    "tokens_per_s": "maximize",
    "peak_memory_bytes": "minimize",
    "parameters": "minimize",
}
DIRECTIONS = ("minimize", "maximize")


def task_metrics(task: str) -> tuple[str, ...]:
    """The validation metrics `task` measures (`Task.metric_directions`), as a trial logs
    them (`validation_<metric>`)."""
    return tuple(f"validation_{metric}" for metric in task_class(task).metric_directions)


def objectives() -> dict[str, Direction]:
    """Every metric a study may optimise, with its direction: each known task's validation
    metrics (a task loaded by import path counts from then on), then the runtime's. The
    first objective of a study is its fitness: measured at every evaluation (a
    `validation_*` metric), it is what pruners and hurdles see and what evolution ranks by."""
    known: dict[str, Direction] = {}
    for cls in known_tasks().values():
        known |= {f"validation_{m}": way for m, way in cls.metric_directions.items()}
    return known | RUNTIME_OBJECTIVES


def direction(metric: str) -> Direction:
    """Whether `metric` is minimised or maximised (`objectives`)."""
    known = objectives()
    if metric not in known:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(known)}")
    return known[metric]


def lower_is_better(metric: str, value: float) -> float:
    """`value` of `metric` on a scale where lower is better: negated when the metric is
    maximised; +inf when it is not finite (a failed run ranks last)."""
    if not math.isfinite(value):
        return math.inf
    return -value if direction(metric) == "maximize" else value
