"""`ElasticPipeline`: the public face of the runtime, one instance in every stage process.

Every rank constructs it with the same arguments and calls `train_step` with the same
batches (SPMD). Rank s becomes stage s: it builds only its own layers, runs its schedule's
action list each step, and the loss is broadcast from the last stage so every rank returns
the same value.

    batch (x, y) ──split into M micro-batches──> stage 0 ──> stage 1 ──> ... ──> loss
                                                     <── gradients ──  <── ...

Methods that gather (`train_step`, `stats`, `full_state_dict`) are collectives: call them on
every rank in the same order.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from pipeline.comm import Carry, as_carry
from pipeline.migrate import MigrationError, MigrationRecord, inherited_states, migrate
from pipeline.partition import bounds, check_sizes, equal_sizes
from pipeline.schedule import Action, ScheduleFn, get_schedule, stage_actions, validate
from pipeline.spec import LayerSpec, check_specs
from pipeline.stage import LossFn, OptimizerFactory, Stage, StepTimes
from pipeline.timeline import chrome_trace, partition_svg

__all__ = ["ElasticPipeline", "split_microbatches"]

_TIME_FIELDS = list(StepTimes.__dataclass_fields__)


class ElasticPipeline:
    """A model given as a list of `LayerSpec`s, trained pipeline-parallel over all ranks.

    Args:
        specs: the layers in forward order.
        optimizer: `factory(param_groups) -> Optimizer`, called once per stage with one
            parameter group per layer, e.g. `functools.partial(torch.optim.AdamW, lr=1e-3)`.
        loss_fn: `loss_fn(output, target) -> scalar tensor`, mean-reduced over the batch.
        schedule: "1f1b" (PipeDream-Flush), "gpipe", or a function
            `(n_stages, n_microbatches, stage) -> list[Action]` (see `pipeline.schedule`).
        n_microbatches: micro-batches per step; must divide the batch size.
        seed: with the layer keys, fixes the initial weights and the dropout masks.
        partition: "auto" (equal layer counts for now) or the number of layers per stage.
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
        partition: str | Sequence[int] = "auto",
        device: torch.device | str | None = None,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "ElasticPipeline needs a process group: construct it inside a function run "
                "by pipeline.launch(fn, n_stages=...) or under torchrun"
            )
        self.specs = check_specs(specs)
        self.rank, self.n_stages = dist.get_rank(), dist.get_world_size()
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"n_microbatches must be a positive int, got {n_microbatches!r}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        self.schedule = get_schedule(schedule) if isinstance(schedule, str) else schedule
        validate(self.schedule, self.n_stages, n_microbatches)
        self.n_microbatches = n_microbatches
        self.sizes = _resolve_partition(partition, len(self.specs), self.n_stages)
        self.device = _resolve_device(device)
        backend = dist.get_backend()
        self._comm_device = self.device if backend == "nccl" else torch.device("cpu")
        self._actions: list[Action] = stage_actions(
            self.schedule, self.n_stages, n_microbatches, self.rank
        )
        self._seed, self._optimizer, self._loss_fn = seed, optimizer, loss_fn
        self._stage: Stage | None = self._build_stage(self.specs, self.sizes)
        self.generation = 0  # +1 per reconfigure: which model this is
        self.events: list[dict[str, Any]] = []  # the pipeline's life: builds, migrations...
        self._reset_counters()
        self._log("build", sizes=list(self.sizes))

    def _build_stage(self, specs: list[LayerSpec], sizes: list[int]) -> Stage:
        start, stop = bounds(sizes)[self.rank]
        return Stage(
            self.rank, self.n_stages, specs[start:stop], seed=self._seed, device=self.device,
            comm_device=self._comm_device, optimizer=self._optimizer, loss_fn=self._loss_fn,
        )  # fmt: skip

    def _reset_counters(self) -> None:
        self.step = 0
        self.version = 0  # plan version: +1 per committed migration
        self.migrations: list[MigrationRecord] = []
        self._history: list[tuple[int, StepTimes]] = []  # (samples, times) per step
        self.partition_history: list[tuple[int, list[int]]] = [(0, list(self.sizes))]

    def _log(self, kind: str, **fields: Any) -> None:
        self.events.append({"generation": self.generation, "step": self.step, "kind": kind,
                            **fields})  # fmt: skip

    # -- training ----------------------------------------------------------------------------
    def train_step(self, x: Any, y: Any) -> float:
        """One optimizer step on the batch (x, y); returns the mean micro-batch loss."""
        stage = self._live_stage()
        chunks = split_microbatches(x, self.n_microbatches, "x")
        inputs = [as_carry(c, "the batch input") for c in chunks]
        targets = split_microbatches(y, self.n_microbatches, "y")
        rng = torch.random.get_rng_state()
        try:
            loss_sum, times = stage.run_step(self._actions, self.step, inputs, targets)
        finally:
            torch.random.set_rng_state(rng)
        loss = torch.zeros((), dtype=torch.float64, device=self._comm_device)
        if loss_sum is not None:
            loss.fill_(loss_sum.item() / self.n_microbatches)
        dist.broadcast(loss, src=self.n_stages - 1)
        self.step += 1
        self._history.append((_batch_size(x), times))
        return float(loss.item())

    # -- elasticity --------------------------------------------------------------------------
    def repartition(self, sizes: Sequence[int]) -> MigrationRecord:
        """Move layers live so that stage s holds `sizes[s]` layers; call on every rank.

        Only the layers whose stage changes travel, with their parameters, buffers,
        gradients and optimizer state; the next step computes exactly what it would have
        computed without the move. On failure the old partition stays in force and
        `pipeline.MigrationError` is raised on every rank.
        """
        stage = self._live_stage()
        new = _resolve_partition(list(sizes), len(self.specs), self.n_stages)
        try:
            record = migrate(stage, self.specs, self.sizes, new, self.step, self.version + 1)
        except MigrationError as exc:
            self._log("rollback", sizes=list(self.sizes), requested=new, error=str(exc))
            raise
        self.sizes, self.version = new, record.version
        self.migrations.append(record)
        self.partition_history.append((self.step, list(new)))
        self._log("migration", **dataclasses.asdict(record))
        return record

    def reconfigure(
        self,
        specs: Sequence[LayerSpec],
        *,
        partition: str | Sequence[int] = "auto",
        inherit_weights: bool = False,
        loss_fn: LossFn | None = None,
        optimizer: OptimizerFactory | None = None,
    ) -> None:
        """Take the next model on the same processes and process group; call on every rank.

        The old layers are freed and the new ones built on the stages that own them; the
        step count restarts at 0, so the new model trains exactly as a fresh pipeline would.
        With `inherit_weights`, a new layer whose key existed before and whose state has
        the same shapes starts from the old layer's weights (fetched from its old stage).
        `loss_fn` and `optimizer`, when given, replace the current ones.
        """
        stage = self._live_stage()
        new_specs = check_specs(specs)
        sizes = _resolve_partition(partition, len(new_specs), self.n_stages)
        requests: list[Any] = [None] * self.n_stages
        dist.all_gather_object(requests, ([s.key for s in new_specs], sizes))
        if any(r != requests[0] for r in requests):
            raise ValueError(f"ranks passed different models or partitions to reconfigure: "
                             f"{[r[1] for r in requests]}")  # fmt: skip
        inherited = (
            inherited_states(stage, self.specs, self.sizes, new_specs, sizes)
            if inherit_weights else {}
        )  # fmt: skip
        stage.close()
        self._stage = None  # free the old layers before building the new ones
        self._loss_fn = loss_fn or self._loss_fn
        self._optimizer = optimizer or self._optimizer
        self._stage = self._build_stage(new_specs, sizes)
        self._stage.load_matching(inherited)
        self.specs, self.sizes = new_specs, sizes
        self.generation += 1
        self._reset_counters()
        self._log("reconfigure", sizes=list(sizes), layers=[s.key for s in new_specs])

    # -- inspection --------------------------------------------------------------------------
    def stats(self, last_steps: int = 20) -> dict[str, Any]:
        """Throughput and per-stage times (medians over the last steps); same on every rank."""
        stage = self._live_stage()
        recent = self._history[-last_steps:]
        mine = {
            "stage": self.rank,
            "layers": [layer.key for layer in stage.layers],
            "param_bytes": stage.param_bytes(),
            **{f: _median([getattr(t, f) for _, t in recent]) for f in _TIME_FIELDS},
        }
        per_stage: list[Any] = [None] * self.n_stages
        dist.all_gather_object(per_stage, mine)
        iteration_s = max(s["total_s"] for s in per_stage)
        samples = _median([n for n, _ in recent])
        return {
            "generation": self.generation,
            "steps": self.step,
            "plan_version": self.version,
            "migrations": [dataclasses.asdict(m) for m in self.migrations],
            "schedule": getattr(self.schedule, "__name__", str(self.schedule)),
            "n_microbatches": self.n_microbatches,
            "partition": list(self.sizes),
            "iteration_s": iteration_s,
            "samples_per_s": samples / iteration_s if iteration_s > 0 else 0.0,
            "stages": per_stage,
        }

    def save_partition_picture(self, path: str | Path) -> Path:
        """Write an SVG of which layers lived on which stage, step by step (this model)."""
        svg = partition_svg(self.partition_history, [s.key for s in self.specs], self.step)
        path = Path(path)
        path.write_text(svg)
        return path

    def save_timeline(self, path: str | Path) -> Path | None:
        """Write the last step of every stage as Chrome-trace JSON (open it in Perfetto).

        A collective: call it on every rank; rank 0 writes the file and returns its path.
        """
        spans: list[Any] = [None] * self.n_stages
        dist.all_gather_object(spans, self._live_stage().spans)
        if self.rank != 0:
            return None
        trace = chrome_trace([s for part in spans for s in part], f"step {self.step - 1}")
        path = Path(path)
        path.write_text(json.dumps(trace))
        return path

    def full_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{layer key: its state dict on CPU}, in layer order, on rank 0; {} on other ranks."""
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
            self._stage = None

    def _live_stage(self) -> Stage:
        if self._stage is None:
            raise RuntimeError("this ElasticPipeline is closed")
        return self._stage


def split_microbatches(value: Any, n: int, what: str) -> list[Any]:
    """Split a tensor (or a tuple/list of tensors, element-wise) into n equal chunks on dim 0."""
    if isinstance(value, torch.Tensor):
        size = value.shape[0] if value.dim() else 0
        if size == 0 or size % n:
            raise ValueError(
                f"{what} has batch size {size}, which n_microbatches={n} does not divide; "
                f"use a batch size that is a multiple of {n}"
            )
        return list(value.chunk(n))
    if isinstance(value, tuple | list) and value:
        columns = [split_microbatches(v, n, f"{what}[{i}]") for i, v in enumerate(value)]
        return [tuple(chunks) for chunks in zip(*columns, strict=True)]
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def _batch_size(x: Any) -> int:
    carry: Carry = as_carry(x, "x")
    return int(carry[0].shape[0])


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _resolve_partition(partition: str | Sequence[int], n_layers: int, n_stages: int) -> list[int]:
    if isinstance(partition, str):
        if partition != "auto":
            raise ValueError(
                f"partition must be 'auto' or a list of stage sizes, got {partition!r}"
            )
        return equal_sizes(n_layers, n_stages)
    if n_stages > n_layers:
        equal_sizes(n_layers, n_stages)  # raises the clear "more stages than layers" error
    return check_sizes(partition, n_layers, n_stages)


def _resolve_device(device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")

