"""Pictures of a pipeline: what each stage did in a step, and which layers lived where.

* `chrome_trace(spans)`: a Chrome-trace JSON object (open it in https://ui.perfetto.dev or
  chrome://tracing) with one row per stage (grouped by rank when ranks hold several stages)
  and one box per forward, backward, wait or optimizer step. The one writer of the format:
  used for measured steps (`ElasticPipeline.save_timeline`) and for simulated ones
  (`pipeline.pure.simulate`).
* `partition_svg(history, keys)`: an SVG picture of the partition over time: steps run left
  to right, layers top to bottom, each cell coloured by the stage that owned the layer then.
  Migrations show up as colour boundaries moving. Plain SVG, so no plotting library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

__all__ = ["Span", "chrome_trace", "partition_svg"]

_COLOURS = [
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
]


@dataclass(frozen=True)
class Span:
    """One box on a stage's row: `name` from `start_s` to `end_s` (seconds)."""

    stage: int
    name: str
    start_s: float
    end_s: float
    category: str = "compute"
    rank: int = -1  # >= 0: the rank running the stage, when ranks hold several stages


def chrome_trace(
    spans: Sequence[Span], title: str = "pipeline", other_data: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Chrome-trace JSON ("X" complete events, microseconds), one thread per stage.

    Times start at the earliest span; `other_data` (JSON-serialisable) goes to "otherData",
    which Perfetto shows as the trace's metadata. Spans that name their rank (several stages
    per rank) go to one process per rank ("<title>: rank r", pid r), each stage a thread of
    its rank's process; otherwise every stage is a thread of one process (pid 0).
    """
    origin = min((s.start_s for s in spans), default=0.0)
    lanes = sorted({(max(s.rank, 0), s.stage) for s in spans})  # (pid, tid)
    grouped = any(s.rank >= 0 for s in spans)
    pids = sorted({pid for pid, _ in lanes}) if grouped else [0]
    events: list[dict[str, Any]] = [
        *(
            {
                "name": "process_name",
                "ph": "M",
                "pid": p,
                "args": {"name": f"{title}: rank {p}" if grouped else title},
            }
            for p in pids
        ),
        *(
            {"name": "process_sort_index", "ph": "M", "pid": p, "args": {"sort_index": p}}
            for p in (pids if grouped else [])
        ),
        *(
            {"name": "thread_name", "ph": "M", "pid": p, "tid": s, "args": {"name": f"stage {s}"}}
            for p, s in lanes
        ),
        *(
            {"name": "thread_sort_index", "ph": "M", "pid": p, "tid": s, "args": {"sort_index": s}}
            for p, s in lanes
        ),
    ]
    for span in spans:
        events.append(
            {
                "name": span.name,
                "cat": span.category,
                "ph": "X",
                "pid": max(span.rank, 0),
                "tid": span.stage,
                "ts": (span.start_s - origin) * 1e6,
                "dur": max(span.end_s - span.start_s, 0) * 1e6,
            }
        )
    trace: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if other_data is not None:
        trace["otherData"] = dict(other_data)
    return trace


def partition_svg(
    history: Sequence[tuple[int, Sequence[int]]], keys: Sequence[str], n_steps: int, cell: int = 14
) -> str:
    """SVG of layer ownership: `history` = [(first step, stage sizes)], in step order."""
    if not history:
        raise ValueError("the partition history is empty")
    n_stages = len(history[0][1])
    label_w, top = 9 * max(len(k) for k in keys) + 10, 24
    width = label_w + cell * max(n_steps, 1) + 120
    height = top + cell * len(keys) + 34
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="monospace" font-size="11">',
        f'<text x="{label_w}" y="14">partition over {n_steps} steps '
        f"({len(history) - 1} changes)</text>",
    ]
    for row, key in enumerate(keys):
        parts.append(f'<text x="4" y="{top + cell * row + cell - 3}">{key}</text>')
    ends = [start for start, _ in history[1:]] + [max(n_steps, history[-1][0] + 1)]
    for (start, sizes), end in zip(history, ends, strict=True):
        if sum(sizes) != len(keys):
            raise ValueError(f"sizes {list(sizes)} do not cover {len(keys)} layers")
        owners = [s for s, n in enumerate(sizes) for _ in range(n)]
        x, w = label_w + cell * start, cell * max(end - start, 1)
        for row, stage in enumerate(owners):
            parts.append(
                f'<rect x="{x}" y="{top + cell * row}" width="{w}" height="{cell - 1}" '
                f'fill="{_COLOURS[stage % len(_COLOURS)]}"><title>{keys[row]}: stage '
                f"{stage}, steps {start}-{end - 1}</title></rect>"
            )
        axis_y = top + cell * len(keys) + 14
        parts.append(f'<text x="{x}" y="{axis_y}">step {start}</text>')
        for cut in accumulate(sizes[:-1]):  # a line under the last layer of each stage
            y = top + cell * cut - 0.5
            parts.append(f'<line x1="{x}" x2="{x + w}" y1="{y}" y2="{y}" stroke="white"/>')
    legend_x = label_w + cell * max(n_steps, 1) + 10
    for s in range(n_stages):
        y = top + 16 * s
        parts.append(
            f'<rect x="{legend_x}" y="{y}" width="12" height="12" '
            f'fill="{_COLOURS[s % len(_COLOURS)]}"/>'
            f'<text x="{legend_x + 16}" y="{y + 10}">stage {s}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)
