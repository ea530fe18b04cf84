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

With `pipemare=PipeMareConfig(...)` and `stage_sizes` it applies PipeMare's rule as
`pipeline.local.asynchronous` defines it, micro-batch by micro-batch in the stream's order
g = step * M + i: stage s (of S, N = update_every) runs g's forward with W_s(f), f =
floor(max(g - (S - 1 - s), 0) / N), and its backward with the saved parameter tensors
reading W_s(b), b = floor(g / N) (T2: W_s(b) - (b - f) * delta_s), written into their
storage untracked; after g, if (g + 1) % N == 0, every stage updates with the mean gradient
of its last N micro-batches (T1: lr scaled by the stage's delay). It keeps the few recent
versions each stage's forwards still need. A drained stream (a segment boundary: a
repartition, another call) lets every in-flight micro-batch finish first, so the next
forwards see every update: `drain()` marks it, and f counts from the segment's start.

With `lr_scheduler=factory` one scheduler is built on its optimizer (one group per layer)
and stepped after every optimizer step, as a user would; the pipeline's per-layer schedules
(`pipeline.local.lr_schedules`) must equal it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.local.carry import as_carry, unwrap
from pipeline.local.determinism import dropout_seed, seed_rng
from pipeline.local.lr_schedules import LrSchedulerFactory
from pipeline.local.microbatch import split_microbatches
from pipeline.local.objective import scalar_loss
from pipeline.local.pipemare import DiscrepancyCorrection, PipeMareConfig, delay, rescaled_lr
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
        pipemare: PipeMareConfig | None = None,
        stage_sizes: Sequence[int] | None = None,
        lr_scheduler: LrSchedulerFactory | None = None,
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
        self._mare = None if pipemare is None else _PipeMare(self, pipemare, stage_sizes)
        if lr_scheduler is not None and pipemare is not None:
            raise ValueError("lr_scheduler= cannot run with pipemare= (T1 sets the lr)")
        self.lr_scheduler = None if lr_scheduler is None else lr_scheduler(self.optimizer)

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
        if self._mare is not None:
            return self._mare.train_step(x, y)
        total = 0.0
        rng = torch.random.get_rng_state()
        chunks = split_microbatches(x, self.n_microbatches, "x")
        targets = split_microbatches(y, self.n_microbatches, "y")
        for i, (xi, yi) in enumerate(zip(chunks, targets, strict=True)):
            carry = tuple(t.to(self.device) for t in as_carry(xi, "x"))
            for spec, layer in zip(self.specs, self.layers, strict=True):
                seed_rng(dropout_seed(self.seed, self.step, i, spec.key), self.device)
                carry = as_carry(layer(unwrap(carry)), spec.key)
            loss = scalar_loss(self.loss_fn, unwrap(carry), yi)
            (loss / self.n_microbatches).backward()
            total += float(loss.item())
        torch.random.set_rng_state(rng)
        if current is not None:
            self._load(current)
            self._previous = current
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.step += 1
        return total / self.n_microbatches

    def drain(self, stage_sizes: Sequence[int] | None = None) -> None:
        """A stream's segment ends here (PipeMare: the next forwards see every update);
        `stage_sizes`: the layers move to this partition (a repartition), each keeping its
        weights, optimizer state and T2 buffers."""
        if self._mare is not None:
            self._mare.g0 = self._mare.g
            if stage_sizes is not None:
                self._mare.partition(stage_sizes)

    def run_microbatch(self, i: int, x: Any, y: Any, between: Any = None) -> float:
        """Micro-batch i's forward and backward (loss / M); `between()` runs in between."""
        carry = tuple(t.to(self.device) for t in as_carry(x, "x"))
        for spec, layer in zip(self.specs, self.layers, strict=True):
            seed_rng(dropout_seed(self.seed, self.step, i, spec.key), self.device)
            carry = as_carry(layer(unwrap(carry)), spec.key)
        loss = scalar_loss(self.loss_fn, unwrap(carry), y)
        if between is not None:
            between()
        (loss / self.n_microbatches).backward()
        return float(loss.item())

    def full_state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        return {
            spec.key: {k: v.detach().cpu().clone() for k, v in layer.state_dict().items()}
            for spec, layer in zip(self.specs, self.layers, strict=True)
        }


