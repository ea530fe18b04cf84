"""`ElasticPipeline`: the public face of the runtime, one instance in every stage process.

Every rank constructs it with the same arguments and calls `train_step` with the same
batches (SPMD). Rank s becomes stage s (under "interleaved_1f1b" and "zbv" it holds several
stages, placed as `pipeline.pure.placement` says): it builds only its own layers, runs its
schedule's action list each step, and the loss is agreed so every rank returns the same
value.

    batch (x, y) ──split into M micro-batches──> stage 0 ──> stage 1 ──> ... ──> loss
                                                     <── gradients ──  <── ...

The plan (stage sizes + a memory action per layer) comes from the planner: with
partition="auto" it is made on the first `train_step`, from a profile of that batch's
shapes; later `rebalance()` (or `rebalance_every`, or a stage running short of its memory
budget) re-plans from measured costs and migrates live (`pipeline.distributed.migration`).

`train(batches)` is a generator of each step's loss: for the flushed schedules a
`train_step` per batch, for PipeDream-2BW ("2bw") one list across the steps without a
flush (`pipeline.distributed.stream`); any other call first drains a stream in flight.

Methods that gather (`train`, `train_step`, `repartition`, `rebalance`, `reconfigure`, `stats`,
`full_state_dict`, `replica`, `save_timeline`, `save_checkpoint`) are collectives: call them
on every rank in order.

This module is the facade: it composes the parts and documents the methods. The work is
done by the parts and by helper modules typed against `pipeline.distributed.parts`: `build`
(planning and building a model), `steps` (a flushed `train_step`, `forward`), `stream`
(2BW's `train`), `elasticity` (repartition, rebalance, reconfigure), `weights` (full state
dict, snapshots, inheritance) and `report` (stats, pictures); the `checkpoints` part
(`pipeline.distributed.checkpoint`) saves, resumes and keeps the per-layer lr schedules in
step with the layers. The package docstring draws which part owns what.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.distributed import build, elasticity, report, steps, stream, tryout, weights
from pipeline.distributed.agreement import measured_costs
from pipeline.distributed.checkpoint import Checkpointer, checked_scheduler
from pipeline.distributed.comm import Comm
from pipeline.distributed.events import EventLog, PipelineEvent
from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.inheritance import WeightSnapshot
from pipeline.distributed.migration import MigrationRecord
from pipeline.distributed.options import (
    CheckpointOptions,
    ElasticOptions,
    NonFinitePolicy,
    OptionViews,
    PipelineOptions,
    PlanOptions,
    moved_argument_error,
)
from pipeline.distributed.parts import ActiveStream
from pipeline.distributed.runner import StepRunner
from pipeline.distributed.triggers import PlanAge, ReplanTriggers
from pipeline.distributed.tryout import PlanTryout
from pipeline.distributed.views import ModelViews
from pipeline.local.lr_schedules import LrSchedulerFactory
from pipeline.local.microbatch import split_microbatches
from pipeline.local.pipemare import PipeMareConfig, check_pipemare
from pipeline.local.recipe import TrainingRecipe
from pipeline.local.replica import Replica
from pipeline.local.spec import LayerSpec, check_specs
from pipeline.local.stage import LossFn, OptimizerFactory, Stage
from pipeline.pure.costs import HOST_LINK, LayerCost, LinkCost
from pipeline.pure.planner import Plan, get_planner
from pipeline.pure.schedule import (
    ScheduleLike,
    ScheduleSpec,
    placement_of,
    spec_of,
    validate,
)
from pipeline.pure.two_bw import check_2bw

__all__ = ["ElasticPipeline"]


class ElasticPipeline(ModelViews, OptionViews):
    """A model given as a list of `LayerSpec`s, trained pipeline-parallel over all ranks.

    Args:
        specs: the layers in forward order.
        optimizer: `factory(param_groups) -> Optimizer`, called once per stage with one
            parameter group per layer, e.g. `functools.partial(torch.optim.AdamW, lr=1e-3)`.
        loss_fn: `loss_fn(output, target) -> scalar tensor`, mean-reduced over the batch.
        schedule: a registered name, a `ScheduleSpec` (`pipeline.get_schedule(name,
            stages_per_rank=v)` for another chunk count) or a builder function
            `(n_stages, n_microbatches, stage) -> list[Action]`. Built in: "1f1b"
            (PipeDream-Flush), "gpipe", "zbh1" (zero bubble: 1F1B's memory, split backwards
            whose weight gradients fill the drain), "interleaved_1f1b" (Megatron's: several
            stages per rank, placed in a loop; 2 by default), "zbv" (zero bubble V: two
            stages per rank placed in a V), "2bw" (PipeDream-2BW: no flush between the steps
            of `train`, two weight versions, step t computes with W(t - 1); needs
            n_microbatches >= n_stages - 1), "pipemare" (asynchronous 1F1B without flushes,
            one weight copy updated every few micro-batches; see `pipemare`), or "auto"
            (with partition="auto": the first step plans 1f1b, zbh1, interleaved_1f1b and zbv
            and keeps the fastest predicted, or tries those the cost model cannot rank for a
            few steps each and keeps the fastest measured, `ElasticOptions.try_plans`,
            and again at the first correction with the plans from measured costs;
            "schedule" and "tryout" events say why).
        n_microbatches: micro-batches per step; must divide the batch size.
        seed: with the layer keys, fixes the initial weights and the dropout masks.
        planning: a `PlanOptions`: the partition ("auto", sizes or a `Plan`), planner,
            memory budget, profile source, cost cache and Bi-Partition's handoff.
        elastic: an `ElasticOptions`: when to re-plan on its own (every N steps, on drift),
            the horizon a migration must pay back over, how often memory is measured.
        device: this stage's device (default: cuda:<local device> under NCCL, else cpu).
        on_nonfinite: "raise" (a NaN or infinite loss raises `NonFiniteLossError` on every
            rank and the step is applied nowhere) or "ignore" (train on).
        pipemare: under schedule="pipemare", a `pipeline.local.pipemare.PipeMareConfig` (or
            a dict of its fields): T1 on/off and its warm-up updates, T2 on/off and its decay,
            update_every (must divide n_microbatches). Default: `PipeMareConfig()`.
        lr_scheduler: `factory(optimizer) -> LRScheduler`, e.g. `lambda opt: StepLR(opt, 10)`:
            every layer's lr follows it, stepped once per training step, across migrations
            and checkpoints (`pipeline.local.lr_schedules`; not under "pipemare").
        checkpoint: a `CheckpointOptions`: save every N steps into a directory (keeping the
            last few), resume from a checkpoint of any partition, schedule or rank count.
        inherit_from: a `WeightSnapshot` to start from, as `reconfigure` takes it (a
            stage pool's resident weights: `PoolContext.resident`).

    Keywords of earlier versions (`memory_budget=`, `rebalance_every=`, `stages_per_rank=`,
    ...) raise a `TypeError` that names the group they moved to.

    Failures: an exception in any stage's layer, loss or optimizer step makes `train_step`
    (or `forward`) raise `pipeline.StageError` on every rank (see
    `pipeline.distributed.executor`); the step is not applied and the pipeline stays usable.
    """

    def __init__(
        self,
        specs: Sequence[LayerSpec],
        *,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        schedule: ScheduleLike = "1f1b",
        n_microbatches: int = 4,
        seed: int = 0,
        planning: PlanOptions | None = None,
        elastic: ElasticOptions | None = None,
        device: torch.device | str | None = None,
        on_nonfinite: NonFinitePolicy = "raise",
        pipemare: PipeMareConfig | dict[str, Any] | None = None,
        lr_scheduler: LrSchedulerFactory | None = None,
        checkpoint: CheckpointOptions | None = None,
        inherit_from: WeightSnapshot | None = None,
        **moved: Any,
    ) -> None:
        if moved:
            raise moved_argument_error(list(moved))
        self.options = PipelineOptions(
            n_microbatches=n_microbatches,
            on_nonfinite=on_nonfinite,
            pipemare=check_pipemare(
                schedule.lower() if isinstance(schedule, str) else None, pipemare, n_microbatches
            ),
            planning=PlanOptions() if planning is None else planning,
            elastic=ElasticOptions() if elastic is None else elastic,
            checkpoint=CheckpointOptions() if checkpoint is None else checkpoint,
        )
        planning = self.options.planning
        self.comm = Comm()
        self.rank = self.comm.rank
        self.auto_schedule = isinstance(schedule, str) and schedule.lower() == "auto"
        if self.auto_schedule:
            if planning.partition != "auto":
                raise ValueError(
                    "schedule='auto' chooses the stages with the partition: it "
                    f"needs partition='auto', got {planning.partition!r}"
                )
            schedule = "1f1b"  # until the first step chooses (`build.plan_first`)
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        self._set_schedule(schedule)
        self._active_stream: ActiveStream | None = None  # a `train` stream in flight
        self.planner = (
            get_planner(planning.planner) if isinstance(planning.planner, str) else planning.planner
        )
        self.triggers = ReplanTriggers(self.options.elastic, planning.memory_budget)
        self.device = torch.device(device) if device is not None else self.comm.data_device
        self.recipe = TrainingRecipe.of(seed, optimizer, loss_fn)  # also checks the factory
        self.checkpoints = Checkpointer.of(lr_scheduler, optimizer, self.pipemare)
        self.link = HOST_LINK  # as the last migration measured it (until then: a guess)
        self.generation = 0  # +1 per reconfigure: which model this is
        self.plan_age = PlanAge()  # when the plan in force began; memory measured then
        self.event_log = EventLog(lambda: (self.generation, self.model.step))  # builds...
        self._closed = False
        self.model = ModelHolder(check_specs(specs), planning.handoff)
        self.trying: PlanTryout | None = None  # plans tried (first steps, the correction)
        resumes = self.options.checkpoint.resume_from is not None
        source = None if inherit_from is None else weights.checked_source(inherit_from, resumes)
        build.setup(self, self.checkpoints.start(self, planning.partition))  # resume_from?
        self.checkpoints.built(self)
        if source is not None:
            weights.start_from(self.comm, self.model, self.event_log, source)

    def adopt_schedule(self, schedule: ScheduleLike) -> None:
        """Run `schedule` from the next build: its placement, stage count, links and list.

        What schedule="auto" does once the first step has chosen
        (`pipeline.pure.planner.choose_schedule`); only while no layer is built."""
        if self.model.built:
            raise RuntimeError("adopt_schedule: the layers are built already; reconfigure first")
        self.runner.close()
        self._set_schedule(schedule)

    def _set_schedule(self, schedule: ScheduleLike) -> None:
        spec = spec_of(schedule)
        if spec.stream and self.pipemare is None:
            check_2bw(self.comm.world_size, self.n_microbatches)
        validate(spec, self.comm.world_size, self.n_microbatches)
        self.schedule: ScheduleSpec = spec
        self.placement = placement_of(spec, self.comm.world_size)
        self.n_stages = self.placement.n_stages  # v per rank (v > 1: interleaved_1f1b, zbv)
        self.runner = StepRunner(self.comm, spec, self.n_microbatches)  # links, list

    @property
    def events(self) -> list[PipelineEvent]:
        """The pipeline's life, oldest first: builds, migrations, re-plans, errors."""
        return self.event_log.events

    # -- training ----------------------------------------------------------------------------
    def train(self, batches: Iterable[tuple[Any, Any]]) -> Iterator[float]:
        """Train on each (x, y) in turn, yielding each step's loss (the same on every rank).

        Under "2bw" the steps run without a flush (`pipeline.distributed.stream`); a failure
        raises `StageError` on every rank from the generator, as `train_step` does.
        """
        if not self.schedule.stream:
            for x, y in batches:
                yield self.train_step(x, y)
            return
        for loss in stream.train(self, batches):
            self.checkpoints.stepped(self)  # CheckpointOptions.every
            yield loss

    def drain(self) -> None:
        """Finish the `train` stream in flight, if any (its cool-down); every rank calls it."""
        segment, self._active_stream = self._active_stream, None
        if segment is not None:
            segment.drain()

    @property
    def active_stream(self) -> ActiveStream | None:
        """The `train` stream in flight (None between streams and under flushed schedules)."""
        return self._active_stream

    def hold_stream(self, segment: ActiveStream | None) -> None:
        """`pipeline.distributed.stream`: `segment` is the stream in flight (None: none is)."""
        self._active_stream = segment

    def plan_for(self, x: Any) -> None:
        """partition="auto": plan and build from the batch input x, unless done already."""
        self.plan_from(split_microbatches(x, self.n_microbatches, "x")[0])

    def plan_from(self, example: Any) -> None:
        """partition="auto": plan and build from one micro-batch's input, unless built."""
        if not self.model.built:
            self.trying = build.plan_first(self, example)
            self.checkpoints.built(self)

    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on the batch (x, y); returns the mean micro-batch loss."""
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        if self.schedule.stream:  # a stream of one step (after any stream in flight)
            self.drain()
            loss = next(iter(list(stream.train(self, [(x, y)]))))
        else:
            started = time.perf_counter()
            loss, measured = steps.train_step(self, x, y)
            if self.trying is None:  # a first plan's correction may try other schedules
                self.trying = elasticity.maybe_rebalance(self, measured)
            else:  # the plans tried on the first steps (`pipeline.distributed.tryout`)
                self.trying.after_step(self, time.perf_counter() - started, measured)
                self.trying = None if self.trying.done else self.trying
        self.checkpoints.stepped(self)  # CheckpointOptions.every
        return loss

    def forward(self, x: Any) -> Any:
        """Inference on a batch (eval mode, no gradients): the model's output, on every rank.

        The batch is split into as many equal micro-batches as divide it (at most
        n_microbatches), so any batch size works.
        """
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        return steps.forward(self, x)

    # -- elasticity --------------------------------------------------------------------------
    def repartition(
        self,
        sizes: Sequence[int],
        actions: Sequence[str] | None = None,
        handoff: Sequence[int] | None = None,
    ) -> MigrationRecord:
        """Move layers live so that stage s holds `sizes[s]` layers; call on every rank.

        Only the layers whose stage changes travel, with their parameters, buffers,
        gradients and optimizer state; the next step computes exactly what it would have
        computed without the move. `actions` optionally sets every layer's memory action,
        `handoff` Bi-Partition's cut for the new sizes (default: none). On failure the old
        partition stays in force and `pipeline.MigrationError` is raised on every rank.
        """
        self.drain()
        self.checkpoints.moving(self)  # the layers' lr schedules travel with them
        try:
            record = elasticity.repartition(self, sizes, actions, handoff)
        finally:
            self.checkpoints.moved(self)
        if record.bytes_moved and record.pause_s > 0:  # the link as this move measured it
            self.link = LinkCost(record.bytes_moved / record.pause_s)
        return record

    def switch_plan(self, plan: Plan) -> None:
        """Run this model under `plan` from the next step, exactly where it is: its schedule
        (any exact one), partition and memory actions; call on every rank. The state goes
        through a checkpoint in `CheckpointOptions.directory`, or in a temporary folder
        (ranks on several machines need a directory they all see). What `try_plans`
        does to choose among plans (`pipeline.distributed.tryout`)."""
        directory = self.options.checkpoint.directory
        saved = self.save_checkpoint(tryout.switch_folder(self.comm, directory, self.step))
        old = self.model
        old.close()
        self.model = ModelHolder(old.specs, None)
        self.adopt_schedule(plan.schedule)
        self.checkpoints.reset()
        build.setup(self, self.checkpoints.start(self, plan, resume_from=saved))
        self.checkpoints.built(self)
        self.model.set_signatures(old.signatures)
        self.event_log.record("switch", plan=plan.to_dict())
        tryout.forget_switch(self.comm, saved, temporary=directory is None)

    def rebalance(self, remaining_steps: int | None = None) -> MigrationRecord | None:
        """Re-plan from the costs measured while training; migrate if it pays back.

        The new plan is taken only when the time it saves over `remaining_steps` (default:
        `rebalance_horizon`) exceeds the time to move its layers (or when the current plan
        breaks the memory budget). Returns the migration, or None when the current plan stays.
        """
        return elasticity.rebalance(self, remaining_steps)[0]

    def reconfigure(
        self,
        specs: Sequence[LayerSpec],
        *,
        partition: str | Sequence[int] | Plan = "auto",
        inherit_weights: bool = False,
        inherit_from: WeightSnapshot | None = None,
        loss_fn: LossFn | None = None,
        optimizer: OptimizerFactory | None = None,
        lr_scheduler: LrSchedulerFactory | None = None,
        checkpoint: CheckpointOptions | None = None,
        seed: int | None = None,
    ) -> None:
        """Take the next model on the same processes and process group; call on every rank.

        The old layers are freed and the new ones built on the stages that own them (with
        partition="auto": planned on the next step, from the cost cache where it can); the
        step count restarts at 0, so the new model trains exactly as a fresh pipeline would.
        With `inherit_weights`, a new layer whose key existed before starts from the old
        layer's weights (fetched from its old stage), tensor by tensor where a tensor's name
        and shape match (the others stay fresh); with `inherit_from` (a `snapshot()` of an
        earlier model, taken on every rank; `snapshot.without(prefixes)` leaves tensors
        fresh on purpose), from that model's weights instead. An "inherit" event records
        what was taken.
        `loss_fn`, `optimizer`, `lr_scheduler` and `seed` (initial weights and dropout),
        when given, replace the current ones for this model and the next (a new
        `lr_scheduler` needs the pipeline built with one: a schedule of the new model's
        length, say).
        `checkpoint`, when given, replaces the checkpoint options for the new model: where it
        saves automatically, and a checkpoint of this model to go on from (`resume_from`): its
        weights, optimizer and lr schedule state and step, exactly as a new pipeline built
        with it would (the starting weights then come from there: no inheritance).
        """
        scheduler = checked_scheduler(
            lr_scheduler, optimizer or self.recipe.optimizer, self.pipemare
        )
        new_specs, source = elasticity.next_model(
            self, specs, inherit_weights, inherit_from, checkpoint
        )
        self.recipe = self.recipe.changed(optimizer=optimizer, loss_fn=loss_fn, seed=seed)
        self.generation += 1
        self.model.close()  # free the old layers before building the new ones
        self.model = ModelHolder(new_specs, None)  # a Plan may carry a handoff
        self.trying = None
        self.checkpoints.reset(scheduler)
        if checkpoint is not None:
            self.options = dataclasses.replace(self.options, checkpoint=checkpoint)
            partition = self.checkpoints.start(self, partition)  # resume_from?
        build.setup(self, partition)
        self.checkpoints.built(self)
        self.event_log.record("reconfigure", layers=[s.key for s in new_specs])
        if source is not None:
            weights.start_from(self.comm, self.model, self.event_log, source)

    def snapshot(self) -> WeightSnapshot:
        """This rank's layers' weights (CPU copies) with the model's keys and partition, to
        start a later model from (`reconfigure(..., inherit_from=snapshot)`); every rank
        takes its own, after at least one step."""
        if not self.model.built:
            raise RuntimeError("nothing to snapshot before the first step builds the layers")
        self.drain()
        return weights.snapshot(self.model, copy=True)

    def save_checkpoint(self, path: str | Path) -> Path:
        """Write every layer's weights, optimizer and lr scheduler state (keyed by layer key),
        the step, plan and cost cache to the folder `path` (a collective); returns it.

        Atomic: a failure (`pipeline.CheckpointError` on every rank) leaves a checkpoint there
        intact. `CheckpointOptions(resume_from=path)` resumes it under any partition, schedule
        or number of ranks (`pipeline.distributed.checkpoint`)."""
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        return self.checkpoints.save(self, path)

    # -- inspection --------------------------------------------------------------------------
    def stats(self, last_steps: int = 20) -> report.PipelineStats:
        """Throughput, per-stage times and memory, predicted beside measured (a collective).

        Times are medians over the last `last_steps` steps (a positive int), per step (all
        micro-batches). Predicted numbers come from the plan in force (None before one
        exists). Returns a frozen `pipeline.PipelineStats`; `.to_dict()` gives JSON values.
        """
        return report.stats(self, self._live_stages(), last_steps)

    def save_partition_picture(self, path: str | Path) -> Path:
        """Write an SVG of which layers lived on which stage, step by step (this model)."""
        return report.save_partition_picture(self.model, path)

    def save_timeline(self, path: str | Path) -> Path | None:
        """Write the last step of every stage as Chrome-trace JSON (open it in Perfetto).

        A collective: call it on every rank; rank 0 writes the file and returns its path.
        """
        return report.save_timeline(self.comm, self._live_stages(), path, f"step {self.step - 1}")

    def full_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{layer key: its state dict on CPU}, in layer order, on rank 0; {} on other ranks.

        A collective: call it on every rank. Before the first step of a planned model
        (partition="auto") the layers do not exist yet; their initial weights depend only on
        the seed and their key, so the ranks build them in turns and hand over the states.
        """
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        self.drain()
        return weights.full_state_dict(self.comm, self.model, self.recipe.seed)

    def replica(self) -> Replica:
        """The whole model on this rank, in eval mode, with the current weights: a collective,
        every rank gets its own (`pipeline.local.replica`), e.g. to decode a share of the
        examples each, without the pipeline. It holds every parameter of the model."""
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        self.drain()
        seed = self.recipe.seed
        states = weights.full_state_dict(self.comm, self.model, seed, everywhere=True)
        return Replica(self.specs, states, seed, self.device)

    def layer_costs(self) -> tuple[list[LayerCost], list[str]]:
        """Every layer's measured costs and memory action, in layer order (a collective)."""
        return measured_costs(self.comm, self._live_stages(), len(self.specs))

    def close(self) -> None:
        """Finish pending messages and free this stage's layers; the pipeline is unusable after."""
        if not self._closed:
            self.drain()
        self.runner.close()
        self.model.close()
        self._closed = True

    def _live_stages(self) -> list[Stage]:
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        return self.model.live_stages()
