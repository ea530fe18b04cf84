"""The elastic runtime's statistics as tracker step metrics.

The study loop logs a `PipelineStats.to_dict()` at every step; trackers take flat
name -> number metrics, so this flattens one into the other (per-stage fields under
`stage{i}/`, migration totals under `migrations/`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["pipeline_metrics"]

_TOP = (
    "samples_per_s",
    "tokens_per_s",
    "iteration_s",
    "predicted_iteration_s",
    "bubble_fraction",
    "predicted_bubble_fraction",
    "plan_version",
    "generation",
)
_STAGE = (
    "forward_s",
    "backward_s",
    "wait_s",
    "optimizer_s",
    "total_s",
    "param_bytes",
    "state_bytes",
    "activation_peak_bytes",
    "measured_peak_bytes",
    "predicted_peak_bytes",
    "predicted_compute_s",
    "allocator_peak_bytes",
    "process_peak_bytes",
)


def pipeline_metrics(stats: Mapping[str, Any]) -> dict[str, float | int | None]:
    """A `PipelineStats.to_dict()` flattened into step metrics.

    Keys: the pipeline's figures by their own names (`tokens_per_s`, `samples_per_s`,
    `iteration_s`, `bubble_fraction`, their `predicted_*` twins, `plan_version`,
    `generation`), `peak_bytes` (the largest stage's measured peak), per stage
    `stage{i}/<field>` (times, bytes, `stage{i}/layers` = its number of layers), and
    `migrations/count`, `migrations/bytes_moved`, `migrations/pause_s` (totals so far).
    Values the runtime reports as None (no plan, no token ids) stay None.
    """
    out: dict[str, float | int | None] = {key: stats.get(key) for key in _TOP if key in stats}
    stages = stats.get("stages") or []
    peaks: list[int] = []
    for stage in stages:
        index = stage.get("stage", len(peaks))
        for key in _STAGE:
            if key in stage:
                out[f"stage{index}/{key}"] = stage[key]
        out[f"stage{index}/layers"] = len(stage.get("layers") or ())
        if isinstance(stage.get("measured_peak_bytes"), int):
            peaks.append(stage["measured_peak_bytes"])
    if stages:
        out["peak_bytes"] = max(peaks) if peaks else None
    migrations = stats.get("migrations")
    if migrations is not None:
        out["migrations/count"] = len(migrations)
        out["migrations/bytes_moved"] = sum(int(m.get("bytes_moved") or 0) for m in migrations)
        out["migrations/pause_s"] = sum(float(m.get("pause_s") or 0.0) for m in migrations)
    return out
