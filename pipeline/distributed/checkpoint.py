"""Checkpoints of a running pipeline: save anywhere, resume under any partition, schedule or
number of ranks. The facade's `Checkpointer` part; every method runs on every rank, in order.

What a checkpoint holds and how its entries are keyed (by layer key) is
`pipeline.pure.checkpoint_format`; a stage's layers as entries, `pipeline.local.layer_state`;
the files, `pipeline.local.checkpoint_files`. The tensors go through torch's Distributed
Checkpoint (`torch.distributed.checkpoint`), each rank writing its own shard, so torch's
tools read the folder; its own collectives run on the default process group, under its
timeout, and raise a failure on every rank (`CheckpointException`). As torch's
`FileSystemWriter` assumes, every rank must see the folder (one machine, or a shared file
system across nodes).

Save (`save_checkpoint(path)`, or automatically every N steps, `CheckpointOptions`):

    1. agree on the path; drain a stream in flight (its steps finish: a step boundary)
    2. every rank collects its layers' entries (weights, buffers, optimizer state, group
       settings, lr scheduler state, a stream's second weight version)   agreed
    3. rank 0 empties the hidden sibling `.<name>.partial`                 agreed
    4. dcp.save into it: each rank writes `__<rank>_0.distcp`, rank 0 `.metadata`
    5. each rank records its files' size and CRC-32; rank 0 gathers them with the plan, the
       memory actions and the cost cache into `pipeline.json`, writes it last and renames
       the folder into place (then deletes automatic checkpoints beyond `keep_last`) agreed

A failure in any phase raises `CheckpointError` on every rank and rank 0 deletes the
partial folder; a process killed mid-save leaves it behind, hidden, and the next save
empties it. Either way the last checkpoint that was renamed into place stays whole.

Resume (`CheckpointOptions(resume_from=...)`), at construction:

    1. rank 0 finds the checkpoint, reads its manifest, checks it is this model (the layer
       keys, in order: `CheckpointError` naming the first that differs) and seed; every rank
       gets the verdict
    2. the step count and the cost cache are restored; with partition="auto" the checkpoint's
       plan (sizes, memory actions) is kept when it has this pipeline's stage count, and
       otherwise the first step plans anew
    3. once the layers are built (at once, or on the first step): each rank lists the
       entries of the layers it holds now, checks the files they are in (missing or
       corrupt: `CheckpointError` naming the file), loads only those keys (dcp.load of a
       key subset: no resharding) and puts them in place

Dropout needs no saved random state: its masks are a pure function of (seed, step,
micro-batch, layer key) (`pipeline.local.determinism`), so the step count restores them, and
the pipeline leaves the process's own generator as it found it. Learning-rate schedules are
per layer (`pipeline.local.lr_schedules`); this part keeps them in step with the layers
(`built`, and around a migration `moving` / `moved`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.distributed.options import LATEST
from pipeline.distributed.parts import CheckpointedPipeline
from pipeline.local import checkpoint_files as files
from pipeline.local import layer_state
from pipeline.local.lr_schedules import LayerSchedules, LrSchedulerFactory, check_lr_scheduler
from pipeline.local.objective import OptimizerFactory
from pipeline.local.pipemare import PipeMareConfig
from pipeline.local.stage import Stage
from pipeline.pure.checkpoint_format import (
    CheckpointError,
    FileRecord,
    Manifest,
    check_same_model,
    checkpoint_name,
    partial_name,
)
from pipeline.pure.partition import bounds
from pipeline.pure.planner import Plan

__all__ = ["CheckpointError", "CheckpointedPipeline", "Checkpointer", "Resume"]

_METADATA = ".metadata"  # DCP's index, written by the coordinator (rank 0)


@dataclass(frozen=True)
class Resume:
    """A checkpoint the model goes on from, found and checked; loaded once built."""

    folder: Path
    manifest: Manifest
    actions: bool = False  # put its memory actions in force (its partition was taken)


def checked_scheduler(
    lr_scheduler: LrSchedulerFactory | None,
    optimizer: OptimizerFactory,
    pipemare: PipeMareConfig | None,
) -> LrSchedulerFactory | None:
    """`lr_scheduler` if the pipeline can step it (`check_lr_scheduler`): never under
    PipeMare, whose T1 sets the lr."""
    if lr_scheduler is not None and pipemare is not None:
        raise ValueError("lr_scheduler= cannot run under schedule='pipemare' (T1 sets the lr)")
    return check_lr_scheduler(lr_scheduler, optimizer)


class Checkpointer:
    """Checkpoints and per-layer lr schedules of one pipeline (module doc)."""

    def __init__(self, schedules: LayerSchedules) -> None:
        self.schedules = schedules
        self._pending: Resume | None = None  # loaded by `built`
        self._saved_at = 0  # the step of the last automatic save (or of the resume)

    @classmethod
    def of(
        cls,
        lr_scheduler: LrSchedulerFactory | None,
        optimizer: OptimizerFactory,
        pipemare: PipeMareConfig | None,
    ) -> Checkpointer:
        """The part for a pipeline's `lr_scheduler=` (checked) and optimizer factory."""
        return cls(LayerSchedules(checked_scheduler(lr_scheduler, optimizer, pipemare)))

    # -- resuming ----------------------------------------------------------------------------
    def start(
        self,
        pipe: CheckpointedPipeline,
        partition: str | Sequence[int] | Plan,
        resume_from: Path | None = None,
    ) -> str | Sequence[int] | Plan:
        """At construction: find the checkpoint to resume (`resume_from`, else the options'
        if any), restore its step and cost cache; the partition to build with (the
        checkpoint's, for "auto", where it fits)."""
        resume = pipe.comm.agree(lambda: _find(pipe, resume_from))
        if resume is None:
            return partition
        manifest = resume.manifest
        pipe.model.resume_at(manifest.step)
        pipe.options.planning.cost_cache.update(
            {k: dict(v) for k, v in manifest.cost_cache.items()}
        )
        self._saved_at = manifest.step
        if partition == "auto" and not pipe.auto_schedule and manifest.n_stages == pipe.n_stages:
            plan = manifest.plan
            if plan is not None and plan["schedule"] == pipe.schedule.name:
                partition = Plan.from_dict(dict(plan))
            else:
                partition = list(manifest.sizes)
            resume = dataclasses.replace(resume, actions=True)
        self._pending = resume
        return partition

    def built(self, pipe: CheckpointedPipeline) -> None:
        """The layers were built: give them their schedules, and the checkpoint's state."""
        if not pipe.model.built:
            return
        self.schedules.sync(pipe.optimizers)
        resume, self._pending = self._pending, None
        if resume is not None:
            _load(pipe, resume, self.schedules)

    def reset(self, lr_scheduler: LrSchedulerFactory | None = None) -> None:
        """A new model (`reconfigure`): no schedule and no resume carries over; its layers
        are scheduled by `lr_scheduler` (`checked_scheduler`) when given, as before if not."""
        self.schedules.reset(lr_scheduler)
        self._pending, self._saved_at = None, 0

    # -- migrations ----------------------------------------------------------------------------
    def moving(self, pipe: CheckpointedPipeline) -> None:
        """Before a migration (after the drain): the schedules ride in their groups."""
        self.schedules.stash(pipe.optimizers)

    def moved(self, pipe: CheckpointedPipeline) -> None:
        """After a migration, committed or rolled back."""
        self.schedules.sync(pipe.optimizers)

    # -- saving --------------------------------------------------------------------------------
    def save(self, pipe: CheckpointedPipeline, path: str | Path) -> Path:
        """Write a checkpoint to the folder `path` (module doc); returns its absolute path."""
        final = Path(path).absolute()
        paths = pipe.comm.all_gather_object(str(final))
        if len(set(paths)) > 1:
            raise ValueError(f"save_checkpoint: the ranks passed different paths {paths}")
        pipe.drain()
        return _save(pipe, final, self.schedules, prune=None)

    def stepped(self, pipe: CheckpointedPipeline) -> Path | None:
        """After a training step: save into `CheckpointOptions.directory` when one is due."""
        options = pipe.options.checkpoint
        every = options.every
        if every is None or pipe.model.step // every <= self._saved_at // every:
            return None
        assert options.directory is not None  # checked by CheckpointOptions
        pipe.drain()  # a stream's steps in flight finish: the folder is named after them
        self._saved_at = step = pipe.model.step
        directory = Path(options.directory).absolute()
        return _save(pipe, directory / checkpoint_name(step), self.schedules, options.keep_last)


