"""One model's training on the pipeline runtime: the parts a search trial and a retrain share.

A trial (`nas.study.run`) and a retrain run (`nas.retrain.stage`) both compile an architecture to
layers, build (or reconfigure) an `ElasticPipeline`, stream the task's training batches
through it with the learning-rate schedule (`nas.learning_rate`, which the runtime steps as
its `lr_scheduler=`), and evaluate it with the task's metrics. Every function here is
called on every rank with the same arguments (the runtime's collectives), so every rank sees
the same losses and metrics.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Iterator
from typing import Any

from nas.errors import describe
from nas.learning_rate import LrSchedule
from nas.settings import NasSettings, TrainSettings
from nas.study.checkpoints import RunCheckpoints
from nas.study.phases import Phase, hand_over, timed
from nas.tasks import DecodeShare, Task
from pipeline import (
    CheckpointOptions,
    CostCache,
    ElasticOptions,
    ElasticPipeline,
    InfeasibleBudgetError,
    LayerSpec,
    PipelineError,
    PlanOptions,
    WeightSnapshot,
)
from search_spaces.architecture import Architecture
from search_spaces.compile import compile as compile_arch
from search_spaces.compile import parameter_count

__all__ = [
    "RUN_ERRORS",
    "build",
    "compile_model",
    "evaluate",
    "failure",
    "max_len",
    "measure",
    "planning_input",
    "rates",
    "steps",
]

# what the runtime raises on every rank when a run fails (a layer error, a NaN loss, a
# memory plan that cannot fit): the run is recorded as failed and the next one goes on
RUN_ERRORS = (PipelineError, InfeasibleBudgetError, ValueError, RuntimeError)


def failure(error: BaseException) -> tuple[str, str]:
    """A failed run's one-line reason and the tail of its detail (a stage's traceback)."""
    detail = getattr(error, "detail", "") or "".join(traceback.format_exception_only(error))
    return describe(error), detail[-4000:]


def max_len(task: Task) -> int:
    """Positions the embeddings need: the task's longest sequence (+ BOS/EOS), in tokens
    (`max_tokens`: subword pieces) or characters (`max_chars`)."""
    for longest in ("max_tokens", "max_chars"):
        if hasattr(task, longest):
            return int(getattr(task, longest)) + 2
    return int(getattr(task, "seq_len", 64))


def compile_model(arch: Architecture, task: Task, dropout: float) -> tuple[list[LayerSpec], int]:
    """The architecture's layers for `task`, and its parameter count."""
    length, vocab, source = max_len(task), len(task.vocab), len(task.source_vocab)
    specs = compile_arch(arch, vocab, max_len=length, dropout=dropout, source_vocab_size=source)
    return specs, parameter_count(arch, vocab, max_len=length, source_vocab_size=source)


def rates(train: TrainSettings, total: int | None = None) -> LrSchedule:
    """The learning-rate schedule of a run of `total` steps (default `train.steps`); its
    `optimizer()` is the optimizer factory it scales."""
    return LrSchedule(
        train.lr,
        total or train.steps,
        warmup=train.warmup_steps,
        schedule=train.lr_schedule,
        min_ratio=train.min_lr_ratio,
    )


def build(
    settings: NasSettings,
    task: Task,
    specs: list[LayerSpec],
    schedule: LrSchedule,
    *,
    seed: int,
    pipe: ElasticPipeline | None = None,
    snapshot: WeightSnapshot | None = None,
    checkpoint: CheckpointOptions | None = None,
    cost_cache: CostCache | None = None,
) -> ElasticPipeline:
    """A new pipeline for `specs` trained at `schedule`, or `pipe` reconfigured to them;
    either way with training seed `seed` (initial weights, dropout), weights from
    `snapshot` where keys and shapes match, and `schedule` starting at step 0, or
    (`checkpoint`'s `resume_from`) going on from a checkpoint.
    `cost_cache`: layer costs already measured on this machine (`nas.study.shape`)."""
    p = settings.pipeline
    with timed(Phase.BUILD):
        if pipe is not None or snapshot is not None:
            pipe = pipe or _new_pipeline(settings, task, specs, schedule, seed, None, cost_cache)
            scheduler = _scheduler(schedule, p.schedule)
            pipe.reconfigure(
                specs,
                inherit_from=snapshot,
                lr_scheduler=scheduler,
                checkpoint=checkpoint,
                seed=seed,
            )
        else:
            pipe = _new_pipeline(settings, task, specs, schedule, seed, checkpoint, cost_cache)
        if p.memory_budget is not None:  # planned now, for the largest batch (`planning_input`)
            pipe.plan_for(planning_input(settings, task))
    return pipe


def planning_input(settings: NasSettings, task: Task, *, budgeted: bool | None = None) -> Any:
    """The batch input a model's plan is made for: under `pipeline.memory_budget` the
    task's largest (the budget holds for every batch, not only the first), else its first
    training batch (where the time plan is what matters). The shape (`nas.study.shape`)
    profiles the same input, so a shape it predicts to fit does. `budgeted`: plan as under
    a budget or not (default: as the settings say)."""
    if budgeted is None:
        budgeted = settings.pipeline.memory_budget is not None
    if budgeted:
        x, _ = task.largest_batch(settings.train.batch_size)
    else:
        x, _ = next(iter(task.batches("train", settings.train.batch_size, seed=settings.seed)))
    return x