class _PipeMare:
    """The PipeMare rule of `ReferenceTrainer` (module doc)."""

    def __init__(
        self, ref: ReferenceTrainer, config: PipeMareConfig, sizes: Sequence[int] | None
    ) -> None:
        self.ref, self.config = ref, config
        self.g = self.g0 = self.updates = 0  # g0: the first micro-batch of the segment
        self.partition(sizes)

    def partition(self, sizes: Sequence[int] | None) -> None:
        """(Re)assign the layers to stages, at a drain: T2's buffers follow the layers."""
        ref, config = self.ref, self.config
        if sizes is None or sum(sizes) != len(ref.layers) or min(sizes) < 1:
            raise ValueError(f"pipemare needs stage_sizes covering the {len(ref.layers)} layers")
        n = len(sizes)
        old = {
            id(p): d
            for c in getattr(self, "corr", [])
            for p, d in zip(c.params, c.delta, strict=True)
        }
        starts = [sum(sizes[:s]) for s in range(n)]
        self.params = [
            [p for layer in ref.layers[a : a + k] for p in layer.parameters()]
            for a, k in zip(starts, sizes, strict=True)
        ]
        self.stage_of = {id(p): s for s, ps in enumerate(self.params) for p in ps}
        self.warmup = [n - 1 - s for s in range(n)]
        self.delays = [delay(n, s, config.update_every) for s in range(n)]
        self.corr = [
            DiscrepancyCorrection(ps, d, config.correction_decay)
            for ps, d in zip(self.params, self.delays, strict=True)
        ]
        for c in self.corr:
            for p, d in zip(c.params, c.delta, strict=True):
                if id(p) in old:
                    d.copy_(old[id(p)])
        self.history: list[dict[int, list[torch.Tensor]]] = [
            {self.updates: [p.detach().clone() for p in ps]} for ps in self.params
        ]

    def _write(self, s: int, values: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, v in zip(self.params[s], values, strict=True):
                p.data.copy_(v)  # untracked: graphs read the storage

    def _backward(self, fwd: list[int], b: int) -> None:
        """Load each stage's backward weights for a micro-batch forwarded at `fwd`."""
        for s, f in enumerate(fwd):
            current = self.history[s][b]
            if self.config.correction and b > f:
                current = [
                    w - (b - f) * d for w, d in zip(current, self.corr[s].delta, strict=True)
                ]
            self._write(s, current)

    def train_step(self, x: Any, y: Any) -> float:
        ref, n_mb = self.ref, self.config.update_every
        total = 0.0
        rng = torch.random.get_rng_state()
        chunks = split_microbatches(x, ref.n_microbatches, "x")
        targets = split_microbatches(y, ref.n_microbatches, "y")
        for i, (xi, yi) in enumerate(zip(chunks, targets, strict=True)):
            g, b = self.g, self.updates
            fwd = [(self.g0 + max(g - self.g0 - w, 0)) // n_mb for w in self.warmup]
            for s, f in enumerate(fwd):
                self._write(s, self.history[s][f])
            total += ref.run_microbatch(i, xi, yi, functools.partial(self._backward, fwd, b))
            for s in range(len(self.params)):
                self._write(s, self.history[s][b])
            self.g += 1
            if self.g % n_mb == 0:
                self._update()
        torch.random.set_rng_state(rng)
        ref.step += 1
        return total / ref.n_microbatches

    def _update(self) -> None:
        opt, config = self.ref.optimizer, self.config
        scale = self.ref.n_microbatches / config.update_every
        for ps in self.params:
            for p in ps:
                if p.grad is not None and scale != 1:
                    p.grad = p.grad * scale
        if config.correction:
            for c in self.corr:
                c.before_update()
        base = [group["lr"] for group in opt.param_groups]
        if config.lr_reschedule:
            for group in opt.param_groups:
                s = self.stage_of[id(group["params"][0])]
                group["lr"] = rescaled_lr(
                    group["lr"], self.updates, self.delays[s], config.warmup_updates
                )
        opt.step()
        for group, lr in zip(opt.param_groups, base, strict=True):
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        if config.correction:
            for c in self.corr:
                c.observe()
        self.updates += 1
        keep = self.updates - max(self.warmup) // config.update_every - 1
        for s, ps in enumerate(self.params):
            self.history[s][self.updates] = [p.detach().clone() for p in ps]
            for v in [v for v in self.history[s] if v < keep]:
                del self.history[s][v]
