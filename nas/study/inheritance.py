"""A child takes trained weights: from a stage process's memory, or from a file of them.

A study inherits weights one of two ways (`nas.settings.study` refuses both at once):

1. `study.inherit_weights=true` (vPipe's incremental candidates): a candidate's layers that
   share a key with the trial it came from keep that trial's trained weights, tensor by
   tensor where names and shapes match, migrated to wherever the new plan puts them,
   instead of starting from scratch; when that trial is its evolution parent, the tensors
   its one edit touches start afresh (`search_spaces.edited`). The trial it came from is
   the evolution parent when the sampler names one, else the previous trial this worker
   trained. Every stage process keeps a `WeightBank`: a `pipeline.WeightSnapshot` of its
   own layers per recently trained trial (complete or pruned), at most `keep` of them,
   oldest dropped first. The bank's contents are the same list of trial numbers on every
   rank (each rank adds after every trained trial), so every rank picks the same source
   without a message.
2. `study.fidelity=inherited` (`nas.study.judging`): every complete trial writes its final
   weights as one safetensors file of the whole model (`save_weights`), which the study
   keeps in Optuna's artifact store (`nas.study.kept_weights`), so any worker on the
   study's storage finds them, after a restart too; a child's stage processes load its
   parent's (`load_snapshot`).

Either way, a trial that started from another's weights says which (`inherited_attrs`).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from pipeline import ElasticPipeline, WeightSnapshot

__all__ = [
    "INHERITED_FROM",
    "WeightBank",
    "inherited_attrs",
    "load_snapshot",
    "save_weights",
]

INHERITED_FROM = "inherited_from"  # a trial's user attribute: the trial whose weights it took
_SEPARATOR = "::"  # layer key and tensor name in a flat safetensors name


def inherited_attrs(source: int, fresh_tensors: int | None = None) -> dict[str, Any]:
    """What a trial that started from trial `source`'s weights records; `fresh_tensors`:
    how many of its tensors started afresh instead (its edit's, where counted)."""
    attrs: dict[str, Any] = {INHERITED_FROM: source}
    if fresh_tensors is not None:
        attrs["inherited_fresh_tensors"] = fresh_tensors
    return attrs


class WeightBank:
    """The weights of the last `keep` trained trials, this rank's layers of each."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a weight bank must keep at least one trial, got keep={keep}")
        self.keep = keep
        self._kept: OrderedDict[int, WeightSnapshot] = OrderedDict()

    @property
    def numbers(self) -> list[int]:
        """The trials kept, oldest first."""
        return list(self._kept)

    def source(self, parent: int | None) -> int | None:
        """The trial to start from: `parent` if kept, else the last trial trained, if any."""
        if parent is not None and parent in self._kept:
            return parent
        return next(reversed(self._kept), None)

    def get(self, number: int | None) -> WeightSnapshot | None:
        return None if number is None else self._kept.get(number)

    def inherited(
        self, number: int | None, parent: int | None, edited: tuple[str, ...]
    ) -> WeightSnapshot | None:
        """What a child of `parent` whose edit touches the tensors `edited` starts from when
        it inherits from trial `number`: its weights, tensor by tensor where names and shapes
        match, less the edited tensors when `number` is its parent (they start afresh, as
        from scratch)."""
        kept = self.get(number)
        if kept is None or number != parent or not edited:
            return kept
        return kept.without(edited)

    def add(self, number: int, pipe: ElasticPipeline) -> None:
        """Keep the weights `pipe` holds now as trial `number`'s (on every rank)."""
        self.put(number, pipe.snapshot())

    def put(self, number: int, snapshot: WeightSnapshot) -> None:
        """Keep `snapshot` (this rank's part of it) as trial `number`'s weights: a trial on
        the stage pool starts from what its job took there (`nas.study.pooled`)."""
        self._kept[number] = snapshot
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)


def save_weights(state: Mapping[str, Mapping[str, torch.Tensor]], path: Path) -> Path:
    """`{layer key: state dict}` (`ElasticPipeline.full_state_dict`) as one safetensors file,
    the layer order in its metadata; written beside `path` and moved there once whole."""
    flat = {
        f"{key}{_SEPARATOR}{name}": tensor.detach().cpu().contiguous().clone()
        for key, layer in state.items()
        for name, tensor in layer.items()
    }
    part = path.with_name(f"{path.name}.part-{os.getpid()}")  # whole or absent: other
    try:  # workers on this machine may take the file as soon as it is there
        save_file(flat, str(part), metadata={"keys": json.dumps(list(state))})
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
    return path


def load_snapshot(path: str | Path, rank: int, world_size: int) -> WeightSnapshot:
    """A `WeightSnapshot` of the weights in `path` for the pipeline's rank `rank`: as if
    stage 0 held every layer (it sends each to its owner when a model inherits them)."""
    with safe_open(str(path), framework="pt") as f:
        keys = tuple(json.loads((f.metadata() or {})["keys"]))
        states: dict[str, dict[str, torch.Tensor]] = {}
        if rank == 0:
            states = {key: {} for key in keys}
            for flat in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                key, name = flat.split(_SEPARATOR, 1)
                states[key][name] = f.get_tensor(flat)
    sizes = (len(keys),) + (0,) * (world_size - 1)
    return WeightSnapshot(keys, sizes, states)
