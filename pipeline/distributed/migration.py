"""Live layer migration: move layers between running stages without a restart (vPipe).

At a step boundary every rank calls `migrate(stages, old_sizes, new_sizes, ...)`. Only the
layers whose owner changes travel, directly from the old stage to the new one, carrying
everything that makes the next step compute exactly what it would have computed anyway:
parameters and buffers (`state_dict`), pending gradients, the optimizer's state for the
layer's parameters (step counts included) and its parameter-group hyper-parameters, the
layer's memory action and its measured costs, and under PipeDream-2BW its second weight
version (`pipeline.local.versions`).

Under 2BW a migration happens between two `train` streams (the pipeline drains the one in
flight first), so no micro-batch is in flight and every stage has applied the same u
updates. A moving layer then carries both of its versions: W(u), its parameters (in its
state dict), and W(u-1), the version the next stream's first step computes with
("previous"); its optimizer state travels as for any schedule. The receiver attaches the
two (W(u) as the parameters, W(u-1) in the other slot), so the next step computes exactly
what it would have computed without the move.

Under PipeMare (`pipeline.local.asynchronous`) a migration also happens between two
streams, with every micro-batch finished and every stage at the same update count k. A
moving layer carries, beside its weights (one copy) and optimizer state, its T2 delta
buffers and k (T1's counter; the receiver checks it equals its own), as "previous"; the
receiver `attach`es them, with its own stage's delay (T1's scale, T2's gamma and lags).
The layer then follows the rule of its new stage: its staleness is its stage's, so the
trajectory is the rule's with the new partition (`ReferenceTrainer.drain(sizes)`), which
differs from no move.

Under Bi-Partition (`pipeline.distributed.handoff`) the cut is not state: a handed layer's
weights, gradients and optimizer state live with its owner, and after every step the
replicas equal the owners' weights. `ElasticPipeline.repartition` drops the replicas,
migrates whole layers as above, then sets the new cut (its own argument, or the new plan's)
and the next step starts by giving the new replicas their owners' weights, so it computes
exactly what it would have computed with that cut from the start.

The protocol (numbered as in docs/design.md, section 3). Each phase that runs local work ends
with a vote (an all_reduce of "failed here?"); a failed vote raises `MigrationError` on
every rank, naming the phase and each failing stage's cause, and leaves the old plan:

    1. All ranks agree on the new sizes (every rank's request is gathered and compared).
    2. pack: each sender packs, per receiver, the layers it gives away: their tensors as
       one raw byte buffer (`transfer`). Vote.
    3. exchange: the buffer sizes go round in one all_gather; all receives and sends are
       posted at once (non-blocking, so two stages may swap layers without deadlock).
    4. build: each receiver builds the modules from their specs and loads their state,
       gradients and optimizer state, but installs nothing yet. Vote.
    5. commit: receivers install the layers and their optimizer groups, senders drop
       theirs. Vote; if any rank's commit failed, every rank puts back its layers, its
       optimizer's groups and state as they were before the commit.

         stage 0          stage 1
         pack ──vote──── pack
         ════ exchange bytes ════
         build ─vote──── build
         commit ─vote─── commit     (failed anywhere: both restore their snapshots)

Nothing is lost or duplicated: until the commit every layer is live only on its old stage,
and a rolled-back commit restores the objects themselves, so no state is copied back.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from pipeline.distributed.comm import Comm
from pipeline.distributed.transfer import exchange, pack_all
from pipeline.errors import MigrationError
from pipeline.local.layer import StageLayer
from pipeline.local.meter import LayerMeter
from pipeline.local.objective import build_optimizer
from pipeline.local.spec import LayerSpec, build_layer
from pipeline.local.stage import Stage
from pipeline.pure.partition import bounds

__all__ = [
    "MigrationError",
    "MigrationRecord",
    "migrate",
    "moves",
]

T = TypeVar("T")


@dataclass(frozen=True)
class MigrationRecord:
    """One migration, as `stats()` and the event log report it."""

    step: int
    version: int  # plan version after the migration
    old_sizes: tuple[int, ...]
    new_sizes: tuple[int, ...]
    moved: tuple[tuple[str, int, int], ...]  # (layer key, from stage, to stage)
    bytes_moved: int
    pause_s: float


def owners(sizes: list[int]) -> list[int]:
    return [stage for stage, (a, b) in enumerate(bounds(sizes)) for _ in range(a, b)]


def moves(old: list[int], new: list[int]) -> list[tuple[int, int, int]]:
    """(layer index, from stage, to stage) of every layer whose owner changes."""
    return [
        (index, a, b)
        for index, (a, b) in enumerate(zip(owners(old), owners(new), strict=True))
        if a != b
    ]


# -- packing one layer -------------------------------------------------------------------------
def _pack_layer(stage: Stage, layer: StageLayer) -> dict[str, Any]:
    params = list(layer.module.parameters())
    group = _group_of(stage, layer.key)
    state = stage.optimizer.state if stage.optimizer is not None else {}
    return {
        "key": layer.key,
        "action": layer.action,
        "meter": vars(layer.meter).copy(),
        "module": {k: v.detach().cpu() for k, v in layer.module.state_dict().items()},
        "previous": None
        if stage.versions is None or layer.key not in stage.versions.layer_keys()
        else {k: v.cpu() for k, v in stage.versions.previous(layer.key).items()},
        "grads": [None if p.grad is None else p.grad.detach().cpu() for p in params],
        "group": None if group is None else {k: v for k, v in group.items() if k != "params"},
        "optimizer": [
            {k: v.detach().cpu() if torch.is_tensor(v) else v for k, v in state.get(p, {}).items()}
            for p in params
        ],
    }


def _group_of(stage: Stage, key: str) -> dict[str, Any] | None:
    if stage.optimizer is None:
        return None
    return next((g for g in stage.optimizer.param_groups if g.get("layer") == key), None)


def _tensor_bytes(obj: Any) -> int:
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


@dataclass
class _Incoming:
    """A received layer, built and loaded but not yet installed."""

    layer: StageLayer
    packed: dict[str, Any] = field(default_factory=dict)


def _unpack_layer(packed: dict[str, Any], spec: LayerSpec, stage: Stage) -> _Incoming:
    module = build_layer(spec, stage.seed, stage.device)
    module.load_state_dict({k: v.to(stage.device) for k, v in packed["module"].items()})
    params = list(module.parameters())
    if len(params) != len(packed["grads"]):
        raise RuntimeError(f"layer {spec.key!r} arrived with a different parameter count")
    for p, g in zip(params, packed["grads"], strict=True):
        p.grad = None if g is None else g.to(stage.device)
    meter = LayerMeter(**packed["meter"])
    layer = StageLayer(spec.key, module, action=packed["action"], meter=meter)
    return _Incoming(layer, packed)


def _install_optimizer(stage: Stage, incoming: _Incoming) -> None:
    packed, module = incoming.packed, incoming.layer.module
    if packed["group"] is None:
        return
    params = list(module.parameters())
    if stage.optimizer is None:
        stage.optimizer = build_optimizer(stage.optimizer_factory, [(incoming.layer.key, module)])
        assert stage.optimizer is not None
        group = stage.optimizer.param_groups[-1]
        group.update(packed["group"])
    else:
        stage.optimizer.add_param_group({"params": params, **packed["group"]})
    for p, state in zip(params, packed["optimizer"], strict=True):
        if state:  # like Optimizer.load_state_dict: step counters stay where they were
            stage.optimizer.state[p] = {
                k: v.to(p.device) if torch.is_tensor(v) and k != "step" else v
                for k, v in state.items()
            }


def _drop(stage: Stage, layer: StageLayer) -> None:
    group = _group_of(stage, layer.key)
    if group is not None and stage.optimizer is not None:
        groups = stage.optimizer.param_groups
        groups[:] = [g for g in groups if g is not group]
        for p in group["params"]:
            stage.optimizer.state.pop(p, None)


def migrate(
    comm: Comm,
    stages: Sequence[Stage],
    specs: list[LayerSpec],
    old: list[int],
    new: list[int],
    step: int,
    version: int,
    rank_of: Callable[[int], int] | None = None,
) -> MigrationRecord:
    """Move layers so that stage sizes go from `old` to `new`; see the module docstring.

    `stages` are this rank's (several under an interleaved or V placement), `rank_of` maps
    a stage to the rank holding it (default: stage s on rank s). A layer that moves between
    two stages of one rank goes through the same phases without a message."""
    start, where = time.perf_counter(), rank_of or (lambda s: s)
    requests = comm.all_gather_object(new)
    if any(r != new for r in requests):
        raise MigrationError(f"ranks asked for different partitions: {requests}")
    planned = moves(old, new)
    what = f"migration {old} -> {new}"
    packed, bytes_moved = _vote(
        comm, what, "pack", lambda: _pack(comm.rank, stages, old, planned, where)
    )
    received = exchange(comm, packed)
    incoming = _vote(comm, what, "build", lambda: _unpack(received, specs, stages[0]))
    snapshots = [_Snapshot(stage) for stage in stages]
    try:
        _vote(comm, what, "commit", lambda: _commit_all(stages, specs, new, incoming))
    except MigrationError:
        for stage, snapshot in zip(stages, snapshots, strict=True):
            snapshot.restore(stage)
        raise
    total = comm.all_reduce([bytes_moved])[0]
    pause = comm.all_reduce([time.perf_counter() - start], op="max")[0]
    moved = tuple((specs[i].key, a, b) for i, a, b in planned)
    return MigrationRecord(step, version, tuple(old), tuple(new), moved, int(total), pause)


def _vote(comm: Comm, what: str, phase: str, work: Callable[[], T]) -> T:
    """Run one phase's local work; if it failed anywhere, MigrationError on every rank."""
    try:
        result = work()
    except Exception as exc:  # anything that stops this rank from taking part
        _agree(comm, what, phase, f"stage {comm.rank}: {type(exc).__name__}: {exc}")
        raise  # not reached: `_agree` raised
    _agree(comm, what, phase, "")
    return result


