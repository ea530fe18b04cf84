"""One stage's share of the model and its compute, one micro-batch at a time.

A `Stage` owns a contiguous run of layers and their optimizer. It knows nothing of other
processes: `pipeline.distributed.executor` runs a schedule's action list and calls

    begin_step        reset this step's sums (and, when asked, the memory counters)
    forward(i)        micro-batch i through the layers, each seeded by (seed, step, i, key);
                      the last stage applies the loss
    backward(i)       the inputs' gradients of micro-batch i from its outputs' (with
                      split=True, the weights' wait for backward_weight(i): zero bubble);
                      `pipeline.local.stage_backward`
    optimizer_step    apply the accumulated gradients, then zero them
    use_step(t)       PipeDream-2BW streams: the step of the next compute, whose weight
                      version W(t-1) the layers run with (`pipeline.local.versions`,
                      made by `enable_versions`); optimizer_step then applies update u.
                      PipeMare (`enable_pipemare`): one weight copy, updated inside
                      backward(i) every N micro-batches (`pipeline.local.asynchronous`);
                      `measure_stream` counts a stream's memory over its first steps
    set_handoff       Bi-Partition (`pipeline.distributed.handoff`): the last k layers run
                      forward without a graph and send their inputs with the carry; the
                      next stage runs their backward on replicas (`pipeline.local.separable`)
    end_step          the step's times; per-layer meters updated (abort_step: forget it),
                      read back by the planner as costs (`pipeline.local.stage_costs`)

An exception in a layer, the loss or the optimizer comes out as `ComputeError`, which says
where (phase, layer key, micro-batch) and keeps the original exception as its cause.

On a step that measures (the first of every plan, and every `measure_memory_every`-th),
layers run one at a time in both directions: each layer's input is a detached leaf, and
backward walks the layers in reverse, handing each one the gradient of its outputs. That
costs one autograd call per layer and buys per-layer time measurements
(`pipeline.local.stage_costs`) and saved-bytes counts. Every other step runs the stage's
layers as one graph, one backward call (`pipeline.local.fused`), with the same results.
Either way each layer has its memory action, chosen by the planner: keep, recompute or swap
(`pipeline.local.stage_memory`; its `MemoryPolicy`, the stage's `memory`, counts the saved
bytes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from pipeline.local import fused, stage_backward, stage_costs, stage_memory
from pipeline.local.asynchronous import AsyncWeights
from pipeline.local.carry import Carry, as_carry, leaf, nbytes, unwrap
from pipeline.local.clock import clock
from pipeline.local.determinism import dropout_seed, seed_rng
from pipeline.local.inflight import ComputeError, InFlight, StepTimes
from pipeline.local.layer import StageLayer
from pipeline.local.meter import SavedBytes
from pipeline.local.objective import LossFn, OptimizerFactory, build_optimizer, scalar_loss
from pipeline.local.pipemare import PipeMareConfig, delay
from pipeline.local.separable import HandedLayers
from pipeline.local.spec import LayerSpec, build_layer
from pipeline.local.versions import WeightVersions
from pipeline.pure.costs import LayerCost
from pipeline.pure.timeline import Span

__all__ = ["ComputeError", "InFlight", "LossFn", "OptimizerFactory", "Stage", "StepTimes"]


def _one_tensor(carry: Carry, key: str, what: str, i: int) -> Carry:
    """A handed layer (Bi-Partition) takes and returns one floating tensor."""
    if len(carry) != 1 or not carry[0].is_floating_point():
        error = TypeError(
            f"layer {key!r} runs its backward on the next stage (handoff), so "
            f"its {what} must be one floating-point tensor, got "
            f"{[(tuple(t.shape), t.dtype) for t in carry]}"
        )
        raise ComputeError("forward", key, i, error)
    return carry


class Stage:
    """The layers one stage holds, their optimizer, meters, and their compute."""

    def __init__(
        self,
        index: int,
        n_stages: int,
        specs: Sequence[LayerSpec],
        *,
        seed: int,
        device: torch.device,
        optimizer: OptimizerFactory,
        loss_fn: LossFn,
        actions: Sequence[str] | None = None,
    ) -> None:
        self.index, self.n_stages, self.seed = index, n_stages, seed
        self.device, self.loss_fn = device, loss_fn
        self.now = clock(device)  # every measured boundary: true kernel time on a GPU
        self.layers = [StageLayer(spec.key, build_layer(spec, seed, device)) for spec in specs]
        self.set_memory_actions(actions or ["keep"] * len(self.layers))
        self.optimizer_factory = optimizer
        self.optimizer = build_optimizer(optimizer, [(x.key, x.module) for x in self.layers])
        self.memory = stage_memory.MemoryPolicy(device)  # what is kept, and counted
        self.spans: list[Span] = []  # what this stage did during the last step
        self._step, self._n_microbatches, self._stream = 0, 1, False
        # 2BW's two weight versions, or PipeMare's one copy (`pipeline.local.asynchronous`)
        self.versions: WeightVersions | AsyncWeights | None = None
        # Bi-Partition: this stage's last `handoff_out` layers run their backward on the
        # next stage; `handed_in` runs the previous stage's handed layers' backward here
        self.handoff_out = 0
        self.handed_in: HandedLayers | None = None
        self.times, self._start = StepTimes(), 0.0

    def set_handoff(self, handoff_out: int, handed_in: HandedLayers | None) -> None:
        """Bi-Partition's cut at both ends of this stage (`pipeline.distributed.handoff`)."""
        if not 0 <= handoff_out < len(self.layers) or (handoff_out and self.versions):
            raise ValueError(
                f"stage {self.index} cannot hand {handoff_out} of its "
                f"{len(self.layers)} layers' backward to the next stage"
            )
        if handoff_out and self.index == self.n_stages - 1:
            raise ValueError("the last stage has no next stage to hand a backward to")
        self.handoff_out, self.handed_in = handoff_out, handed_in

    @property
    def saved(self) -> SavedBytes:
        """The saved activations counted so far (read-only; `MemoryPolicy` owns them)."""
        return self.memory.saved

    @property
    def fuses(self) -> bool:
        """Whether micro-batches starting now run as one graph (`pipeline.local.fused`):
        on steps that measure nothing per layer, unless Bi-Partition hands layers over."""
        return not (self.memory.measuring or self.handoff_out or self.handed_in is not None)

    @property
    def n_microbatches(self) -> int:
        """Micro-batches per step of the current step (read-only)."""
        return self._n_microbatches

    @property
    def streaming(self) -> bool:
        """Whether the current step is a stream's, interleaved with its neighbours."""
        return self._stream

    @property
    def wire_grads(self) -> tuple[bool, ...] | None:
        """Which tensors of the carry sent on carry a gradient back (None: the floating
        ones): with a handoff, only the first handed layer's input does."""
        return None if not self.handoff_out else (True,) + (False,) * self.handoff_out

    def set_memory_actions(self, actions: Sequence[str]) -> None:
        stage_memory.set_memory_actions(
            self.layers, actions, self.device, holds_loss=self.index == self.n_stages - 1
        )

    def load_matching(self, states: dict[str, dict[str, torch.Tensor]]) -> dict[str, list[str]]:
        """Load, tensor by tensor, each layer's state from `states[key]` where a tensor's
        name and shape match; the layer's other tensors keep their fresh values. Returns
        {key: the names loaded} of the layers that took at least one tensor."""
        loaded: dict[str, list[str]] = {}
        for layer in self.layers:
            state, own = states.get(layer.key), layer.module.state_dict()
            if state is None:
                continue
            taken = [k for k, v in own.items() if k in state and state[k].shape == v.shape]
            if taken:
                layer.module.load_state_dict({**own, **{k: state[k] for k in taken}})
                loaded[layer.key] = taken
        return loaded

    def seed_meters(self, costs: Sequence[LayerCost]) -> None:
        """Start each layer's meter from profiled costs (the first steps refine them)."""
        stage_costs.seed_meters(self.layers, costs)

    def param_bytes(self) -> int:
        return sum(nbytes(p) for p in self.parameters())

    def measured_cost(self, index: int) -> LayerCost:
        """Layer `index`'s costs as measured here: smoothed times, bytes, state bytes."""
        return stage_costs.measured_cost(self.layers[index], self.optimizer)

    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state of this stage (what the planner counts),
        with 2BW's second weight version or PipeMare's T2 buffers, and Bi-Partition's
        replicas of the previous stage's handed layers (parameters and gradients)."""
        return stage_costs.state_bytes(self.layers, self.optimizer, self.versions, self.handed_in)

    def parameters(self) -> Iterator[torch.Tensor]:
        for layer in self.layers:
            yield from layer.module.parameters()

    # -- one step, one micro-batch at a time (the executor decides the order) -----------------
    def enable_versions(self, updates: int) -> WeightVersions:
        """Two weight versions from now on (2BW), W(updates - 1) = W(updates) if new."""
        if not isinstance(self.versions, WeightVersions):
            self.versions = WeightVersions(updates)
            for layer in self.layers:
                self.versions.attach(layer.key, layer.module)
        return self.versions

    def enable_pipemare(
        self, config: PipeMareConfig, updates: int, n_microbatches: int
    ) -> AsyncWeights:
        """PipeMare's one weight copy, updated every `config.update_every` backwards."""
        if not isinstance(self.versions, AsyncWeights):
            lag = delay(self.n_stages, self.index, config.update_every)
            self.versions = AsyncWeights(config, lag, n_microbatches, updates)
            for layer in self.layers:
                self.versions.attach(layer.key, layer.module)
        self.versions.m = n_microbatches
        return self.versions

    def use_step(self, step: int) -> None:  # streams: steps interleave
        self._step = step

    def begin_step(
        self,
        step: int,
        n_microbatches: int,
        measure_memory: bool,
        keep_spans: bool = False,
        stream: bool = False,
    ) -> None:
        """Reset this step's sums; with `measure_memory`, count saved activations. In a
        `stream` the steps interleave: the count goes on (`measure_stream` started it)."""
        self._step, self._n_microbatches, self._stream = step, n_microbatches, stream
        self.times = StepTimes()
        # a stream's steps interleave: keep what started since the step just closed began
        self.spans = [s for s in self.spans if s.start_s >= self._start] if keep_spans else []
        self._start = self.now()
        for layer in self.layers:
            layer.forward_s = layer.backward_s = 0.0
            layer.forward_n = layer.backward_n = layer.activation_bytes = layer.output_bytes = 0
        self.memory.begin_step(measure_memory, stream, self._weight_tensors())

    def measure_stream(self, window: int) -> None:
        """From now on, count the saved activations of micro-batches numbered below `window`
        (a segment's first steps, which reach its in-flight peak); each stream step then
        reports the peak so far. Per-layer meters keep their values in streams (a step's
        micro-batches interleave with the next step's, so per-step sums mean nothing)."""
        self.memory.measure_stream(window, self._weight_tensors())

    def end_step(self) -> StepTimes:
        """Close a step that succeeded: its times, and each layer's meter updated."""
        times = self.times
        times.total_s = self.now() - self._start
        self.memory.end_step(times)
        sums = self.memory.measuring and not self.streaming  # the step's bytes are whole
        stage_costs.update_meters(self.layers, self.n_microbatches, self.handoff_out, sums)
        return times

    def abort_step(self) -> None:
        """Forget a failed step: accumulated gradients and activation counts are dropped."""
        for p in self.parameters():
            p.grad = None
        if self.versions is not None:
            self.versions.zero_grads()
        if self.handed_in is not None:
            self.handed_in.zero_grads()
        self.memory.forget()

    def span(self, name: str, start: float, category: str = "compute") -> float:
        """Record a box on this stage's timeline row; returns its length in seconds."""
        end = self.now()
        self.spans.append(Span(self.index, name, start, end, category))
        return end - start

    def input_carry(self, carry: Carry, i: int) -> Carry:
        """Micro-batch i's carry from outside (batch or neighbour), on this stage's device."""
        try:
            carry = tuple(t.to(self.device, non_blocking=True) for t in carry)
        except Exception as error:
            raise ComputeError("forward", None, i, error) from error
        return leaf(carry) if self.index > 0 else carry

    def _weight_tensors(self) -> list[torch.Tensor]:
        """Parameters and every weight version (2BW): what saved activations exclude."""
        extra = self.versions.tensors() if self.versions is not None else []
        return [*self.parameters(), *extra]

    def call_layer(self, layer: StageLayer, i: int, carry: Carry) -> Carry:
        """Layer `layer`'s forward of micro-batch i, seeded as every run of it is (a
        recompute gives the same result), with the step's weight version."""
        # a stream numbers micro-batches across its steps: i % M is the index in the step
        seed_rng(
            dropout_seed(self.seed, self._step, i % self._n_microbatches, layer.key), self.device
        )
        try:
            if self.versions is None:
                out = layer.module(unwrap(carry))
            else:  # 2BW: micro-batches of step t run with W(t - 1)
                weights = self.versions.weights(layer.key, self._step - 1)
                out = torch.func.functional_call(layer.module, weights, (unwrap(carry),))
            return as_carry(out, f"the output of layer {layer.key!r}")
        except Exception as error:
            shapes = [tuple(t.shape) for t in carry]
            error.add_note(
                f"in the forward of layer {layer.key!r} on stage {self.index}, "
                f"input shapes {shapes}"
            )
            raise ComputeError("forward", layer.key, i, error) from error

    def forward(self, i: int, carry: Carry, target: Any) -> InFlight:
        """Micro-batch i through this stage's layers (and the loss on the last stage)."""
        start = self.now()
        if isinstance(self.versions, AsyncWeights):
            self.versions.note_forward(i)
        state = fused.forward(self, i, carry) if self.fuses else self._layer_by_layer(i, carry)
        self.times.forwards += 1
        self.times.fused_forwards += state.fused
        if self.index == self.n_stages - 1:
            t0 = self.now()
            try:
                state.loss = scalar_loss(self.loss_fn, unwrap(state.outputs[-1]), target)
            except Exception as error:
                raise ComputeError("loss", None, i, error) from error
            if not state.fused:  # the loss runs wherever the last layer does: its cost
                self.layers[-1].forward_s += self.now() - t0
        self.times.forward_s += self.span(f"F{i}", start, "forward")
        return state

    def _layer_by_layer(self, i: int, carry: Carry) -> InFlight:
        """The forward of a step that measures: each layer on a detached leaf, timed."""
        state = InFlight()
        if self.handed_in is not None:  # the handed layers' inputs ride ahead of the carry
            k = len(self.handed_in)
            state.handed, carry = tuple(t.detach() for t in carry[:k]), leaf(carry[k:])
            # kept until the backward, counted in no layer's meter
            if self.memory.counts(i):
                self.saved.hold(i, state.handed)
        own = len(self.layers) - self.handoff_out
        wire: list[torch.Tensor] = []
        for position, layer in enumerate(self.layers):
            if position >= own:  # handed: no graph here, its input travels with the carry
                wire.extend(_one_tensor(carry, layer.key, "input", i))
                with torch.no_grad():
                    carry = self._timed_call(layer, i, carry, [0])
                _one_tensor(carry, layer.key, "output", i)
                continue
            if position > 0:
                carry = leaf(carry)
            added = [self.saved.hold(i, carry) if self.memory.counts(i) else 0]
            with self.memory.mode(layer.action, i, added):
                out = self._timed_call(layer, i, carry, added)
            state.inputs.append(carry)
            state.outputs.append(out)
            carry = out
        if self.handoff_out:
            state.wire = (*wire, *carry)
        return state

    def _timed_call(self, layer: StageLayer, i: int, carry: Carry, added: list[int]) -> Carry:
        t0 = self.now()
        out = self.call_layer(layer, i, carry)
        layer.forward_s += self.now() - t0
        layer.forward_n += 1
        layer.activation_bytes += added[0]
        layer.output_bytes += sum(nbytes(t) for t in out)
        return out

    def backward(
        self, state: InFlight, i: int, grads: Sequence[torch.Tensor], *, split: bool = False
    ) -> list[torch.Tensor]:
        """Back-propagate micro-batch i given its outputs' gradients; its inputs' gradients.

        split=True leaves the weight gradients of the layers that can be split for
        `backward_weight` (the graph stays in `state` until then).
        """
        return stage_backward.backward(self, state, i, grads, split)

    def backward_weight(self, state: InFlight, i: int) -> None:
        """The weight gradients `backward(split=True)` left for micro-batch i; frees its graph."""
        stage_backward.backward_weight(self, state, i)

    def optimizer_step(self) -> None:
        t0, optimizer = self.now(), self.optimizer
        try:
            if isinstance(self.versions, AsyncWeights):  # PipeMare updated in its backwards
                pass
            elif self.versions is not None:  # 2BW: update u, with the gradients at W(u - 1)
                self.versions.apply_update(optimizer.step if optimizer else lambda: None)
            elif optimizer is not None:
                optimizer.step()
        except Exception as error:
            raise ComputeError("optimizer", None, None, error) from error
        finally:
            if optimizer is not None:
                optimizer.zero_grad(set_to_none=True)
        self.times.optimizer_s += self.span("optimizer step", t0, "optimizer")

    @torch.no_grad()
    def infer(self, i: int, carry: Carry) -> Carry:
        """Micro-batch i through this stage's layers without a graph (call in `evaluating`)."""
        for layer in self.layers:
            carry = self.call_layer(layer, i, carry)
        return carry

    @contextlib.contextmanager
    def evaluating(self, step: int) -> Iterator[None]:
        """Eval mode for inference; each layer's train/eval mode is restored after."""
        self._step = step
        modes = [layer.module.training for layer in self.layers]
        for layer in self.layers:
            layer.module.eval()
        try:
            yield
        finally:
            for layer, mode in zip(self.layers, modes, strict=True):
                layer.module.train(mode)

    def close(self) -> None:
        self.layers, self.optimizer, self.versions = [], None, None
        self.handoff_out, self.handed_in = 0, None
