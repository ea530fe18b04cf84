"""One flushed training step and one inference pass of the whole pipeline, batch in, result out.

Kept apart from `pipeline.distributed.elastic` so the facade stays short; its `train_step`
(for the flushed schedules: gpipe, 1f1b, zbh1) and `forward` delegate here, as its `train`
does to `pipeline.distributed.stream` for the stream schedules. Both split the batch into
micro-batches, plan and build on the first call of a partition="auto" model
(`pipeline.distributed.build`) and run this stage's action list
(`pipeline.distributed.runner`). A training step then counts itself, records its times
for `stats` and lets the re-plan triggers look at it (`pipeline.distributed.elasticity`).
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.distributed import report
from pipeline.distributed.parts import SteppedPipeline
from pipeline.errors import PipelineError
from pipeline.local.carry import as_carry, unwrap
from pipeline.local.microbatch import batch_size, split_microbatches

__all__ = ["forward", "train_step"]


def train_step(pipe: SteppedPipeline, x: Any, y: Any) -> tuple[float, bool]:
    """One optimizer step on (x, y) under a flushed schedule: the mean micro-batch loss, and
    whether the step measured memory (for the re-plan triggers)."""
    chunks = split_microbatches(x, pipe.options.n_microbatches, "x")
    targets = split_microbatches(y, pipe.options.n_microbatches, "y")
    pipe.plan_from(chunks[0])
    model = pipe.model
    stages = model.live_stages()
    inputs = [as_carry(c, "the batch input") for c in chunks]
    elastic = pipe.options.elastic
    measure = pipe.plan_age.measures(
        model.step, elastic.measure_memory_every, elastic.rebalance_every
    )
    rng = torch.random.get_rng_state()
    try:
        loss, times = pipe.runner.train_step(
            stages,
            model.step,
            inputs,
            targets,
            measure_memory=measure,
            on_nonfinite=pipe.options.on_nonfinite,
        )
    except PipelineError as error:  # raised on every rank; nothing is in flight
        for stage in stages:
            stage.abort_step()
        pipe.event_log.record("error", error=str(error).split("\n", 1)[0])
        raise
    finally:
        torch.random.set_rng_state(rng)
    pipe.plan_age.measured()
    model.stepped(batch_size(x), report.token_count(x), times)
    return loss, measure


def forward(pipe: SteppedPipeline, x: Any) -> Any:
    """The model's output on the batch x (eval mode, no gradients), on every rank."""
    pipe.drain()
    size = batch_size(x)
    m = max(k for k in range(1, pipe.options.n_microbatches + 1) if size % k == 0)
    chunks = [as_carry(c, "the batch input") for c in split_microbatches(x, m, "x")]
    pipe.plan_from(chunks[0])
    return unwrap(pipe.runner.infer(pipe.model.live_stages(), pipe.model.step, chunks))
