"""A whole model in one process, built from a pipeline's layer specs: inference without it.

`ElasticPipeline.replica()` builds one on every rank with the pipeline's current weights.
Some inference runs a model many times on a few rows: greedy decoding calls it once per
generated token. Through the pipeline every such call waits on each stage in turn, and
its outputs travel back to every rank; with a replica on each rank, the ranks decode
their own shares of the examples at once, data parallel. A replica holds every weight of
the model (not its activations, gradients or optimizer state: it only infers), so it fits
where the model's parameters fit one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from pipeline.local.carry import through
from pipeline.local.spec import LayerSpec, build_layer

__all__ = ["Replica"]


class Replica(nn.Module):
    """The layers of `specs` in order, loaded with `states` ({layer key: state dict}), in
    eval mode: `replica(x)` computes what the pipeline's `forward(x)` does."""

    def __init__(
        self,
        specs: Sequence[LayerSpec],
        states: Mapping[str, Mapping[str, torch.Tensor]],
        seed: int,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.keys = [spec.key for spec in specs]
        self.layers = nn.ModuleList(build_layer(spec, seed, device) for spec in specs)
        for key, layer in zip(self.keys, self.layers, strict=True):
            layer.load_state_dict(states[key])
        self.eval()

    def forward(self, x: Any) -> Any:
        with torch.no_grad():
            return through(zip(self.keys, self.layers, strict=True), x)
