"""One measurement of `search_throughput.py`, in a process of its own (pinned to its cores
by the driver): a candidate trained by a plain PyTorch loop or by the harness's own trial
pipeline, its samples per second.

Why it exists: `search_throughput.py` is the driver (it starts these as
`search_throughput.py --one plain|harness`, side by side, and reports); what one process
measures is this module's.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from common import experiment_settings


def architecture(name: str) -> Any:
    from nas.study.space import configured_space
    from search_spaces.evolved_transformer import evolved_transformer

    if name == "large_evolved_transformer":
        return evolved_transformer(128, n_heads=4, n_enc=3, n_dec=3)
    return configured_space(experiment_settings("search_2h", [])).seeds()[name]


def _samples_per_s(
    train: Callable[[Any, Any], object], source: Iterator[Any], warmup: int, steps: int, batch: int
) -> float:
    """`warmup` then `steps` steps of `train` on the batches of `source`, each timed alone
    (the batch fetched outside the timing): samples per second at the median step."""
    times = []
    for step in range(warmup + steps):
        x, y = next(source)
        started = time.perf_counter()
        train(x, y)
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return batch / statistics.median(times)


def plain(model: str, threads: int, steps: int, warmup: int) -> float:
    from nas.study import training
    from nas.tasks import get_task
    from pipeline.local.spec import build_layer

    torch.set_num_threads(threads)
    settings = experiment_settings("search_2h", [])
    task = get_task("translation")
    specs, _ = training.compile_model(architecture(model), task, settings.train.dropout)
    layers = [build_layer(spec, 0, torch.device("cpu")) for spec in specs]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = training.rates(settings.train).optimizer()([{"params": params}])
    source = training.batches(task, settings.train.batch_size, 0)

    def train(x: Any, y: Any) -> None:
        out = x
        for layer in layers:
            out = layer(out)
        loss = task.loss_fn(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return _samples_per_s(train, source, warmup, steps, settings.train.batch_size)


def _harness_stage(ctx: Any, model: str, settings: Any, steps: int, warmup: int) -> float:
    from nas.study import shape, training
    from nas.tasks import get_task

    task = get_task("translation")
    specs, _ = training.compile_model(architecture(model), task, settings.train.dropout)
    schedule = training.rates(settings.train)
    pipe = training.build(settings, task, specs, schedule, seed=0, cost_cache=shape.load_cache())
    source = training.batches(task, settings.train.batch_size, 0)
    rate = _samples_per_s(pipe.train_step, source, warmup, steps, settings.train.batch_size)
    pipe.close()
    return rate


def harness(model: str, shape: tuple[int, int, int, int], steps: int, warmup: int) -> float:
    import pipeline

    _, stages, threads, microbatches = shape
    settings = experiment_settings(
        "search_2h",
        [
            f"pipeline.n_stages={stages}",
            f"pipeline.threads_per_stage={threads}",
            f"pipeline.n_microbatches={microbatches}",
            "study.workers=1",
        ],
    )
    run = functools.partial(
        _harness_stage, model=model, settings=settings, steps=steps, warmup=warmup
    )
    return float(pipeline.launch(run, stages, threads_per_stage=threads, timeout_s=900)[0])
