"""A picture of a study's trade-off: every trial on two objectives, the Pareto front marked.

Trackers attach it to the study (the W&B study run logs it as an image) so a multi-objective
study shows its front without a notebook. Drawn with matplotlib's object API on the Agg
canvas: no pyplot, no global backend change, nothing shown on screen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["numeric_pairs", "save_pareto_plot"]


def numeric_pairs(rows: Sequence[Mapping[str, Any]], x: str, y: str) -> list[tuple[float, float]]:
    """(row[x], row[y]) of the rows where both are finite numbers (booleans excluded)."""
    pairs = []
    for row in rows:
        a, b = row.get(x), row.get(y)
        if isinstance(a, bool) or isinstance(b, bool):
            continue
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        if math.isfinite(a) and math.isfinite(b):
            pairs.append((float(a), float(b)))
    return pairs


def save_pareto_plot(
    trials: Sequence[Mapping[str, Any]],
    front: Sequence[Mapping[str, Any]],
    x: str,
    y: str,
    path: str | Path,
    title: str = "Pareto front",
) -> Path | None:
    """Save a PNG scatter of `trials` on columns `x` and `y` with the `front` rows marked.

    Returns the path, or None when nothing can be drawn (no trial has both values as
    finite numbers, or matplotlib is not installed).
    """
    points = numeric_pairs(trials, x, y)
    best = sorted(numeric_pairs(front, x, y))
    if not points and not best:
        return None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(6, 4.5), layout="constrained")
    axes = figure.add_subplot()
    if points:
        axes.scatter(
            [p[0] for p in points], [p[1] for p in points], s=18, color="0.6", label="trials"
        )
    if best:
        axes.plot(
            [p[0] for p in best], [p[1] for p in best], marker="o", color="C3", label="Pareto front"
        )
    axes.set_xlabel(x)
    axes.set_ylabel(y)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    return path
