"""The picture of `pipemare.py`: the pipeline's training curves, the validation loss of
every mode per seed, and the three modes over the learning rates.

Why it exists: `pipemare.py` trains and writes the JSON; drawing it (matplotlib, imported
only when a picture is drawn) is apart, which also keeps `pipemare.py` loadable alone, as
`tests/pipeline/local/test_pipemare_convergence.py` loads it.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
from typing import Any


def plot(path: pathlib.Path, args: argparse.Namespace, result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), width_ratios=(2, 1, 1))
    plot_curves(axes[0], args, result.get("pipeline", {}))
    plot_seeds(axes[1], args, result["reference"])
    if "lr_sweep" in result:
        plot_rates(axes[2], result["lr_sweep"])
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=100)


def plot_curves(ax: Any, args: argparse.Namespace, runs: dict[str, Any]) -> None:
    for mode, run in runs.items():
        smooth = [
            statistics.fmean(run["losses"][max(0, i - 4) : i + 1])
            for i in range(len(run["losses"]))
        ]
        line = ax.plot(smooth, lw=1.5, label=f"{mode} (validation {run['val']:.3f})")[0]
        ax.plot(run["losses"], lw=0.5, alpha=0.3, color=line.get_color())
    ax.set(
        xlabel=f"step ({args.microbatches} micro-batches = {args.microbatches} updates)",
        ylabel="training loss (5-step mean)",
        title=f"pipeline, {args.stages} stages, SGD lr {args.lr} cosine, seed 1",
    )
    if runs:
        ax.legend()


def plot_seeds(ax: Any, args: argparse.Namespace, table: dict[str, Any]) -> None:
    modes = list(table["val"])  # every mode, in `pipemare.MODES`' order
    for i, mode in enumerate(modes):
        ax.scatter([i] * len(table["val"][mode]), table["val"][mode], s=14)
    ax.set_xticks(range(len(modes)), modes)
    ax.set(ylabel="validation loss", title=f"lr {args.lr}, {len(table['seeds'])} seeds (reference)")


def plot_rates(ax: Any, sweep: dict[str, Any]) -> None:
    lrs = [float(lr) for lr in sweep["mean"]]
    for mode in ("sync", "pipemare", "async"):
        ax.plot(lrs, [means[mode] for means in sweep["mean"].values()], marker="o", label=mode)
    ax.set_xticks(lrs, [f"{lr:g}" for lr in lrs])
    ax.set(
        xlabel="base learning rate",
        ylabel="validation loss",
        title=f"mean of {len(sweep['seeds'])} seeds (reference)",
    )
    ax.legend()
