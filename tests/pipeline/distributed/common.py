"""What the exactness tests of the distributed runtime share: one launch runs every config.

Each test module lists its configurations per rank count (`configs(n_ranks)`: name ->
arguments of its `train`) and reads rank 0's results; one launch per rank count trains them
all in the same processes, so a module pays the process start-up once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import pipeline
from pipeline import StageContext


def _run(
    ctx: StageContext, train: Callable[..., Any], configs: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    return {name: train(*config) for name, config in configs.items()}


def launch_configs(
    train: Callable[..., Any],
    configs: Mapping[str, tuple[Any, ...]],
    n_ranks: int,
    timeout_s: float = 90,
) -> dict[str, Any]:
    """`train(*config)` for every config, in one launch of `n_ranks` processes: rank 0's
    results by name (every rank returns the same losses; rank 0 holds the full state)."""
    run = functools.partial(_run, train=train, configs=dict(configs))
    return pipeline.launch(run, n_ranks, threads_per_stage=1, timeout_s=timeout_s)[0]