# -- resuming: find, check, load ---------------------------------------------------------------
def _find(pipe: CheckpointedPipeline, resume_from: Path | None = None) -> Resume | None:
    """(Rank 0) The checkpoint `resume_from` (default: the options') names, checked against
    this model."""
    options = pipe.options.checkpoint
    source = options.resume_from if resume_from is None else resume_from
    if source is None:
        return None
    if source == LATEST:
        assert options.directory is not None  # checked by CheckpointOptions
        folder = files.resolve(Path(options.directory).absolute())
        if folder is None:
            return None  # nothing saved yet: a fresh start
    else:
        folder = files.resolve(Path(source).absolute())
        if folder is None:
            raise CheckpointError(
                f"no checkpoint at {source}: neither a checkpoint folder nor a directory "
                "holding automatic checkpoints"
            )
    manifest = files.read_manifest(folder)
    check_same_model(manifest.layers, [s.key for s in pipe.model.specs], str(folder))
    if manifest.seed != pipe.recipe.seed:
        raise CheckpointError(
            f"{folder} was trained with seed={manifest.seed}, this pipeline has "
            f"seed={pipe.recipe.seed}: dropout would change; pass seed={manifest.seed}"
        )
    return Resume(folder, manifest)


def _versions_kind(pipe: CheckpointedPipeline) -> str | None:
    if pipe.pipemare is not None:
        return "pipemare"
    return "2bw" if pipe.schedule.stream else None