def _new_pipeline(
    settings: NasSettings,
    task: Task,
    specs: list[LayerSpec],
    schedule: LrSchedule,
    seed: int,
    checkpoint: CheckpointOptions | None,
    cost_cache: CostCache | None,
) -> ElasticPipeline:
    p = settings.pipeline
    return ElasticPipeline(
        specs,
        optimizer=schedule.optimizer(),
        lr_scheduler=_scheduler(schedule, p.schedule),
        loss_fn=task.loss_fn,
        schedule=p.schedule,
        n_microbatches=p.microbatch_count,
        seed=seed,
        planning=PlanOptions(
            planner=p.planner,
            memory_budget=p.memory_budget,
            cost_cache=cost_cache if cost_cache is not None else CostCache(),
        ),
        elastic=ElasticOptions(rebalance_every=p.rebalance_every),
        pipemare=dict(p.pipemare) if p.schedule == "pipemare" else None,
        checkpoint=checkpoint,
    )


def _scheduler(schedule: LrSchedule, pipeline_schedule: str) -> LrSchedule | None:
    """The `lr_scheduler=` of a pipeline: none under PipeMare, whose T1 sets the lr itself
    (the runtime refuses a scheduler there), so only a constant rate runs under it."""
    if pipeline_schedule != "pipemare":
        return schedule
    if schedule.schedule != "constant" or schedule.warmup:
        raise ValueError(
            f"train.lr_schedule={schedule.schedule!r} with train.warmup_steps="
            f"{schedule.warmup} cannot run under pipeline.schedule='pipemare' (its T1 "
            "rescales the lr itself); use train.lr_schedule=constant and train.warmup_steps=0"
        )
    return None


def batches(task: Task, batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
    """The task's training batches, epoch after epoch."""
    epoch = 0
    while True:
        yield from task.batches("train", batch_size, seed=seed, epoch=epoch)
        epoch += 1


def steps(
    pipe: ElasticPipeline,
    source: Iterator[tuple[Any, Any]],
    *,
    start: int,
    count: int,
) -> Iterator[tuple[int, float]]:
    """Train `count` steps from step `start` as one `pipe.train` stream; (step, loss) each.

    The pipeline's lr scheduler moves every layer's rate once per step, right after the
    step's update (step 0 runs at the schedule's rate of step 0); under the stream schedules
    ("2bw") too.
    """
    step, stream = start, pipe.train(itertools.islice(source, count))
    while True:
        with timed(Phase.TRAIN):  # the step alone: not what its caller does between steps
            loss = next(stream, None)
        if loss is None:
            return
        step += 1
        yield step, loss


def evaluate(
    train: TrainSettings,
    task: Task,
    pipe: ElasticPipeline,
    split: str = "validation",
    *,
    final: bool,
) -> dict[str, float]:
    """The task's metrics on `split`, named `<split>_<metric>`: on `train.eval_batches`
    batches and `train.decode_pairs` decoded pairs, or (final) on the whole split and
    `train.final_decode_pairs` pairs; `<split>_s` is what it cost. Every rank calls it."""
    started = time.perf_counter()
    decode = train.final_decode_pairs if final else train.decode_pairs
    with timed(Phase.EVALUATE):
        with timed(Phase.DECODE):
            share = decode_share(task, pipe, decode)
        metrics = task.evaluate(
            pipe.forward,
            split,
            batch_size=train.batch_size,
            max_batches=None if final else train.eval_batches,
            decode=decode,
            share=share,
        )
        hand_over(metrics.get("decode_s", 0.0), Phase.DECODE)
    metrics["s"] = time.perf_counter() - started
    return {f"{split}_{name}": value for name, value in metrics.items()}


def decode_share(task: Task, pipe: ElasticPipeline, decode: int | None) -> DecodeShare | None:
    """How the ranks share an evaluation's decoding: each its share of the pairs, with its
    own replica of the model (`ElasticPipeline.replica`), rather than every pair through
    the pipeline, where each call (one per generated token) waits on every stage. None
    where nothing decodes, on one rank, or where the model's weights do not fit one
    process's `memory_budget`. Every rank calls it."""
    comm = pipe.comm
    if decode == 0 or not task.decoded_metrics or comm.world_size == 1:
        return None
    if pipe.memory_budget is not None:
        held = sum(
            p.numel() * p.element_size() for m in pipe.layers.values() for p in m.parameters()
        )
        [weights] = comm.all_reduce([float(held)])
        if weights > pipe.memory_budget:
            return None
    return DecodeShare(pipe.replica(), comm.rank, comm.world_size, comm.all_gather_object)


def measure(
    settings: NasSettings,
    task: Task,
    schedule: LrSchedule,
    pipe: ElasticPipeline,
    specs: list[LayerSpec],
    seed: int,
    saves: RunCheckpoints | None,
    cost_cache: CostCache | None = None,
) -> tuple[ElasticPipeline, dict[str, float]]:
    """`specs` on `pipe` from scratch at the full budget with training seed `seed` (its
    weights and its data order), or from its checkpoint in `saves`, evaluated once at the
    end; nothing reported: a second measurement of a trial (`nas.study.leading`), whose
    own measurement is the one its pruner and tracker follow."""
    train = settings.train
    checkpoint = saves.options() if saves is not None else None
    pipe = build(
        settings,
        task,
        specs,
        schedule,
        seed=seed,
        pipe=pipe,
        checkpoint=checkpoint,
        cost_cache=cost_cache,
    )
    start = saves.resumed(pipe)[0] if saves is not None else 0
    source = itertools.islice(batches(task, train.batch_size, seed), start, None)
    for step, loss in steps(pipe, source, start=start, count=train.steps - start):
        if saves is not None:
            saves.stepped(pipe, {"step": step, "loss": loss})
    return pipe, evaluate(train, task, pipe, final=True)
