"""One pipeline's shape chosen among the cost model's leading ones by a few measured steps.

The shape of a pipeline that has the machine to itself (a retraining) is predicted from its
layers profiled one at a time (`nas.study.shape`), and on small models the errors between
shapes exceed the differences it ranks them by. Measured on 2 cores, one 71k-parameter
model under the small study's 1.6 MB budget:

    shape                          predicted   measured (samples/s)
    1 stage  x 2 threads, M=4      268         78-100 in the retraining, 166 alone
    2 stages x 1 thread,  M=2      228-235     245 in the retraining, 248 alone
    1 stage  x 1 thread,  M=4      180         242 alone

So before a run long enough to pay for it, the shapes predicted within `SHARE` of the
best (at most `CONTENDERS`, the best first) each train `STEPS` steps of the first model from
scratch, one shape after the other, in stage processes of their own; the fastest median
step after `WARMUP` (the first step measures memory and layers: slower by design) is kept.
A measurement that overturns the prediction (another shape faster than the best predicted)
is taken once more, every contender again, before it is believed: each contender's steps
run within a second or two, and a spell of a slower machine then weighs on one shape alone
(on 2 cores, 2 stages measured 0.164 s a step in one run and 0.101-0.108 in three others,
and the 1-stage shape it lost to trained 50% slower).

A measurement costs each contender a launch, a build and its first, profiling steps
(`LAUNCH_S`) besides its steps: 4.6 s for two contenders of the first command's 71k-parameter
model, whose retraining trains 26 s. So the contenders are measured only when that cost is
at most what the run ahead may lose to a wrong shape (`worth_measuring`): the prediction's
own error of the best where every contender splits the model and the cores as the best
does (only the micro-batches differ: 0.132 against 0.133 s a step, measured), and
`STRUCTURE_MISS` of it where one splits them otherwise (the table above):

    resolve -> shapes by prediction -> contenders A, B
            -> launch A: steps -> launch B: steps -> B faster? -> A, B again
            -> the fastest median over all its steps
"""

from __future__ import annotations

import functools
import itertools
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from nas.settings import NasSettings
from nas.study import shape, training
from nas.study.shape import ShapeChoice
from nas.tasks import get_task
from pipeline import StageContext, launch
from pipeline.pure.shape import Shape
from search_spaces.architecture import Architecture, from_json, to_json

__all__ = [
    "CONTENDERS",
    "LAUNCH_S",
    "SHARE",
    "STEPS",
    "STRUCTURE_MISS",
    "WARMUP",
    "contenders",
    "fastest",
    "overturned",
    "worth_measuring",
]

logger = logging.getLogger(__name__)

SHARE = 0.5  # the cost model has been off by 2.7x between shapes: a wide window
CONTENDERS = 2  # the best and its runner-up: each costs a few steps of the run
WARMUP, STEPS = 2, 6  # steps not timed, steps in all
LAUNCH_S = 1.5  # a contender's measurement besides its steps (2.3 s at 6 steps of 0.13 s)
STRUCTURE_MISS = 0.5  # what a shape of other stages or threads may save of a run (module doc)


def contenders(choice: ShapeChoice, share: float = SHARE, most: int = CONTENDERS) -> list[Shape]:
    """The one-worker shapes `choice` weighed that are predicted at least `share` of its
    best's samples/s, the best first, at most `most` (module doc)."""
    if not 0.0 < share <= 1.0:
        raise ValueError(f"share={share!r}: a share in (0, 1]")
    rows = [r for r in choice.tried if r["workers"] == 1 and r["predicted_samples_per_s"] > 0]
    rows.sort(key=lambda r: -r["predicted_samples_per_s"])
    best = choice.predicted_samples_per_s
    kept = [r for r in rows if r["predicted_samples_per_s"] >= share * best][:most]
    return [Shape(1, r["n_stages"], r["threads_per_stage"], r["n_microbatches"]) for r in kept]


