"""The harness's progress bars, one look for the study, its trials and the retraining.

`rich` draws them on the terminal (and stays quiet when the output is not one); each bar is
its description, the bar, done / total and the time elapsed.
"""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = ["progress_bars"]


def progress_bars(unit: str = "", *, show: bool = True) -> Progress:
    """A `Progress` (not started) whose counts read "done/total unit"; `show=False`: one
    that draws nothing (a worker whose caller shows the study's bar, `nas.study.workers`)."""
    count = "{task.completed}/{task.total}" + (f" {unit}" if unit else "")
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn(count),
        TimeElapsedColumn(),
        disable=not show,
    )
