"""An architecture as a picture: each cell's blocks, branches and where they read from.

The one-line `summary` of an architecture is exact but hard to take in; a user comparing
the best model with the seeds would rather look. One panel per cell (encoder, decoder):
the hidden states run down the left edge (state 0 is the cell input), block i is a row with
its left and right branch and their combiner, and draws state i + 1. An arrow runs from the
state a branch reads to the branch; the states no branch reads are summed into the cell's
output (marked). Drawn with matplotlib's object API on the Agg canvas.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from search_spaces.architecture import Architecture, Cell, branch_text, cell_outputs

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["save_architecture"]

_COMBINER = {"add": "+", "multiply": "*", "concat": "concat"}


def save_architecture(arch: Architecture, path: str | Path) -> Path:
    """Write a PNG of `arch`'s cells to `path`; returns the path."""
    from matplotlib.figure import Figure

    cells = [
        ("encoder", arch.encoder_cells, arch.encoder),
        ("decoder", arch.decoder_cells, arch.decoder),
    ]
    shown = [(name, n, cell) for name, n, cell in cells if cell is not None]
    rows = max(len(cell.blocks) for _, _, cell in shown) + 2
    figure = Figure(figsize=(6.5 * len(shown), 0.62 * rows + 1.2), layout="constrained")
    axes = figure.subplots(1, len(shown), squeeze=False)[0]
    for ax, (name, n, cell) in zip(axes, shown, strict=True):
        _draw_cell(ax, cell, f"{name} cell x{n} (d_model={arch.d_model})", rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    return path


def _draw_cell(ax: Axes, cell: Cell, title: str, rows: int) -> None:
    outputs = set(cell_outputs(cell))
    box = {"boxstyle": "round,pad=0.25", "fc": "#e8f0fe", "ec": "#3b6fd8"}
    state_box = {"boxstyle": "circle,pad=0.25", "fc": "#fff4d6", "ec": "#b8860b"}
    out_box = {"boxstyle": "circle,pad=0.25", "fc": "#ffd6d6", "ec": "#c0392b"}
    for i in range(len(cell.blocks) + 1):
        style = out_box if i in outputs else state_box
        ax.text(0, -i, str(i), ha="center", va="center", bbox=style, fontsize=9)
    for i, block in enumerate(cell.blocks):
        y = -(i + 1)
        for x, branch in ((2.2, block.left), (5.2, block.right)):
            if branch.dead:
                continue
            ax.annotate(
                "",
                xy=(x - 1.1, y + 0.15),
                xytext=(0.25, -branch.input),
                arrowprops={"arrowstyle": "->", "color": "0.5", "lw": 0.8},
            )
            ax.text(
                x, y + 0.15, branch_text(branch), ha="center", va="center", bbox=box, fontsize=8
            )
        live = [b for b in block.branches if not b.dead]
        if len(live) == 2:
            ax.text(7.4, y + 0.15, _COMBINER[block.combiner], ha="center", va="center", fontsize=9)
        ax.annotate(
            "",
            xy=(0.25, y),
            xytext=(7.0, y + 0.05),
            arrowprops={
                "arrowstyle": "->",
                "color": "#b8860b",
                "lw": 0.6,
                "connectionstyle": "arc3,rad=0.15",
            },
        )
    ax.set_xlim(-0.8, 8.2)
    ax.set_ylim(-rows + 0.5, 0.8)
    ax.set_title(f"{title}\nred: summed into the cell output", fontsize=10)
    ax.axis("off")
