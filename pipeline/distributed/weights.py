"""A model's weights across the stages: gathered, snapshotted, and inherited by the next model.

Kept apart from `pipeline.distributed.elastic` so the facade stays short. Each rank holds
only its own layers, so every way of reading or seeding the weights as a whole is a
collective or a per-rank part of one:

    full_state_dict   every layer's state on rank 0 (`ElasticPipeline.full_state_dict`),
                      or on every rank (`ElasticPipeline.replica`);
                      before a planned model's first step, the ranks build the layers in
                      turns (their initial weights depend only on the seed and the key)
    snapshot          this rank's layers' states with the model's keys and partition, a
                      `WeightSnapshot` to start a later model from
    take_inheritance  a new model's layers load, tensor by tensor, the states of the
                      snapshot's layers with the same key where a tensor's name and shape
                      match, fetched from the stage that held them
                      (`pipeline.distributed.inheritance.inherited_states`); an "inherit"
                      event records what was taken and how many tensors stayed fresh
"""

from __future__ import annotations

import torch

from pipeline.distributed.comm import Comm
from pipeline.distributed.events import EventLog
from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.inheritance import WeightSnapshot, inherited_states
from pipeline.local.carry import nbytes
from pipeline.local.spec import build_layer

__all__ = ["checked_source", "full_state_dict", "snapshot", "start_from", "take_inheritance"]


def full_state_dict(
    comm: Comm, model: ModelHolder, seed: int, everywhere: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """{layer key: its state dict on CPU}, in layer order, on rank 0 (`everywhere`: on every
    rank); {} on the other ranks. Layers not built yet are built from `seed` (the recipe's),
    a share on every rank."""
    mine = comm.together(lambda: _own_states(comm, model, seed))
    gathered = comm.all_gather_object(mine) if everywhere else comm.gather_object(mine, dst=0)
    if gathered is None:
        return {}
    merged = {k: v for part in gathered for k, v in part.items()}
    return {spec.key: merged[spec.key] for spec in model.specs}


def _own_states(comm: Comm, model: ModelHolder, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    if model.built:
        modules = {layer.key: layer.module for stage in model.stages for layer in stage.layers}
    else:  # not built yet: every rank builds a share, in turns
        cpu = torch.device("cpu")
        modules = {
            spec.key: build_layer(spec, seed, cpu)
            for i, spec in enumerate(model.specs)
            if i % comm.world_size == comm.rank
        }
    return {
        key: {k: v.detach().cpu() for k, v in module.state_dict().items()}
        for key, module in modules.items()
    }


def snapshot(model: ModelHolder, copy: bool) -> WeightSnapshot:
    """This rank's layers' states (CPU copies, or references with copy=False)."""
    states = {
        layer.key: {
            k: v.detach().cpu().clone() if copy else v for k, v in layer.module.state_dict().items()
        }
        for stage in model.live_stages()
        for layer in stage.layers
    }
    return WeightSnapshot(tuple(s.key for s in model.specs), tuple(model.sizes), states)


def checked_source(source: object, resumes: bool = False) -> WeightSnapshot:
    """`inherit_from=` as given: a `WeightSnapshot`, for a model that does not `resume`
    from a checkpoint too (which would give the starting weights twice)."""
    if not isinstance(source, WeightSnapshot):
        raise TypeError(
            f"inherit_from must be a WeightSnapshot (from snapshot()), got {type(source).__name__}"
        )
    if resumes:
        raise ValueError(
            "inherit_from= and CheckpointOptions(resume_from=...) both give the starting "
            "weights; pass one of them"
        )
    return source


def start_from(comm: Comm, model: ModelHolder, event_log: EventLog, source: WeightSnapshot) -> None:
    """The model (just set up) starts from `source`: now if it is built, else at its build
    on the first step (`pipeline.distributed.build.plan_first`)."""
    model.expect_inheritance(source)
    if model.built:
        take_inheritance(comm, model, event_log)


def take_inheritance(comm: Comm, model: ModelHolder, event_log: EventLog) -> None:
    """Load the weights the model expects to inherit (if any) into the layers just built;
    log what was taken."""
    source = model.take_inheritance()
    if source is None:
        return
    found = inherited_states(comm, source, model.specs, model.sizes)
    states = {k: dict(v) for k, (_, v) in found.items()}
    rows = []  # per layer that took a tensor: bytes taken, moved, tensors taken and left fresh
    for stage in model.live_stages():
        loaded = stage.load_matching(states)
        for layer in stage.layers:
            if layer.key in loaded:
                taken = loaded[layer.key]
                size = sum(nbytes(found[layer.key][1][name]) for name in taken)
                fresh = len(layer.module.state_dict()) - len(taken)
                rows.append((size, found[layer.key][0] != comm.rank, len(taken), fresh))
    everyone = [row for part in comm.all_gather_object(rows) for row in part]
    event_log.record(
        "inherit",
        layers=len(everyone),
        bytes=sum(row[0] for row in everyone),
        moved=sum(row[1] for row in everyone),
        moved_bytes=sum(row[0] for row in everyone if row[1]),
        tensors=sum(row[2] for row in everyone),
        fresh_tensors=sum(row[3] for row in everyone),
    )
