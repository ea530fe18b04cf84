"""A stage's layers as checkpoint entries, and back: everything a layer needs to go on exactly.

`pipeline.distributed.checkpoint` saves and loads a rank's stages through these two
functions; the entry names are `pipeline.pure.checkpoint_format`'s (keyed by layer key).
Per layer, at a step boundary (no gradient is pending then, so none is saved):

    module/<name>                  its state dict: parameters and buffers (W(u))
    optimizer/<state>/<param>      the optimizer's state of each parameter (Adam's moments
                                   and step count, SGD's momentum buffer, ...)
    group                          its parameter group's settings (lr, betas, initial_lr...)
    lr_scheduler                   its scheduler's state (`pipeline.local.lr_schedules`)
    previous/<name>                a stream's second version: W(u-1) under 2BW, T2's deltas
                                   and the update count under PipeMare (what a migration
                                   carries as "previous")

Loading is the inverse on whatever stage holds the layer now: `wanted` lists the entries
this stage's layers need (allocated from the checkpoint's shapes, to be filled by the
loader), `apply` checks them against the live layers (a different shape is another model:
`CheckpointError` naming the layer) and loads them like a migration's receiver does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from pipeline.local.lr_schedules import LayerSchedules
from pipeline.local.stage import Stage
from pipeline.pure.checkpoint_format import CheckpointError, entry_name, layer_prefix, split_entry

__all__ = ["VersionsFor", "apply", "entries", "wanted"]

# A stage's stream weight versions made ready for the layers about to load a "previous"
# (the caller knows the schedule); None: the schedule in force keeps no second version.
VersionsFor = Callable[[Stage], Any]


def entries(stages: Sequence[Stage], schedules: LayerSchedules) -> dict[str, Any]:
    """Every entry of this rank's layers (tensors as they are: the writer copies them)."""
    out: dict[str, Any] = {}
    for stage in stages:
        optimizer = stage.optimizer
        groups = {g["layer"]: g for g in optimizer.param_groups} if optimizer else {}
        versions = stage.versions
        for layer in stage.layers:
            key, module = layer.key, layer.module
            for name, value in module.state_dict().items():
                out[entry_name(key, "module", name)] = _detached(value)
            if optimizer is not None:
                for pname, p in module.named_parameters():
                    for k, v in optimizer.state.get(p, {}).items():
                        out[entry_name(key, "optimizer", f"{k}/{pname}")] = _detached(v)
            if key in groups:
                out[entry_name(key, "group")] = {
                    k: _detached(v) for k, v in groups[key].items() if k != "params"
                }
            scheduler = schedules.state(key)
            if scheduler is not None:
                out[entry_name(key, "lr_scheduler")] = scheduler
            if versions is not None and key in versions.layer_keys():
                for name, value in versions.previous(key).items():
                    out[entry_name(key, "previous", name)] = _detached(value)
    return out


def wanted(
    stages: Sequence[Stage], available: Mapping[str, tuple[torch.Size, torch.dtype] | None]
) -> dict[str, Any]:
    """The entries this rank's layers need, from the checkpoint's `available` ones (name ->
    (shape, dtype) of a tensor, None for an object): empty CPU tensors to read into, None
    for objects. A layer with no module entry is not in the checkpoint: CheckpointError."""
    out: dict[str, Any] = {}
    for stage in stages:
        for layer in stage.layers:
            prefix = layer_prefix(layer.key)
            names = [name for name in available if name.startswith(prefix)]
            if not any(split_entry(name)[1] == "module" for name in names):
                if not list(layer.module.state_dict()):
                    continue  # a layer without state has no entry to find
                raise CheckpointError(f"the checkpoint holds no state of layer {layer.key!r}")
            for name in names:
                meta = available[name]
                out[name] = None if meta is None else torch.empty(meta[0], dtype=meta[1])
    return out


def apply(
    stages: Sequence[Stage],
    loaded: Mapping[str, Any],
    schedules: LayerSchedules,
    versions_for: VersionsFor,
) -> None:
    """Load the `wanted` entries, filled, into this rank's layers (module doc)."""
    by_layer: dict[str, dict[str, dict[str, Any]]] = {}
    for name, value in loaded.items():
        key, part, tail = split_entry(name)
        by_layer.setdefault(key, {}).setdefault(part, {})[tail] = value
    for stage in stages:
        versions = None
        for layer in stage.layers:
            parts = by_layer.get(layer.key, {})
            _load_module(layer.key, layer.module, parts.get("module", {}))
            _load_optimizer(stage, layer.key, layer.module, parts)
            if "lr_scheduler" in parts:
                schedules.load(layer.key, parts["lr_scheduler"][""])
            if "previous" in parts:
                versions = versions if versions is not None else versions_for(stage)
                if versions is not None:
                    versions.attach(layer.key, layer.module, dict(parts["previous"]))


def _load_module(key: str, module: torch.nn.Module, state: Mapping[str, Any]) -> None:
    own = module.state_dict()
    if state.keys() != own.keys():
        missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
        raise CheckpointError(
            f"layer {key!r} differs from the checkpoint's: missing there {missing}, "
            f"unknown here {extra} (a checkpoint of another model?)"
        )
    for name, value in state.items():
        if torch.is_tensor(value) and value.shape != own[name].shape:
            raise CheckpointError(
                f"layer {key!r}: {name} has shape {tuple(own[name].shape)} here, "
                f"{tuple(value.shape)} in the checkpoint (a checkpoint of another model?)"
            )
    module.load_state_dict(dict(state))


def _load_optimizer(
    stage: Stage, key: str, module: torch.nn.Module, parts: Mapping[str, Mapping[str, Any]]
) -> None:
    optimizer = stage.optimizer
    if optimizer is None:
        return
    group = next((g for g in optimizer.param_groups if g.get("layer") == key), None)
    if group is not None and "group" in parts:
        settings = parts["group"][""]
        group.update({k: v for k, v in settings.items() if k not in ("params", "layer")})
    params = dict(module.named_parameters())
    states: dict[str, dict[str, Any]] = {}
    for tail, value in parts.get("optimizer", {}).items():
        name, _, pname = tail.partition("/")
        states.setdefault(pname, {})[name] = value
    for pname, state in states.items():
        p = params.get(pname)
        if p is None:
            raise CheckpointError(
                f"layer {key!r} has no parameter {pname!r} for its optimizer state"
            )
        # like Optimizer.load_state_dict (and a migration): step counters stay where they are
        optimizer.state[p] = {
            k: v.to(p.device) if torch.is_tensor(v) and k != "step" else v for k, v in state.items()
        }


def _detached(value: Any) -> Any:
    return value.detach() if torch.is_tensor(value) else value
