"""One stage process's share of the model, and the executor of its action list.

A `Stage` owns a contiguous run of layers, their optimizer and the links to its neighbours.
`run_step` executes the lowered action list of `pipeline.schedule` for one training step:

    RECV_*      post a non-blocking receive (kept in `pending`, keyed by micro-batch)
    FORWARD i   input = batch chunk (stage 0) or the waited receive; run the layers, each
                seeded by (seed, step, i, key); the last stage applies the loss
    SEND_ACT i  non-blocking send of the outputs
    BACKWARD i  last stage: backward of loss_i / M; others: backward of the outputs with the
                received gradients; then the inputs' gradients are ready
    SEND_GRAD i non-blocking send of the inputs' gradients
    STEP        wait for all sends, optimizer step, zero the gradients

The loss of a step is the mean of the micro-batch losses and the gradients are those of
that mean, exactly as one process with gradient accumulation computes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipeline.comm import Carry, PeerLink, Receive, as_carry
from pipeline.determinism import dropout_seed, seed_rng
from pipeline.schedule import Action, Op
from pipeline.spec import LayerSpec, build_layer

__all__ = ["OptimizerFactory", "Stage", "StepTimes"]

OptimizerFactory = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass
class StepTimes:
    """Where one stage's time went during one step (seconds)."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    wait_s: float = 0.0  # blocked on a receive or on the sends before the optimizer step
    optimizer_s: float = 0.0
    total_s: float = 0.0


@dataclass
class _InFlight:
    """What a micro-batch leaves on this stage between its forward and its backward."""

    inputs: Carry = ()
    outputs: Carry = ()
    loss: torch.Tensor | None = None
    input_grads: list[torch.Tensor] = field(default_factory=list)