def worth_measuring(
    choice: ShapeChoice, shapes: Sequence[Shape], batch_size: int, run_steps: int, error: float
) -> bool:
    """Whether measuring `shapes` (the best predicted first) costs at most what `run_steps`
    steps on the best may lose to a wrong prediction: `error` of them where every contender
    has the best's stages and threads, else `STRUCTURE_MISS` (module doc); each step at the
    shape's predicted samples/s."""
    rates = {
        (r["n_stages"], r["threads_per_stage"], r["n_microbatches"]): r["predicted_samples_per_s"]
        for r in choice.tried
        if r["workers"] == 1
    }
    step_s = {
        s: batch_size / rates[s.n_stages, s.threads_per_stage, s.n_microbatches] for s in shapes
    }
    cost_s = sum(LAUNCH_S + STEPS * step_s[s] for s in shapes)
    best = shapes[0]
    same = all(
        (s.n_stages, s.threads_per_stage) == (best.n_stages, best.threads_per_stage) for s in shapes
    )
    return cost_s <= (error if same else STRUCTURE_MISS) * run_steps * step_s[best]


def fastest(
    settings: NasSettings, choice: ShapeChoice, arch: Architecture, run_steps: int
) -> tuple[Shape, dict[str, float]]:
    """`choice`'s contender that trains `arch` fastest when measured (module doc), and the
    median seconds of a step each took; `choice.shape` untried when it has no rival or the
    `run_steps` steps ahead would not pay for measuring them (`worth_measuring`)."""
    shapes = contenders(choice)
    if len(shapes) < 2:
        return choice.shape, {}
    error = shape.load_cache().errors.error
    if not worth_measuring(choice, shapes, settings.train.batch_size, run_steps, error):
        logger.info(
            "shape: %s kept unmeasured: measuring %d contenders would cost more than the "
            "%d steps ahead may lose to it",
            choice.shape,
            len(shapes),
            run_steps,
        )
        return choice.shape, {}

    def measured(candidate: Shape) -> list[float]:
        return _measure(shape.with_shape(settings, candidate), arch)

    steps = {s: measured(s) for s in shapes}
    if overturned(steps, shapes[0]):
        logger.info("shape: the measurement overturns the prediction; measuring again")
        for candidate in shapes:
            steps[candidate] += measured(candidate)
    seconds = {str(s): statistics.median(steps[s]) for s in shapes}
    kept = min(shapes, key=lambda s: seconds[str(s)])
    logger.info(
        "shape: measured %s; kept %s",
        ", ".join(f"{name} {s:.3f} s a step" for name, s in seconds.items()),
        kept,
    )
    return kept, seconds


def overturned(steps: Mapping[Shape, Sequence[float]], predicted: Shape) -> bool:
    """Whether another shape's median step is shorter than that of `predicted`, the shape
    predicted fastest (module doc)."""
    medians = {s: statistics.median(seconds) for s, seconds in steps.items()}
    return min(medians.values()) < medians[predicted]


def _measure(settings: NasSettings, arch: Architecture) -> list[float]:
    """The steps of `arch` after `WARMUP` on `settings`' shape, in processes started for it."""
    p = settings.pipeline
    assert isinstance(p.n_stages, int) and isinstance(p.threads_per_stage, int)
    return launch(
        functools.partial(_timed, settings=settings, arch=to_json(arch)),
        p.n_stages,
        threads_per_stage=p.threads_per_stage,
        timeout_s=settings.pipeline.timeout_s,
    )[0]


def _timed(ctx: StageContext, settings: NasSettings, arch: str) -> list[float]:
    """Every rank: build the model from scratch and train `STEPS` steps; rank 0's steps
    after `WARMUP` (module-level: pickled by name)."""
    task = get_task(settings.task.name, **settings.task.options)
    specs = training.compile_model(from_json(arch), task, settings.train.dropout)[0]
    pipe = training.build(
        settings,
        task,
        specs,
        training.rates(settings.train, STEPS),
        seed=settings.seed,
        cost_cache=shape.load_cache(),
    )
    try:
        seconds = [_step(pipe, batch) for batch in _batches(task, settings)]
    finally:
        pipe.close()
    return seconds[WARMUP:]


def _batches(task: Any, settings: NasSettings) -> Sequence[Any]:
    """The first `STEPS` training batches (over as many epochs as a small split needs)."""
    size, seed = settings.train.batch_size, settings.seed
    epochs = (task.batches("train", size, seed=seed, epoch=e) for e in itertools.count())
    return list(itertools.islice(itertools.chain.from_iterable(epochs), STEPS))


def _step(pipe: Any, batch: Any) -> float:
    started = time.perf_counter()
    pipe.train_step(*batch)
    return time.perf_counter() - started