def _load(pipe: CheckpointedPipeline, resume: Resume, schedules: LayerSchedules) -> None:
    """Load the layers this rank holds from `resume` (module doc, resume step 3)."""
    # torch's DCP costs a process ~1 s to import (DTensor, sympy): only where a checkpoint is used
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    comm, folder, manifest = pipe.comm, resume.folder, resume.manifest
    stages = pipe.model.live_stages()

    def wanted() -> dict[str, Any]:
        files.verify(folder, [_METADATA], manifest)
        metadata = FileSystemReader(str(folder)).read_metadata()
        available = {
            name: (md.size, md.properties.dtype) if isinstance(md, TensorStorageMetadata) else None
            for name, md in metadata.state_dict_metadata.items()
        }
        want = layer_state.wanted(stages, available)
        needed = {
            info.relative_path for index, info in metadata.storage_data.items() if index.fqn in want
        }
        files.verify(folder, needed, manifest)
        return want

    want = comm.together(wanted)
    try:
        dcp.load(
            want,
            storage_reader=FileSystemReader(str(folder)),
            planner=DefaultLoadPlanner(flatten_state_dict=False, flatten_sharded_tensors=False),
        )
    except (Exception, CheckpointException) as error:  # DCP's own failure is a BaseException
        raise CheckpointError(f"reading checkpoint {folder} failed: {error}") from error
    kind = _versions_kind(pipe)
    step, m = pipe.model.step, pipe.options.n_microbatches

    def versions_for(stage: Stage) -> Any:
        if manifest.versions != kind or kind is None:
            return None  # another schedule's second version: this one starts its own
        if pipe.pipemare is not None:
            return stage.enable_pipemare(pipe.pipemare, step * m // pipe.pipemare.update_every, m)
        return stage.enable_versions(step)

    def apply() -> None:
        layer_state.apply(stages, want, schedules, versions_for)
        if resume.actions:
            for stage in stages:
                start, stop = bounds(pipe.model.sizes)[stage.index]
                stage.set_memory_actions(list(manifest.actions[start:stop]))

    comm.together(apply)


# -- saving ------------------------------------------------------------------------------------
def _save(
    pipe: CheckpointedPipeline, final: Path, schedules: LayerSchedules, prune: int | None
) -> Path:
    """Phases 2-5 of a save (module doc), the pipeline drained; `prune`: keep_last of an
    automatic save's directory."""
    import torch.distributed.checkpoint as dcp  # lazily, as in `_load`
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    comm, model = pipe.comm, pipe.model
    if not model.built:
        raise RuntimeError("nothing to save before the first step builds the layers")
    stages = model.live_stages()
    partial = final.parent / partial_name(final.name)
    state = comm.together(lambda: layer_state.entries(stages, schedules))
    comm.together(lambda: files.prepare(partial) if comm.rank == 0 else None)
    try:
        dcp.save(
            state,
            storage_writer=FileSystemWriter(str(partial)),
            planner=DefaultSavePlanner(flatten_state_dict=False, flatten_sharded_tensors=False),
        )
    except (Exception, CheckpointException) as error:  # raised on every rank by DCP
        if comm.rank == 0:
            files.remove(partial)
        raise CheckpointError(
            f"writing checkpoint {final} failed; nothing was written there (the previous "
            f"checkpoint stays whole): {error}"
        ) from error
    mine = comm.together(lambda: _rank_record(comm.rank, stages, partial))
    gathered = comm.gather_object(mine, dst=0)

    def publish() -> None:
        assert gathered is not None
        try:
            files.publish(partial, final, _manifest(pipe, schedules, gathered))
            if prune is not None:
                files.prune(final.parent, prune)
        except BaseException:
            files.remove(partial)
            raise

    try:
        comm.together(publish if comm.rank == 0 else lambda: None)
    except Exception as error:
        raise CheckpointError(f"publishing checkpoint {final} failed: {error}") from error
    return final


def _rank_record(rank: int, stages: Sequence[Stage], partial: Path) -> dict[str, Any]:
    """What rank 0 needs of this rank for the manifest: its files, layers' actions."""
    names = [p.name for p in partial.iterdir() if p.name.startswith(f"__{rank}_")]
    if rank == 0:
        names.append(_METADATA)
    return {
        "files": files.records(partial, names),
        "actions": {layer.key: layer.action for s in stages for layer in s.layers},
        "owners": {layer.key: rank for s in stages for layer in s.layers},
    }


def _manifest(
    pipe: CheckpointedPipeline, schedules: LayerSchedules, records: list[dict[str, Any]]
) -> Manifest:
    model = pipe.model
    actions: dict[str, str] = {}
    owners: dict[str, int] = {}
    recorded: dict[str, FileRecord] = {}
    for record in records:
        actions.update(record["actions"])
        owners.update(record["owners"])
        recorded.update(record["files"])
    keys = [spec.key for spec in model.specs]
    return Manifest(
        step=model.step,
        seed=pipe.recipe.seed,
        layers=tuple(keys),
        actions=tuple(actions[k] for k in keys),
        sizes=tuple(model.sizes),
        schedule=pipe.schedule.name,
        stages_per_rank=pipe.schedule.stages_per_rank,
        n_ranks=pipe.comm.world_size,
        n_microbatches=pipe.options.n_microbatches,
        handoff=tuple(model.handoff),
        plan=None if model.plan is None else model.plan.to_dict(),
        owners=owners,
        lr_scheduler=schedules.factory is not None,
        versions=_versions_kind(pipe),
        cost_cache=pipe.options.planning.cost_cache.entries(),
        files=recorded,
        torch_version=torch.__version__,
    )
