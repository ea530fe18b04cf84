"""Layers as data: a stable key plus a picklable factory.

The runtime never ships `nn.Module` objects around. A `LayerSpec` names a layer and says how
to build it, so any stage process can build any layer: at start-up, after a migration, or
for the next NAS candidate. The key is the layer's identity: it seeds its weights (see
`pipeline.local.determinism`), names its entry in `full_state_dict()`, and follows it across
migrations. Factories must be picklable (module-level functions, classes, or
`functools.partial` of them) because specs travel between processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.local.determinism import layer_seed

__all__ = ["LayerSpec", "build_layer", "check_specs"]


@dataclass(frozen=True)
class LayerSpec:
    """One pipeline layer: `factory()` returns an `nn.Module` that maps carry -> carry.

    The carry is a tensor or a tuple of tensors; the first layer receives the batch input,
    the last layer's output goes to the loss function.
    """

    key: str
    factory: Callable[[], nn.Module]

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"LayerSpec key must be a non-empty string, got {self.key!r}")
        if isinstance(self.factory, nn.Module):
            raise TypeError(
                f"LayerSpec {self.key!r}: factory is an nn.Module instance; pass something "
                "that builds one, e.g. the class or "
                f"functools.partial({type(self.factory).__name__}, ...)"
            )
        if not callable(self.factory):
            raise TypeError(
                f"LayerSpec {self.key!r}: factory must be callable and return an nn.Module, "
                f"got {type(self.factory).__name__}"
            )


def check_specs(specs: Sequence[LayerSpec]) -> list[LayerSpec]:
    """Validate a layer list at the API boundary: non-empty, all specs, unique keys."""
    specs = list(specs)
    if not specs:
        raise ValueError("the layer list is empty; pass at least one LayerSpec")
    seen: set[str] = set()
    for position, spec in enumerate(specs):
        if not isinstance(spec, LayerSpec):
            raise TypeError(
                f"layer {position} is a {type(spec).__name__}, expected a LayerSpec "
                "(wrap modules as LayerSpec(key, factory))"
            )
        if spec.key in seen:
            raise ValueError(f"duplicate layer key {spec.key!r} at position {position}")
        seen.add(spec.key)
    return specs


def build_layer(spec: LayerSpec, seed: int, device: torch.device) -> nn.Module:
    """Build `spec` with weights that depend only on (seed, key), then move it to `device`.

    The global RNG is left as it was. Weights are drawn on the CPU so that every device
    type gets the same initial values.
    """
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(layer_seed(seed, spec.key))
        try:
            module = spec.factory()
        except Exception as error:
            error.add_note(f"while building layer {spec.key!r} with {spec.factory!r}")
            raise
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"the factory of layer {spec.key!r} returned a {type(module).__name__}; "
            "it must return a torch.nn.Module"
        )
    return module.to(device)
