"""Single-process training with exactly the pipeline's semantics: the yardstick.

`ReferenceTrainer` trains the same `LayerSpec`s in one process, one micro-batch at a time
with gradient accumulation, drawing the same random numbers as the pipeline (weights from
`(seed, key)`, dropout from `(seed, step, micro-batch, key)`). A pipelined run must match it;
tests use it for that, and users can use it to check their own layer lists.

With `pipedream_2bw=True` it applies PipeDream-2BW's rule instead (`pipeline.pure.two_bw`):
step t's micro-batches run their forwards and backwards with W(t-1), and the optimizer
update of W(t) uses those gradients, so W(t+1) = W(t) - lr * grad f(W(t-1)), W(-1) = W(0).
It keeps W(t-1) as a copy, loads it into the layers for the step's compute, puts W(t)
back, and steps the optimizer (whose state stays on the live parameters).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pipeline.local.carry import as_carry, unwrap
from pipeline.local.determinism import dropout_seed, seed_rng
from pipeline.local.microbatch import split_microbatches
from pipeline.local.spec import LayerSpec, build_layer, check_specs
from pipeline.local.stage import LossFn, OptimizerFactory

__all__ = ["ReferenceTrainer"]


class ReferenceTrainer:
    def __init__(
        self,
        specs: Sequence[LayerSpec],
        *,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        n_microbatches: int,
        seed: int = 0,
        device: torch.device | str = "cpu",
        pipedream_2bw: bool = False,
    ) -> None:
        self.specs = check_specs(specs)
        self.device = torch.device(device)
        self.layers = [build_layer(spec, seed, self.device) for spec in self.specs]
        groups = [
            {"params": list(layer.parameters()), "layer": spec.key}
            for spec, layer in zip(self.specs, self.layers, strict=True)
            if any(True for _ in layer.parameters())
        ]
        self.optimizer = optimizer(groups)
        self.loss_fn, self.n_microbatches, self.seed, self.step = loss_fn, n_microbatches, seed, 0
        # 2BW: W(t - 1), the version step t computes with (None: synchronous training)
        self._previous = self._weights() if pipedream_2bw else None

    def _weights(self) -> list[torch.Tensor]:
        return [p.detach().clone() for layer in self.layers for p in layer.parameters()]

    def _load(self, weights: list[torch.Tensor]) -> None:
        params = [p for layer in self.layers for p in layer.parameters()]
        with torch.no_grad():
            for p, w in zip(params, weights, strict=True):
                p.copy_(w)

    def train_step(self, x: Any, y: Any) -> float:
        current = None
        if self._previous is not None:  # 2BW: compute at W(t - 1), update W(t)
            current = self._weights()
            self._load(self._previous)
        total = 0.0
        rng = torch.random.get_rng_state()
        chunks = split_microbatches(x, self.n_microbatches, "x")
        targets = split_microbatches(y, self.n_microbatches, "y")
        for i, (xi, yi) in enumerate(zip(chunks, targets, strict=True)):
            carry = tuple(t.to(self.device) for t in as_carry(xi, "x"))
            for spec, layer in zip(self.specs, self.layers, strict=True):
                seed_rng(dropout_seed(self.seed, self.step, i, spec.key), self.device)
                carry = as_carry(layer(unwrap(carry)), spec.key)
            loss = self.loss_fn(unwrap(carry), yi)
            (loss / self.n_microbatches).backward()
            total += float(loss.item())
        torch.random.set_rng_state(rng)
        if current is not None:
            self._load(current)
            self._previous = current
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return total / self.n_microbatches

    def full_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {
            spec.key: {k: v.detach().cpu().clone() for k, v in layer.state_dict().items()}
            for spec, layer in zip(self.specs, self.layers, strict=True)
        }