def _agree(comm: Comm, what: str, phase: str, error: str) -> None:
    """Every rank's `error` ("" where the phase went well): MigrationError on every rank
    if any is set."""
    if comm.all_reduce([float(bool(error))], op="max")[0]:
        errors = comm.all_gather_object(error)
        raise MigrationError(
            f"{what} rolled back in its {phase} phase, the old plan stays in force: "
            + "; ".join(e for e in errors if e)
        )


def _pack(
    rank: int,
    stages: Sequence[Stage],
    old: list[int],
    planned: list[tuple[int, int, int]],
    rank_of: Callable[[int], int],
) -> tuple[dict[int, Any], int]:
    """The layers this rank's stages give away, per receiving rank, packed for the wire
    (what stays on this rank as it is); the bytes that leave the rank."""
    mine = {stage.index: stage for stage in stages}
    outgoing: dict[int, list[dict[str, Any]]] = {}
    for index, src, dst in planned:
        if src in mine:
            stage = mine[src]
            layer = stage.layers[index - bounds(old)[src][0]]
            outgoing.setdefault(rank_of(dst), []).append(_pack_layer(stage, layer))
    nbytes = sum(_tensor_bytes(p) for dst, packs in outgoing.items() if dst != rank for p in packs)
    return pack_all(outgoing, rank), nbytes


