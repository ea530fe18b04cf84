"""One stage process's share of the model, and the executor of its action list.

A `Stage` owns a contiguous run of layers, their optimizer and the links to its neighbours.
`run_step` executes the lowered action list of `pipeline.pure.schedule` for one training step:

    RECV_*      post a non-blocking receive (kept in `pending`, keyed by micro-batch)
    FORWARD i   input = batch chunk (stage 0) or the waited receive; run the layers, each
                seeded by (seed, step, i, key); the last stage applies the loss
    SEND_ACT i  non-blocking send of the outputs
    BACKWARD i  last stage: backward of loss_i / M; others: backward of the outputs with the
                received gradients; then the inputs' gradients are ready
    SEND_GRAD i non-blocking send of the inputs' gradients
    STEP        wait for all sends, optimizer step, zero the gradients

Layers run one at a time in both directions: each layer's input is a detached leaf, and
backward walks the layers in reverse, handing each one the gradient of its outputs. That
costs one autograd call per layer and buys three things: per-layer time measurements, and
per-layer memory actions, chosen by the planner:

    keep       autograd keeps the layer's saved tensors until its backward (the default)
    recompute  forward under no_grad keeping only the input; re-run with grad at backward,
               with the same RNG seed, so the result is bit-identical
    swap       saved tensors go to host memory and come back for backward (GPU only)

The loss of a step is the mean of the micro-batch losses and the gradients are those of
that mean, exactly as one process with gradient accumulation computes them. A carry tensor
carries a gradient exactly when it is floating point.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from pipeline.distributed.links import PeerLink, Receive
from pipeline.local.carry import Carry, as_carry
from pipeline.local.determinism import dropout_seed, seed_rng
from pipeline.local.meter import LayerMeter, SavedBytes
from pipeline.local.spec import LayerSpec, build_layer
from pipeline.pure.costs import MEMORY_ACTIONS, LayerCost
from pipeline.pure.schedule import Action, Op
from pipeline.pure.timeline import Span

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
    peak_activation_bytes: int = 0  # measured in-flight peak (steps that measure memory)
    allocator_peak_bytes: int = 0  # GPU only: torch.cuda.max_memory_allocated in the step


@dataclass
class _Layer:
    key: str
    module: nn.Module
    action: str = "keep"
    meter: LayerMeter = field(default_factory=LayerMeter)
    # this step's sums over micro-batches
    forward_s: float = 0.0
    backward_s: float = 0.0
    activation_bytes: int = 0
    output_bytes: int = 0


@dataclass
class _InFlight:
    """What a micro-batch leaves on this stage between its forward and its backward."""

    inputs: list[Carry] = field(default_factory=list)  # per layer, detached leaves
    outputs: list[Carry] = field(default_factory=list)  # per layer; () when recomputed
    loss: torch.Tensor | None = None
    input_grads: list[torch.Tensor] = field(default_factory=list)


def _floating(carry: Carry) -> list[torch.Tensor]:
    return [t for t in carry if t.is_floating_point()]


def _leaf(carry: Carry) -> Carry:
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in carry)


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
        actions: Sequence[str] | None = None,
    ) -> None:
        self.index, self.n_stages, self.seed = index, n_stages, seed
        self.device, self.loss_fn = device, loss_fn
        self.layers = [_Layer(spec.key, build_layer(spec, seed, device)) for spec in specs]
        self.set_memory_actions(actions or ["keep"] * len(self.layers))
        self.optimizer_factory = optimizer
        self.optimizer = _build_optimizer(optimizer, self.layers)
        self.prev = PeerLink(index - 1, comm_device) if index > 0 else None
        self.next = PeerLink(index + 1, comm_device) if index < n_stages - 1 else None
        self.saved = SavedBytes()
        self.spans: list[Span] = []  # what this stage did during the last step
        self._step, self._measure, self._n_microbatches = 0, False, 1

    def set_memory_actions(self, actions: Sequence[str]) -> None:
        if len(actions) != len(self.layers):
            raise ValueError(f"{len(actions)} memory actions for {len(self.layers)} layers")
        for layer, action in zip(self.layers, actions, strict=True):
            if action not in MEMORY_ACTIONS:
                raise ValueError(f"memory action {action!r} is not one of {MEMORY_ACTIONS}")
            if action == "swap" and self.device.type != "cuda":
                action = "keep"  # host memory *is* the device memory: nothing to swap
            layer.action = action
        if self.index == self.n_stages - 1:
            self.layers[-1].action = "keep"  # the loss is computed from it in the forward

    def load_matching(self, states: dict[str, dict[str, torch.Tensor]]) -> list[str]:
        """Load each layer's state from `states[key]` where every shape matches."""
        loaded = []
        for layer in self.layers:
            state, own = states.get(layer.key), layer.module.state_dict()
            if state is None or state.keys() != own.keys():
                continue
            if all(state[k].shape == own[k].shape for k in own):
                layer.module.load_state_dict(state)
                loaded.append(layer.key)
        return loaded

    def seed_meters(self, costs: Sequence[LayerCost]) -> None:
        """Start each layer's meter from profiled costs (the first steps refine them)."""
        for layer, cost in zip(self.layers, costs, strict=True):
            layer.meter = LayerMeter(cost.forward_s, cost.backward_s, cost.activation_bytes,
                                     cost.output_bytes, steps=1)  # fmt: skip

    def param_bytes(self) -> int:
        return sum(_nbytes(p) for p in self.parameters())

    def measured_cost(self, index: int) -> LayerCost:
        """Layer `index`'s costs as measured here: smoothed times, bytes, state bytes."""
        layer, meter = self.layers[index], self.layers[index].meter
        params = list(layer.module.parameters())
        state = self.optimizer.state if self.optimizer is not None else {}
        return LayerCost(
            key=layer.key, forward_s=meter.forward_s, backward_s=meter.backward_s,
            activation_bytes=round(meter.activation_bytes), output_bytes=round(meter.output_bytes),
            param_bytes=sum(_nbytes(p) for p in params),
            grad_bytes=sum(_nbytes(p) for p in params if p.requires_grad),
            optimizer_bytes=sum(_nbytes(v) for p in params for v in state.get(p, {}).values()
                                if isinstance(v, torch.Tensor) and v.dim() > 0),
        )  # fmt: skip

    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state of this stage (what the planner counts)."""
        return sum(c.state_bytes for c in map(self.measured_cost, range(len(self.layers))))

    def parameters(self) -> Iterator[torch.Tensor]:
        for layer in self.layers:
            yield from layer.module.parameters()

    # -- one training step -------------------------------------------------------------------
    def run_step(
        self,
        actions: Sequence[Action],
        step: int,
        inputs: Sequence[Carry] | None,
        targets: Sequence[Any] | None,
        measure_memory: bool = False,
    ) -> tuple[torch.Tensor | None, StepTimes]:
        """Execute one step; returns (sum of micro-batch losses on the last stage, times)."""
        self._n_microbatches = sum(a.op is Op.FORWARD for a in actions)
        self._step, self._measure = step, measure_memory
        times, start = StepTimes(), time.perf_counter()
        pending: dict[tuple[Op, int], Receive] = {}
        live: dict[int, _InFlight] = {}
        loss_sum: torch.Tensor | None = None
        self._begin_step()
        for action in actions:
            op, i = action.op, action.microbatch
            if op is Op.RECV_ACT:
                assert self.prev is not None
                pending[(op, i)] = self.prev.recv_activations(i)
            elif op is Op.RECV_GRAD:
                assert self.next is not None
                pending[(op, i)] = self.next.recv_gradients(i)
            elif op is Op.FORWARD:
                carry = self._stage_input(i, inputs, pending, times)
                live[i] = self._forward(i, carry, targets, times)
                loss = live[i].loss
                if loss is not None:
                    loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            elif op is Op.SEND_ACT:
                assert self.next is not None
                self.next.send_activations(live[i].outputs[-1], i)
            elif op is Op.BACKWARD:
                self._backward(live[i], i, pending, times)
                if self.prev is None:
                    live.pop(i)
            elif op is Op.SEND_GRAD:
                assert self.prev is not None
                self.prev.send_gradients(live.pop(i).input_grads, i)
            elif op is Op.OPTIMIZER_STEP:
                self._optimizer_step(times)
        times.total_s = time.perf_counter() - start
        times.peak_activation_bytes = self.saved.peak if measure_memory else 0
        if measure_memory and self.device.type == "cuda":
            times.allocator_peak_bytes = torch.cuda.max_memory_allocated(self.device)
        self._end_step()
        return loss_sum, times

    def _span(self, name: str, start: float, category: str = "compute") -> float:
        end = time.perf_counter()
        self.spans.append(Span(self.index, name, start, end, category))
        return end - start

    @torch.no_grad()
    def run_forward(self, actions: Sequence[Action], inputs: Sequence[Carry] | None) -> list[Carry]:
        """Inference over micro-batches (eval mode, no graph); the last stage's outputs."""
        pending: dict[tuple[Op, int], Receive] = {}
        outputs: dict[int, Carry] = {}
        for link in (self.prev, self.next):
            if link is not None:
                link.begin_step()
        modes = [layer.module.training for layer in self.layers]
        for layer in self.layers:
            layer.module.eval()
        try:
            for action in actions:
                op, i = action.op, action.microbatch
                if op is Op.RECV_ACT:
                    assert self.prev is not None
                    pending[(op, i)] = self.prev.recv_activations(i)
                elif op is Op.FORWARD:
                    carry = self._stage_input(i, inputs, pending, StepTimes())
                    for layer in self.layers:
                        carry = self._call(layer, i, carry)
                    outputs[i] = carry
                elif op is Op.SEND_ACT:
                    assert self.next is not None
                    self.next.send_activations(outputs.pop(i), i)
            for link in (self.prev, self.next):
                if link is not None:
                    link.wait_sends()
        finally:
            for layer, mode in zip(self.layers, modes, strict=True):
                layer.module.train(mode)
        return [outputs[i] for i in sorted(outputs)]

    def _begin_step(self) -> None:
        self.spans = []
        for link in (self.prev, self.next):
            if link is not None:
                link.begin_step()
        for layer in self.layers:
            layer.forward_s = layer.backward_s = 0.0
            layer.activation_bytes = layer.output_bytes = 0
        if self._measure:
            self.saved.begin_step(list(self.parameters()))
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)

    def _end_step(self) -> None:
        m = self._n_microbatches
        for layer in self.layers:
            meter = layer.meter
            # A recomputed or swapped layer saves less than it would keep: its meter keeps the
            # bytes it keeps when kept (measured then, or profiled), which is what plans use.
            kept = self._measure and layer.action == "keep"
            activation = layer.activation_bytes / m if kept else meter.activation_bytes
            output = layer.output_bytes / m if self._measure else meter.output_bytes
            meter.update(layer.forward_s / m, layer.backward_s / m, activation, output)

    def _stage_input(
        self,
        i: int,
        inputs: Sequence[Carry] | None,
        pending: dict[tuple[Op, int], Receive],
        times: StepTimes,
    ) -> Carry:
        if self.prev is None:
            assert inputs is not None
            return tuple(t.to(self.device, non_blocking=True) for t in inputs[i])
        t0 = time.perf_counter()
        received = pending.pop((Op.RECV_ACT, i)).wait()
        times.wait_s += self._span(f"wait F{i}", t0, "wait")
        return _leaf(tuple(t.to(self.device) for t in received))

    @contextlib.contextmanager
    def _memory_mode(self, layer: _Layer, i: int, added: list[int]) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if layer.action == "recompute":
                stack.enter_context(torch.no_grad())
            elif layer.action == "swap":
                stack.enter_context(torch.autograd.graph.save_on_cpu(pin_memory=True))
            if self._measure and layer.action != "swap":
                stack.enter_context(self.saved.saving(i, added))
            yield

    def _call(self, layer: _Layer, i: int, carry: Carry) -> Carry:
        seed_rng(dropout_seed(self.seed, self._step, i, layer.key), self.device)
        try:
            out = layer.module(carry[0] if len(carry) == 1 else carry)
        except Exception as error:
            shapes = [tuple(t.shape) for t in carry]
            error.add_note(f"in the forward of layer {layer.key!r} on stage {self.index}, "
                           f"input shapes {shapes}")  # fmt: skip
            raise
        return as_carry(out, f"the output of layer {layer.key!r}")

    def _forward(
        self, i: int, carry: Carry, targets: Sequence[Any] | None, times: StepTimes
    ) -> _InFlight:
        state, start = _InFlight(), time.perf_counter()
        for position, layer in enumerate(self.layers):
            if position > 0:
                carry = _leaf(carry)
            t0 = time.perf_counter()
            added = [self.saved.hold(i, carry) if self._measure else 0]
            with self._memory_mode(layer, i, added):
                out = self._call(layer, i, carry)
            elapsed = time.perf_counter() - t0
            layer.forward_s += elapsed
            times.forward_s += elapsed
            layer.activation_bytes += added[0]
            layer.output_bytes += sum(t.numel() * t.element_size() for t in out)
            state.inputs.append(carry)
            state.outputs.append(out)
            carry = out
        if self.next is None:
            assert targets is not None
            t0 = time.perf_counter()
            state.loss = _loss(self.loss_fn, carry, targets[i])
            times.forward_s += time.perf_counter() - t0
        self._span(f"F{i}", start)
        return state

    def _backward(
        self, state: _InFlight, i: int, pending: dict[tuple[Op, int], Receive], times: StepTimes
    ) -> None:
        grads: Sequence[torch.Tensor] = ()
        if self.next is not None:
            t0 = time.perf_counter()
            grads = tuple(g.to(self.device) for g in pending.pop((Op.RECV_GRAD, i)).wait())
            times.wait_s += self._span(f"wait B{i}", t0, "wait")
        start = time.perf_counter()
        for position in reversed(range(len(self.layers))):
            layer, inputs = self.layers[position], state.inputs[position]
            t0 = time.perf_counter()
            if position == len(self.layers) - 1 and state.loss is not None:
                if state.loss.requires_grad:
                    (state.loss / self._n_microbatches).backward()
            else:
                outputs = state.outputs[position]
                if layer.action == "recompute":
                    with torch.enable_grad():
                        outputs = self._call(layer, i, inputs)
                    t0 = time.perf_counter()  # the layer's backward time excludes the recompute
                pairs = [(o, g) for o, g in zip(_floating(outputs), grads, strict=True)
                         if o.requires_grad]  # fmt: skip
                if pairs:
                    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            state.outputs[position] = ()
            if position > 0 or self.prev is not None:
                grads = [t.grad if t.grad is not None else torch.zeros_like(t)
                         for t in _floating(inputs)]  # fmt: skip
            elapsed = time.perf_counter() - t0
            layer.backward_s += elapsed
            times.backward_s += elapsed
        self._span(f"B{i}", start)
        state.input_grads, state.loss = list(grads), None
        state.inputs, state.outputs = [], []
        if self._measure:
            self.saved.release(i)

    def _optimizer_step(self, times: StepTimes) -> None:
        t0 = time.perf_counter()
        for link in (self.prev, self.next):
            if link is not None:
                link.wait_sends()
        times.wait_s += self._span("wait sends", t0, "wait")
        t1 = time.perf_counter()
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        times.optimizer_s += self._span("optimizer step", t1, "optimizer")

    def close(self) -> None:
        for link in (self.prev, self.next):
            if link is not None:
                link.wait_sends()
        self.layers, self.optimizer = [], None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _loss(loss_fn: LossFn, out: Carry, target: Any) -> torch.Tensor:
    loss = loss_fn(out[0] if len(out) == 1 else out, target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor (mean-reduced), got {shape}")
    return loss.reshape(())


def _build_optimizer(
    factory: OptimizerFactory, layers: Sequence[_Layer]
) -> torch.optim.Optimizer | None:
    """One optimizer per stage with one parameter group per layer (migration moves groups)."""
    groups = [
        {"params": params, "layer": layer.key}
        for layer in layers
        if (params := [p for p in layer.module.parameters() if p.requires_grad])
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