class Stage:
    def __init__(
        self,
        index: int,
        n_stages: int,
        specs: Sequence[LayerSpec],
        *,
        seed: int,
        device: torch.device,
        comm_device: torch.device,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
    ) -> None:
        self.index, self.n_stages, self.seed = index, n_stages, seed
        self.device, self.loss_fn = device, loss_fn
        self.layers: list[tuple[str, nn.Module]] = [
            (spec.key, build_layer(spec, seed, device)) for spec in specs
        ]
        self.optimizer = _build_optimizer(optimizer, self.layers)
        self.prev = PeerLink(index - 1, comm_device) if index > 0 else None
        self.next = PeerLink(index + 1, comm_device) if index < n_stages - 1 else None

    @property
    def is_first(self) -> bool:
        return self.prev is None

    @property
    def is_last(self) -> bool:
        return self.next is None

    def param_bytes(self) -> int:
        return sum(
            p.numel() * p.element_size() for _, layer in self.layers for p in layer.parameters()
        )

    # -- one training step -------------------------------------------------------------------
    def run_step(
        self,
        actions: Sequence[Action],
        step: int,
        inputs: Sequence[Carry] | None,
        targets: Sequence[Any] | None,
    ) -> tuple[torch.Tensor | None, StepTimes]:
        """Execute one step; returns (sum of micro-batch losses on the last stage, times)."""
        n_microbatches = sum(a.op is Op.FORWARD for a in actions)
        times, start = StepTimes(), time.perf_counter()
        pending: dict[tuple[Op, int], Receive] = {}
        live: dict[int, _InFlight] = {}
        loss_sum: torch.Tensor | None = None
        for link in (self.prev, self.next):
            if link is not None:
                link.begin_step()
        for action in actions:
            op, i = action.op, action.microbatch
            if op is Op.RECV_ACT:
                assert self.prev is not None
                pending[(op, i)] = self.prev.recv_activations(i)
            elif op is Op.RECV_GRAD:
                assert self.next is not None
                pending[(op, i)] = self.next.recv_gradients(i)
            elif op is Op.FORWARD:
                live[i] = self._forward(i, step, inputs, targets, pending, times)
                if live[i].loss is not None:
                    loss = live[i].loss.detach()  # type: ignore[union-attr]
                    loss_sum = loss if loss_sum is None else loss_sum + loss
            elif op is Op.SEND_ACT:
                assert self.next is not None
                self.next.send_activations(live[i].outputs, i)
            elif op is Op.BACKWARD:
                self._backward(live[i], i, n_microbatches, pending, times)
            elif op is Op.SEND_GRAD:
                assert self.prev is not None
                self.prev.send_gradients(live.pop(i).input_grads, i)
            elif op is Op.OPTIMIZER_STEP:
                self._optimizer_step(times)
            if op is Op.BACKWARD and self.prev is None:
                live.pop(i)
        times.total_s = time.perf_counter() - start
        return loss_sum, times

    def _forward(
        self,
        i: int,
        step: int,
        inputs: Sequence[Carry] | None,
        targets: Sequence[Any] | None,
        pending: dict[tuple[Op, int], Receive],
        times: StepTimes,
    ) -> _InFlight:
        if self.prev is None:
            assert inputs is not None
            carry = tuple(t.to(self.device, non_blocking=True) for t in inputs[i])
        else:
            t0 = time.perf_counter()
            received = pending.pop((Op.RECV_ACT, i)).wait()
            times.wait_s += time.perf_counter() - t0
            assert self.prev.inbound_meta is not None
            carry = tuple(
                t.to(self.device).requires_grad_(meta.requires_grad)
                for t, meta in zip(received, self.prev.inbound_meta, strict=True)
            )
        t0 = time.perf_counter()
        state = _InFlight(inputs=carry)
        out: Carry = carry
        for key, layer in self.layers:
            seed_rng(dropout_seed(self.seed, step, i, key), self.device)
            out = as_carry(layer(out[0] if len(out) == 1 else out), f"the output of layer {key!r}")
        state.outputs = out
        if self.next is None:
            assert targets is not None
            state.loss = _loss(self.loss_fn, out, targets[i])
        times.forward_s += time.perf_counter() - t0
        return state

    def _backward(
        self,
        state: _InFlight,
        i: int,
        n_microbatches: int,
        pending: dict[tuple[Op, int], Receive],
        times: StepTimes,
    ) -> None:
        if self.next is None:
            assert state.loss is not None
            t0 = time.perf_counter()
            if state.loss.requires_grad:
                (state.loss / n_microbatches).backward()
        else:
            t0 = time.perf_counter()
            grads = pending.pop((Op.RECV_GRAD, i)).wait()
            times.wait_s += time.perf_counter() - t0
            t0 = time.perf_counter()
            outs = [o for o in state.outputs if o.requires_grad and o.is_floating_point()]
            grads = tuple(g.to(self.device) for g in grads)
            if outs:
                torch.autograd.backward(outs, grads)
        if self.prev is not None:
            assert self.prev.inbound_meta is not None
            state.input_grads = [
                t.grad if t.grad is not None else torch.zeros_like(t)
                for t, meta in zip(state.inputs, self.prev.inbound_meta, strict=True)
                if meta.requires_grad
            ]
        state.outputs, state.loss = (), None  # free the graph now, not at the step's end
        times.backward_s += time.perf_counter() - t0

    def _optimizer_step(self, times: StepTimes) -> None:
        t0 = time.perf_counter()
        for link in (self.prev, self.next):
            if link is not None:
                link.wait_sends()
        t1 = time.perf_counter()
        times.wait_s += t1 - t0
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        times.optimizer_s += time.perf_counter() - t1

    def close(self) -> None:
        for link in (self.prev, self.next):
            if link is not None:
                link.wait_sends()
        self.layers, self.optimizer = [], None


def _loss(loss_fn: LossFn, out: Carry, target: Any) -> torch.Tensor:
    loss = loss_fn(out[0] if len(out) == 1 else out, target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor (mean-reduced), got {shape}")
    return loss.reshape(())


def _build_optimizer(
    factory: OptimizerFactory, layers: Sequence[tuple[str, nn.Module]]
) -> torch.optim.Optimizer | None:
    """One optimizer per stage with one parameter group per layer (migration moves groups)."""
    groups = [
        {"params": params, "layer": key}
        for key, layer in layers
        if (params := [p for p in layer.parameters() if p.requires_grad])
    ]
    if not groups:
        return None
    optimizer = factory(groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"the optimizer factory returned a {type(optimizer).__name__}; it must return a "
            "torch.optim.Optimizer built from the parameter groups it is given, e.g. "
            "functools.partial(torch.optim.AdamW, lr=1e-3)"
        )
    return optimizer