def _unpack(received: dict[int, Any], specs: list[LayerSpec], stage: Stage) -> dict[str, _Incoming]:
    by_key = {spec.key: spec for spec in specs}
    return {
        packed["key"]: _unpack_layer(packed, by_key[packed["key"]], stage)
        for packs in received.values()
        for packed in packs
    }


class _Snapshot:
    """What a commit changes on a stage, to put back if any rank's commit fails."""

    def __init__(self, stage: Stage) -> None:
        self.layers = list(stage.layers)
        self.actions = [layer.action for layer in stage.layers]
        self.optimizer = stage.optimizer
        opt = stage.optimizer
        self.groups = list(opt.param_groups) if opt is not None else []
        self.state = dict(opt.state) if opt is not None else {}
        self.versions = stage.versions.index() if stage.versions is not None else None

    def restore(self, stage: Stage) -> None:
        stage.layers, stage.optimizer = self.layers, self.optimizer
        for layer, action in zip(self.layers, self.actions, strict=True):
            layer.action = action
        if self.optimizer is not None:
            self.optimizer.param_groups[:] = self.groups
            self.optimizer.state.clear()
            self.optimizer.state.update(self.state)
        if stage.versions is not None and self.versions is not None:
            stage.versions.restore(self.versions)


def _commit_all(
    stages: Sequence[Stage],
    specs: list[LayerSpec],
    new: list[int],
    incoming: dict[str, _Incoming],
) -> None:
    for stage in stages:
        _commit(stage, specs, new, incoming)


def _commit(
    stage: Stage, specs: list[LayerSpec], new: list[int], incoming: dict[str, _Incoming]
) -> None:
    a, b = bounds(new)[stage.index]
    wanted = [spec.key for spec in specs[a:b]]
    kept = {layer.key: layer for layer in stage.layers}
    for key, layer in kept.items():
        if key not in wanted:
            _drop(stage, layer)
    for key in wanted:
        if key in incoming:
            _install_optimizer(stage, incoming[key])
    stage.layers = [kept[k] if k in kept else incoming[k].layer for k in wanted]
    versions = stage.versions
    if versions is not None:  # 2BW: both weight versions (module doc)
        for key in set(versions.layer_keys()) - set(wanted):
            versions.drop(key)
        for key in wanted:
            if key in incoming:
                versions.attach(key, incoming[key].layer.module, incoming[key].packed["previous"])
    stage.set_memory_actions([layer.action for layer in stage.layers])
