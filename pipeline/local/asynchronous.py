"""One weight copy updated under in-flight micro-batches: PipeMare's stage mechanism.

Under `schedule="pipemare"` (`pipeline.pure.pipemare`) a stage keeps ONE copy of its
weights and updates it after every `update_every` (N) of its own backwards, while other
micro-batches' graphs are alive. Autograd would refuse: an optimizer writes parameters in
place, which bumps the version counter of every tensor a live graph saved from them. So a
layer runs through `torch.func.functional_call` with *compute leaves*: per parameter p a
leaf w with p's storage (`p.data = w.data`) but its own version counter. The optimizer
writes p (bumping p's counter, which no graph saved); the graphs saved w, whose counter
nothing bumps; the bytes are shared. Gradients accumulate in `w.grad` and become `p.grad`
at an update.

Definition (what a backward computes, exactly). Micro-batch g's backward on stage s is the
backward of the graph its forward recorded, in which every saved tensor that *is* a
compute leaf, or a view of one, reads the leaf's storage at backward time, and every other
saved tensor keeps its forward-time value. At backward time the storage holds

    plain asynchronous:  W(b)                       b = updates applied before B(g)
    T2 (correction):     W(b) - (b - f) * delta     f = updates applied before F(g)

(T2 only when b > f; the storage is put back to W(b) right after, bit for bit, from a
copy). Under 1F1B stage s runs S - 1 - s backwards between F(g) and B(g), so with N = 1
b - f = S - 1 - s and in general f = floor((g - (S - 1 - s)) / N) (0 while negative),
b = floor(g / N). The reference (`pipeline.local.reference`, pipemare=...) applies this
definition in one process, and the pipeline equals it.

Caveats of the definition. (1) A tensor a layer derives from its weights that is not a
view (`w * scale`, a fused weight built in forward, a weight-normed matrix) is saved with
its forward-time value, so its backward mixes the two versions: exact to the definition,
not to "the backward uses W(b)". (2) A layer under the "recompute" memory action re-runs
its forward at backward time, so its whole backward is at the backward weights. (3) The
weight gradient of a matmul, grad_out^T x, uses the forward's saved input x: PipeMare's
gradient is evaluated at the forward's activations and the backward's weights.

An update (after B(g) with (g + 1) % N == 0): the gradients (of loss / M per micro-batch,
scaled by M / N: the mean over the update's N micro-batches) move to `p.grad`; T1 sets
each parameter group's lr to `rescaled_lr` of the stage's delay and its update count k for
this step only; T2 remembers W, the optimizer steps, T2 folds W(k+1) - W(k) into delta.

What migrates with a layer (`previous`/`attach`, the names `WeightVersions` uses): T2's
delta buffers and the update count k (T1's counter), as tensors; its weights and
optimizer state travel as for any schedule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from pipeline.local.pipemare import DiscrepancyCorrection, PipeMareConfig, rescaled_lr

__all__ = ["AsyncWeights"]


class AsyncWeights:
    """A stage's compute leaves, T2 buffers and update count under PipeMare (module doc)."""

    def __init__(
        self, config: PipeMareConfig, stage_delay: int, n_microbatches: int, updates: int
    ) -> None:
        self.config, self.delay, self.m = config, stage_delay, n_microbatches
        self.updates = updates  # k: updates applied on this stage (T1's counter)
        self._leaves: dict[str, dict[str, torch.Tensor]] = {}
        self._params: dict[str, dict[str, nn.Parameter]] = {}
        self._corrections: dict[str, DiscrepancyCorrection] = {}
        self._at_forward: dict[int, int] = {}  # micro-batch -> updates applied before F(g)

    # -- layers (the interface migration uses for `WeightVersions` too) ------------------
    def attach(
        self, key: str, module: nn.Module, previous: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Give a layer compute leaves; `previous` is what `previous(key)` packed (T2's
        delta and the update count) when the layer migrated here."""
        params = dict(module.named_parameters())
        leaves = {n: p.data.detach().requires_grad_(p.requires_grad) for n, p in params.items()}
        for n, p in params.items():
            p.data = leaves[n].data  # the same bytes, separate version counters
        self._leaves[key], self._params[key] = leaves, params
        if previous is not None and "updates" in previous:
            carried = int(previous["updates"].item())
            if carried != self.updates:
                raise ValueError(
                    f"layer {key!r} arrives after {carried} PipeMare updates, "
                    f"this stage has applied {self.updates}"
                )
        if self.config.correction:
            corr = DiscrepancyCorrection(params.values(), self.delay, self.config.correction_decay)
            if previous is not None:
                for n, d in zip(params, corr.delta, strict=True):
                    d.copy_(previous[f"delta.{n}"])
            self._corrections[key] = corr

    def previous(self, key: str) -> dict[str, torch.Tensor]:
        """What migrates beside the state dict: T2's delta per parameter and the count."""
        out = {"updates": torch.tensor(self.updates)}
        corr = self._corrections.get(key)
        if corr is not None:
            for n, d in zip(self._params[key], corr.delta, strict=True):
                out[f"delta.{n}"] = d.detach()
        return out

    def layer_keys(self) -> list[str]:
        return list(self._leaves)

    def index(self) -> tuple[dict[str, Any], ...]:
        return dict(self._leaves), dict(self._params), dict(self._corrections)

    def restore(self, index: tuple[dict[str, Any], ...]) -> None:
        self._leaves, self._params, self._corrections = (dict(x) for x in index)

    def drop(self, key: str) -> None:
        self._leaves.pop(key, None)
        self._params.pop(key, None)
        self._corrections.pop(key, None)

    def weights(self, key: str, version: int | None = None) -> dict[str, torch.Tensor]:
        """Layer `key`'s compute leaves, for `functional_call` (there is one version)."""
        return self._leaves[key]

    def tensors(self) -> list[torch.Tensor]:
        """The compute leaves (they share the parameters' storage)."""
        return [w for leaves in self._leaves.values() for w in leaves.values()]

    def nbytes(self) -> int:
        """Bytes beyond the parameters: T2's delta buffers."""
        return sum(
            d.numel() * d.element_size() for c in self._corrections.values() for d in c.delta
        )

    # -- one micro-batch ------------------------------------------------------------------
    def note_forward(self, i: int) -> None:
        self._at_forward[i] = self.updates

    @contextlib.contextmanager
    def backward_weights(self, i: int) -> Iterator[None]:
        """The storage holds micro-batch i's backward weights inside (module doc)."""
        lag = self.updates - self._at_forward.pop(i, self.updates)
        if not (self._corrections and lag > 0):
            yield
            return
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for key, corr in self._corrections.items():
                for w, u in zip(
                    self._leaves[key].values(), corr.backward_weights(lag), strict=True
                ):
                    saved.append((w, w.detach().clone()))
                    w.data.copy_(u)  # untracked: no version counter moves
        try:
            yield
        finally:
            with torch.no_grad():
                for w, value in saved:
                    w.data.copy_(value)

    def due(self, i: int) -> bool:
        """Whether the stage updates after micro-batch i's backward."""
        return (i + 1) % self.config.update_every == 0

    def update(self, optimizer: torch.optim.Optimizer | None) -> None:
        """One update from the gradients of the last N backwards (module doc)."""
        scale = self.m / self.config.update_every
        for key, params in self._params.items():
            for n, p in params.items():
                w = self._leaves[key][n]
                grad, w.grad = w.grad, None
                p.grad = grad * scale if grad is not None and scale != 1 else grad
        base: list[float] = []
        try:
            if optimizer is None:
                return
            for corr in self._corrections.values():
                corr.before_update()
            if self.config.lr_reschedule:
                for group in optimizer.param_groups:
                    base.append(group["lr"])
                    group["lr"] = rescaled_lr(
                        group["lr"], self.updates, self.delay, self.config.warmup_updates
                    )
            optimizer.step()
            for corr in self._corrections.values():
                corr.observe()
        finally:
            if optimizer is not None:
                for group, lr in zip(optimizer.param_groups, base, strict=False):
                    group["lr"] = lr
                optimizer.zero_grad(set_to_none=True)
            self.updates += 1

    def zero_grads(self) -> None:
        """Forget gradients not applied (a failed stream) and the forwards' counts."""
        self._at_forward.clear()
        for leaves in self._leaves.values():
            for w in leaves.values():
                w.grad = None
