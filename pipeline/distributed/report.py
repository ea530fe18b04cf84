"""What a running pipeline reports: statistics, and pictures of its partition and its steps.

Kept apart from `pipeline.distributed.elastic` so the facade stays short. `stats` is a collective
(one all_gather); the pictures come from `pipeline.pure.timeline`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from pipeline.local.stage import Stage, StepTimes
from pipeline.pure.timeline import chrome_trace, partition_svg

if TYPE_CHECKING:
    from pipeline.distributed.elastic import ElasticPipeline

__all__ = ["save_partition_picture", "save_timeline", "stats"]

_TIME_FIELDS = [f for f in StepTimes.__dataclass_fields__ if f != "peak_activation_bytes"]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def stats(pipe: ElasticPipeline, stage: Stage, last_steps: int) -> dict[str, Any]:
    """`ElasticPipeline.stats`: gather every stage's numbers; predicted beside measured."""
    recent = pipe._history[-last_steps:]
    peaks = [t.peak_activation_bytes for _, t in pipe._history if t.peak_activation_bytes]
    allocator = [t.allocator_peak_bytes for _, t in pipe._history if t.allocator_peak_bytes]
    mine = {
        "stage": pipe.rank,
        "layers": [layer.key for layer in stage.layers],
        "memory_actions": [layer.action for layer in stage.layers],
        "param_bytes": stage.param_bytes(),
        "state_bytes": stage.state_bytes(),
        "measured_peak_activation_bytes": peaks[-1] if peaks else 0,  # latest measured
        # GPU: the allocator's peak over a measured step (all memory, not only the planned)
        "allocator_peak_bytes": allocator[-1] if allocator else None,
        **{f: _median([getattr(t, f) for _, t in recent]) for f in _TIME_FIELDS},
    }
    per_stage: list[Any] = [None] * pipe.n_stages
    dist.all_gather_object(per_stage, mine)
    plan, m = pipe.plan, pipe.n_microbatches
    for s, entry in enumerate(per_stage):
        activations = entry["measured_peak_activation_bytes"]
        entry["measured_peak_bytes"] = entry["state_bytes"] + activations
        entry["predicted_peak_bytes"] = plan.predicted_stage_bytes[s] if plan else None
        entry["predicted_compute_s"] = plan.predicted_stage_s[s] * m if plan else None
    iteration_s = max(s["total_s"] for s in per_stage)
    samples = _median([n for n, _ in recent])
    return {
        "generation": pipe.generation,
        "steps": pipe.step,
        "plan_version": pipe.version,
        "plan": plan.to_dict() if plan else None,
        "migrations": [dataclasses.asdict(r) for r in pipe.migrations],
        "schedule": pipe.schedule_name or getattr(pipe.schedule, "__name__", "custom"),
        "n_microbatches": m,
        "partition": list(pipe.sizes),
        "iteration_s": iteration_s,
        "predicted_iteration_s": plan.predicted_iteration_s if plan else None,
        "samples_per_s": samples / iteration_s if iteration_s > 0 else 0.0,
        "stages": per_stage,
    }


def save_partition_picture(pipe: ElasticPipeline, path: str | Path) -> Path:
    """An SVG of which layers lived on which stage, step by step."""
    svg = partition_svg(pipe.partition_history, [s.key for s in pipe.specs], pipe.step)
    path = Path(path)
    path.write_text(svg)
    return path


def save_timeline(stage: Stage, path: str | Path, title: str) -> Path | None:
    """Gather every stage's spans of the last step; rank 0 writes Chrome-trace JSON."""
    spans: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(spans, stage.spans)
    if dist.get_rank() != 0:
        return None
    path = Path(path)
    path.write_text(json.dumps(chrome_trace([s for part in spans for s in part], title)))
    return path
