"""`ElasticPipeline`: the public face of the runtime, one instance in every stage process.

Every rank constructs it with the same arguments and calls `train_step` with the same
batches (SPMD). Rank s becomes stage s: it builds only its own layers, runs its schedule's
action list each step, and the loss is broadcast from the last stage so every rank returns
the same value.

    batch (x, y) ──split into M micro-batches──> stage 0 ──> stage 1 ──> ... ──> loss
                                                     <── gradients ──  <── ...

The plan (stage sizes + a memory action per layer) comes from the planner: with
partition="auto" it is made on the first `train_step`, from a profile of that batch's
shapes; later `rebalance()` (or `rebalance_every`, or a stage running short of its memory
budget) re-plans from measured costs and migrates live (`pipeline.distributed.migration`).

Methods that gather (`train_step`, `repartition`, `rebalance`, `reconfigure`, `stats`,
`full_state_dict`, `save_timeline`) are collectives: call them on every rank in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.distributed import report
from pipeline.distributed.agreement import agree, measured_costs, profile_costs
from pipeline.distributed.migration import (
    MigrationError,
    MigrationRecord,
    inherited_states,
    migrate,
)
from pipeline.distributed.triggers import ReplanTriggers
from pipeline.local.carry import as_carry
from pipeline.local.microbatch import batch_size, split_microbatches
from pipeline.local.profiler import CostCache, optimizer_state_ratio
from pipeline.local.spec import LayerSpec, check_specs
from pipeline.local.stage import LossFn, OptimizerFactory, Stage, StepTimes
from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.partition import bounds, check_sizes, equal_sizes
from pipeline.pure.planner import Plan, Planner, evaluate, get_planner, replan
from pipeline.pure.schedule import (
    Action,
    ScheduleFn,
    forward_only,
    get_schedule,
    stage_actions,
    validate,
)

__all__ = ["ElasticPipeline"]

_DEFAULT_LINK = LinkCost(bandwidth_bytes_per_s=1e9, latency_s=1e-4)  # until one is measured


class ElasticPipeline:
    """A model given as a list of `LayerSpec`s, trained pipeline-parallel over all ranks.

    Args:
        specs: the layers in forward order.
        optimizer: `factory(param_groups) -> Optimizer`, called once per stage with one
            parameter group per layer, e.g. `functools.partial(torch.optim.AdamW, lr=1e-3)`.
        loss_fn: `loss_fn(output, target) -> scalar tensor`, mean-reduced over the batch.
        schedule: "1f1b" (PipeDream-Flush), "gpipe", or a function
            `(n_stages, n_microbatches, stage) -> list[Action]` (see `pipeline.pure.schedule`).
        n_microbatches: micro-batches per step; must divide the batch size.
        seed: with the layer keys, fixes the initial weights and the dropout masks.
        partition: "auto" (planned on the first step), stage sizes, or a `Plan`.
        memory_budget: bytes per stage the plan must fit (parameters, gradients, optimizer
            state and in-flight activations); layers are recomputed where needed.
        planner: "time", "memory" or a `pipeline.pure.planner.Planner`.
        profile: "sandbox" (time each distinct layer once) or "estimate" (FLOPs only).
        cost_cache: measured costs by layer signature, shared across models.
        rebalance_every: re-plan from measured costs every N steps (None: only on demand).
        rebalance_on_drift: re-plan when the stages' measured / predicted compute times
            spread by more than this fraction (e.g. 0.1); see `pipeline.distributed.triggers`.
        device: this stage's device (default: cuda:<local device> under NCCL, else cpu).
    """

    def __init__(
        self,
        specs: Sequence[LayerSpec],
        *,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        schedule: str | ScheduleFn = "1f1b",
        n_microbatches: int = 4,
        seed: int = 0,
        partition: str | Sequence[int] | Plan = "auto",
        memory_budget: int | None = None,
        planner: str | Planner = "time",
        profile: str = "sandbox",
        cost_cache: CostCache | None = None,
        rebalance_every: int | None = None,
        rebalance_on_drift: float | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "ElasticPipeline needs a process group: construct it inside a function run "
                "by pipeline.launch(fn, n_stages=...) or under torchrun"
            )
        self.rank, self.n_stages = dist.get_rank(), dist.get_world_size()
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches must be a positive int, got {n_microbatches!r}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        if memory_budget is not None and memory_budget <= 0:
            raise ValueError(f"memory_budget must be a positive byte count, got {memory_budget}")
        if profile not in ("sandbox", "estimate"):
            raise ValueError(f"profile must be 'sandbox' or 'estimate', got {profile!r}")
        self.schedule = get_schedule(schedule) if isinstance(schedule, str) else schedule
        self.schedule_name = schedule.lower() if isinstance(schedule, str) else None
        validate(self.schedule, self.n_stages, n_microbatches)
        self.n_microbatches = n_microbatches
        self.planner = get_planner(planner) if isinstance(planner, str) else planner
        self.memory_budget, self.profile = memory_budget, profile
        self.triggers = ReplanTriggers(rebalance_every, memory_budget, rebalance_on_drift)
        self.cost_cache = cost_cache if cost_cache is not None else CostCache()
        self.device = _resolve_device(device)
        self._comm_device = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self._actions: list[Action] = stage_actions(
            self.schedule, self.n_stages, n_microbatches, self.rank
        )
        self._opt_ratio = optimizer_state_ratio(optimizer)  # also checks the factory
        self._seed, self._optimizer, self._loss_fn = seed, optimizer, loss_fn
        self._link = _DEFAULT_LINK
        self.generation = 0  # +1 per reconfigure: which model this is
        self.events: list[dict[str, Any]] = []  # the pipeline's life: builds, migrations...
        self._closed = False
        self._setup(specs, partition)

    # -- building a model --------------------------------------------------------------------
    def _setup(self, specs: Sequence[LayerSpec], partition: str | Sequence[int] | Plan) -> None:
        """Validate a model and its partition; build now, or on the first step if "auto"."""
        self.specs = check_specs(specs)
        self.plan: Plan | None = None
        self.sizes: list[int] = []  # layers per stage; [] until planned
        self._stage: Stage | None = None
        self._reset_counters()
        if isinstance(partition, str):
            if partition != "auto":
                raise ValueError(
                    f"partition must be 'auto', stage sizes or a Plan, got {partition!r}"
                )
            equal_sizes(len(self.specs), self.n_stages)  # more stages than layers: fail now
            if self.schedule_name is None:  # the planner needs a named schedule
                self._build(equal_sizes(len(self.specs), self.n_stages))
            return
        if isinstance(partition, Plan):
            self._build(_checked_sizes(partition.sizes, len(self.specs), self.n_stages), partition)
            return
        self._build(_checked_sizes(partition, len(self.specs), self.n_stages))

    def _build(
        self, sizes: list[int], plan: Plan | None = None, costs: list[LayerCost] | None = None
    ) -> None:
        start, stop = bounds(sizes)[self.rank]
        actions = list(plan.actions[start:stop]) if plan is not None else None
        self._stage = Stage(
            self.rank, self.n_stages, self.specs[start:stop], seed=self._seed, device=self.device,
            comm_device=self._comm_device, optimizer=self._optimizer, loss_fn=self._loss_fn,
            actions=actions,
        )  # fmt: skip
        if costs is not None:
            self._stage.seed_meters(costs[start:stop])
        self.sizes, self.plan = list(sizes), plan
        self._plan_step = self.step
        self._measure_next = True  # measure memory on the first step of every plan
        self.partition_history[:] = [(self.step, list(sizes))]
        self._log("build", sizes=list(sizes), plan=None if plan is None else plan.to_dict())

    def _plan_first(self, example: Any) -> None:
        """partition="auto": profile one micro-batch's shapes, plan on rank 0, build."""
        costs = profile_costs(self.specs, example, device=self.device, opt_ratio=self._opt_ratio,
                              cache=self.cost_cache, source=self.profile)  # fmt: skip
        schedule = self.schedule_name
        assert schedule is not None
        plan = agree(lambda: self.planner.plan(
            costs, self.n_stages, schedule=schedule,
            n_microbatches=self.n_microbatches, memory_budget=self.memory_budget,
        ))  # fmt: skip
        self._build(list(plan.sizes), plan, costs)
        if hasattr(self, "_inherit"):
            self._take_inheritance()

    def _reset_counters(self) -> None:
        self.step = 0
        self.version = 0  # plan version: +1 per committed migration
        self.migrations: list[MigrationRecord] = []
        self._history: list[tuple[int, StepTimes]] = []  # (samples, times) per step
        self.partition_history: list[tuple[int, list[int]]] = []

    def _log(self, kind: str, **fields: Any) -> None:
        self.events.append({"generation": self.generation, "step": self.step, "kind": kind,
                            **fields})  # fmt: skip

    # -- training ----------------------------------------------------------------------------
    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on the batch (x, y); returns the mean micro-batch loss."""
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        chunks = split_microbatches(x, self.n_microbatches, "x")
        targets = split_microbatches(y, self.n_microbatches, "y")
        if self._stage is None:
            self._plan_first(chunks[0])
        stage = self._live_stage()
        inputs = [as_carry(c, "the batch input") for c in chunks]
        measure = self._measure_next or self.step % 10 == 0
        self._measure_next = False
        rng = torch.random.get_rng_state()
        try:
            loss_sum, times = stage.run_step(self._actions, self.step, inputs, targets, measure)
        finally:
            torch.random.set_rng_state(rng)
        loss = torch.zeros((), dtype=torch.float64, device=self._comm_device)
        if loss_sum is not None:
            loss.fill_(loss_sum.item() / self.n_microbatches)
        dist.broadcast(loss, src=self.n_stages - 1)
        self.step += 1
        self._history.append((batch_size(x), times))
        self._maybe_rebalance(measure)
        return float(loss.item())

    def forward(self, x: Any) -> Any:
        """Inference on a batch (eval mode, no gradients): the model's output, on every rank.

        The batch is split into as many equal micro-batches as divide it (at most
        n_microbatches), so any batch size works.
        """
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        size = batch_size(x)
        m = max(k for k in range(1, self.n_microbatches + 1) if size % k == 0)
        chunks = [as_carry(c, "the batch input") for c in split_microbatches(x, m, "x")]
        if self._stage is None:
            self._plan_first(chunks[0])
        actions = stage_actions(forward_only, self.n_stages, m, self.rank)
        outputs = self._live_stage().run_forward(actions, chunks)
        result: Any = None
        if self.rank == self.n_stages - 1:
            merged = tuple(torch.cat(parts).cpu() for parts in zip(*outputs, strict=True))
            result = merged[0] if len(merged) == 1 else merged
        box = [result]
        dist.broadcast_object_list(box, src=self.n_stages - 1)
        return box[0]

    def _maybe_rebalance(self, measured: bool) -> None:
        reason = self.triggers.reason(self.step, self._live_stage(), self.plan, measured,
                                      steps_on_plan=self.step - self._plan_step)  # fmt: skip
        if reason is not None:
            self._log("trigger", reason=reason)
            self.rebalance()

    # -- elasticity --------------------------------------------------------------------------
    def repartition(
        self, sizes: Sequence[int], actions: Sequence[str] | None = None
    ) -> MigrationRecord:
        """Move layers live so that stage s holds `sizes[s]` layers; call on every rank.

        Only the layers whose stage changes travel, with their parameters, buffers,
        gradients and optimizer state; the next step computes exactly what it would have
        computed without the move. `actions` optionally sets every layer's memory action.
        On failure the old partition stays in force and `pipeline.MigrationError` is
        raised on every rank.
        """
        stage = self._live_stage()
        new = _checked_sizes(sizes, len(self.specs), self.n_stages)
        try:
            record = migrate(stage, self.specs, self.sizes, new, self.step, self.version + 1)
        except MigrationError as exc:
            self._log("rollback", sizes=list(self.sizes), requested=new, error=str(exc))
            raise
        if actions is not None:
            a, b = bounds(new)[self.rank]
            stage.set_memory_actions(list(actions)[a:b])
        self.sizes, self.version = new, record.version
        if self.plan is not None and list(self.plan.sizes) != new:
            self.plan = None  # explicit sizes: the plan's predictions no longer apply
        self._plan_step = self.step
        self.migrations.append(record)
        self.partition_history.append((self.step, list(new)))
        self._measure_next = True
        if record.bytes_moved and record.pause_s > 0:  # the link as measured by this move
            self._link = LinkCost(record.bytes_moved / record.pause_s)
        self._log("migration", **dataclasses.asdict(record))
        return record

    def rebalance(self, remaining_steps: int = 100) -> MigrationRecord | None:
        """Re-plan from the costs measured while training; migrate if it pays back.

        The new plan is taken only when the time it saves over `remaining_steps` exceeds
        the time to move its layers (or when the current plan breaks the memory budget).
        Returns the migration, or None when the current plan stays.
        """
        stage = self._live_stage()
        costs, actions = measured_costs(stage, len(self.specs))
        current = evaluate(costs, self.sizes, actions, schedule=self.schedule_name or "1f1b",
                           n_microbatches=self.n_microbatches)  # fmt: skip
        decision = agree(lambda: replan(
            current, costs, self.planner, remaining_steps=remaining_steps, link=self._link,
            memory_budget=self.memory_budget,
        ))  # fmt: skip
        self._log("replan", changed=decision.changed, reason=decision.reason,
                  candidate=decision.candidate.to_dict())  # fmt: skip
        self.plan, self._plan_step = decision.plan, self.step
        if not decision.changed:
            return None
        return self.repartition(decision.plan.sizes, decision.plan.actions)

    def reconfigure(
        self,
        specs: Sequence[LayerSpec],
        *,
        partition: str | Sequence[int] | Plan = "auto",
        inherit_weights: bool = False,
        loss_fn: LossFn | None = None,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        """Take the next model on the same processes and process group; call on every rank.

        The old layers are freed and the new ones built on the stages that own them (with
        partition="auto": planned on the next step, from the cost cache where it can); the
        step count restarts at 0, so the new model trains exactly as a fresh pipeline would.
        With `inherit_weights`, a new layer whose key existed before and whose state has
        the same shapes starts from the old layer's weights (fetched from its old stage).
        `loss_fn` and `optimizer`, when given, replace the current ones.
        """
        new_specs = check_specs(specs)
        requests: list[Any] = [None] * self.n_stages
        dist.all_gather_object(requests, [s.key for s in new_specs])
        if any(r != requests[0] for r in requests):
            raise ValueError("ranks passed different models to reconfigure")
        old, old_specs, old_sizes = self._stage, self.specs, self.sizes
        self._loss_fn = loss_fn or self._loss_fn
        if optimizer is not None:
            self._opt_ratio = optimizer_state_ratio(optimizer)
            self._optimizer = optimizer
        self.generation += 1
        pending = inherit_weights and old is not None
        if old is not None and not pending:
            old.close()  # free the old layers before building the new ones
        self._setup(new_specs, partition)
        self._log("reconfigure", layers=[s.key for s in new_specs])
        if pending:
            assert old is not None
            self._inherit = (old, old_specs, old_sizes)
            if self._stage is not None:
                self._take_inheritance()

    def _take_inheritance(self) -> None:
        old, old_specs, old_sizes = self._inherit
        states = inherited_states(old, old_specs, old_sizes, self.specs, self.sizes)
        old.close()
        self._live_stage().load_matching(states)
        del self._inherit

    # -- inspection --------------------------------------------------------------------------
    def stats(self, last_steps: int = 20) -> dict[str, Any]:
        """Throughput, per-stage times and memory, predicted beside measured (a collective).

        Times are medians over the last steps, per step (all micro-batches). Predicted
        numbers come from the plan in force (None before one exists).
        """
        return report.stats(self, self._live_stage(), last_steps)

    def save_partition_picture(self, path: str | Path) -> Path:
        """Write an SVG of which layers lived on which stage, step by step (this model)."""
        return report.save_partition_picture(self, path)

    def save_timeline(self, path: str | Path) -> Path | None:
        """Write the last step of every stage as Chrome-trace JSON (open it in Perfetto).

        A collective: call it on every rank; rank 0 writes the file and returns its path.
        """
        return report.save_timeline(self._live_stage(), path, f"step {self.step - 1}")

    def full_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{layer key: its state dict on CPU}, in layer order, on rank 0; {} on other ranks.

        A collective: call it on every rank.
        """
        stage = self._live_stage()
        mine = {
            layer.key: {k: v.detach().cpu() for k, v in layer.module.state_dict().items()}
            for layer in stage.layers
        }
        gathered: list[Any] = [None] * self.n_stages if self.rank == 0 else []
        dist.gather_object(mine, gathered if self.rank == 0 else None, dst=0)
        if self.rank != 0:
            return {}
        merged = {k: v for part in gathered for k, v in part.items()}
        return {spec.key: merged[spec.key] for spec in self.specs}

    def close(self) -> None:
        """Finish pending messages and free this stage's layers; the pipeline is unusable after."""
        if self._stage is not None:
            self._stage.close()
        self._stage, self._closed = None, True

    def _live_stage(self) -> Stage:
        if self._closed:
            raise RuntimeError("this ElasticPipeline is closed")
        if self._stage is None:
            raise RuntimeError(
                "the pipeline is planned on its first train_step (partition='auto'); "
                "train a step first, or pass explicit stage sizes"
            )
        return self._stage


def _checked_sizes(sizes: Sequence[int], n_layers: int, n_stages: int) -> list[int]:
    if n_stages > n_layers:
        equal_sizes(n_layers, n_stages)  # raises the clear "more stages than layers" error
    return check_sizes(list(sizes), n_layers, n_stages)


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
