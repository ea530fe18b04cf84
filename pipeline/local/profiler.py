"""What each layer costs, from three sources, and a cache that outlives one model.

The planner needs, per layer: forward and backward seconds per micro-batch, the bytes it
keeps for backward per micro-batch, the bytes it hands to the next layer, and its
parameter, gradient and optimizer-state bytes (`pipeline.pure.costs.LayerCost`). They come from:

1. `estimate`: before anything runs. Each layer is built on the meta device and run on
   meta tensors of the right shapes: FLOPs from `torch.utils.flop_counter`, saved bytes
   from saved-tensor hooks, output bytes from the output shapes. Seconds = FLOPs / this
   device's measured matmul rate (backward: 2x the forward FLOPs).
2. `sandbox`: one real, timed forward and backward per *distinct* layer signature
   (a model of 24 identical blocks is timed once), on inputs of the right shapes.
   `sized` counts the bytes alone (one real forward each, nothing timed): what a memory
   budget's check needs, at a fraction of the price (the meta trace's count can differ
   from a real device's: attention saves less on the CPU than on meta).
3. measured: while training, `pipeline.local.meter.LayerMeter` (see `pipeline.local.stage_costs`).

`sandbox` times only what `pipeline.local.cost_cache.CostCache` does not hold yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from pipeline.local.cache_flush import cache_flusher
from pipeline.local.carry import Carry, as_carry, floating, leaf, nbytes, unwrap
from pipeline.local.cost_cache import CostCache
from pipeline.local.separable import is_separable
from pipeline.local.spec import LayerSpec, build_layer
from pipeline.pure.costs import LayerCost

__all__ = [
    "LayerShape",
    "estimate",
    "on_threads",
    "optimizer_state_ratio",
    "sandbox",
    "sandbox_time",
    "saved_bytes",
    "sized",
    "trace_shapes",
]


@dataclasses.dataclass(frozen=True)
class LayerShape:
    """One layer as the shape pass saw it: its signature and its sizes."""

    key: str
    signature: str
    inputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    flops: int | None  # forward FLOPs per micro-batch (None: not counted, `trace_shapes`)
    saved_bytes: int  # tensors autograd saves (parameters excluded) + the held input
    output_bytes: int
    param_bytes: int
    grad_bytes: int
    identity: str  # the signature's text but for the threads (`on_threads`)
    separable: bool = False  # Bi-Partition may hand its backward on (`pipeline.local.separable`)


def _identity(module: nn.Module, carry: Carry) -> str:
    """The layer's type, repr and input shapes."""
    shapes = [(tuple(t.shape), str(t.dtype)) for t in carry]
    return f"{type(module).__module__}.{type(module).__qualname__}|{module!r}|{shapes}"


def _signature(identity: str, threads: int) -> str:
    """A layer's identity and the intra-op threads it runs on: a layer timed on one thread
    costs differently on two (`pipeline.pure.shape` compares both)."""
    return hashlib.sha1(f"{identity}|{threads}".encode()).hexdigest()[:16]


def on_threads(shapes: Sequence[LayerShape], threads: int) -> list[LayerShape]:
    """`shapes` as `trace_shapes` would trace them on `threads` intra-op threads: the same
    sizes (they do not depend on the threads), each signed for them."""
    return [dataclasses.replace(s, signature=_signature(s.identity, threads)) for s in shapes]


Shapes = Sequence[tuple[tuple[int, ...], torch.dtype]]


def _example(shapes: Shapes, device: torch.device) -> Carry:
    """Inputs of the right shapes: normal floats, zeros for integers (valid indices)."""
    return tuple(
        torch.randn(shape, device=device, dtype=dtype)
        if dtype.is_floating_point
        else torch.zeros(shape, device=device, dtype=dtype)
        for shape, dtype in shapes
    )


@contextlib.contextmanager
def _count_saved(params: Sequence[torch.Tensor], held: Carry, into: list[int]) -> Iterator[None]:
    """Add the bytes of every storage autograd saves, other than parameters and `held`.

    A storage is known by its Python object: torch keeps one per storage (views share it),
    which works for meta tensors too, whose data pointers are all 0. `seen` holds the
    objects, so no id is reused while counting.
    """
    seen = {id(s): s for s in (t.untyped_storage() for t in (*params, *held))}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if id(storage) not in seen:
            seen[id(storage)] = storage
            into[0] += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def _build_meta(spec: LayerSpec) -> nn.Module:
    try:
        with torch.device("meta"):
            module = spec.factory()
    except Exception:  # a factory that insists on real tensors: build it on the CPU
        module = build_layer(spec, 0, torch.device("cpu"))
    if not isinstance(module, nn.Module):
        raise TypeError(
            f"the factory of layer {spec.key!r} returned a {type(module).__name__}; "
            "it must return a torch.nn.Module"
        )
    return module.to("meta")


def trace_shapes(
    specs: Sequence[LayerSpec], example: Any, *, count_flops: bool = True
) -> list[LayerShape]:
    """Run one micro-batch of `example` shapes through all layers on the meta device.

    `count_flops`: count each layer's FLOPs (only `estimate` reads them; counting runs
    every op through a Python dispatch mode, about half the trace's time)."""
    carry = tuple(t.to("meta") for t in as_carry(example, "the example input"))
    shapes = []
    for position, spec in enumerate(specs):
        module = _build_meta(spec)
        params = list(module.parameters())
        if position > 0:
            carry = leaf(carry)
        saved = [sum(nbytes(t) for t in carry)]
        counter = FlopCounterMode(display=False) if count_flops else None
        with counter or contextlib.nullcontext(), _count_saved(params, carry, saved):
            out = as_carry(module(unwrap(carry)), spec.key)
        identity = _identity(module, carry)
        shapes.append(
            LayerShape(
                key=spec.key,
                signature=_signature(identity, torch.get_num_threads()),
                inputs=tuple((tuple(t.shape), t.dtype) for t in carry),
                flops=None if counter is None else int(counter.get_total_flops()),
                saved_bytes=saved[0],
                output_bytes=sum(nbytes(t) for t in out),
                param_bytes=sum(nbytes(p) for p in params),
                grad_bytes=sum(nbytes(p) for p in params if p.requires_grad),
                separable=is_separable(module) and len(carry) == 1 and len(out) == 1,
                identity=identity,
            )
        )
        carry = out
    return shapes


_RATES: dict[str, float] = {}


def matmul_rate(device: torch.device) -> float:
    """FLOP/s of a mid-sized float32 matmul on `device` (measured once per process)."""
    if str(device) not in _RATES:
        a = torch.randn(256, 256, device=device)
        torch.mm(a, a)
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            torch.mm(a, a)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            runs.append(time.perf_counter() - t0)
        _RATES[str(device)] = 2 * 256**3 / max(statistics.median(runs), 1e-9)
    return _RATES[str(device)]


def optimizer_state_ratio(
    factory: Callable[[list[dict[str, Any]]], torch.optim.Optimizer],
) -> float:
    """Optimizer-state bytes per parameter byte, found by one step on a probe parameter.

    Also the check that `factory` builds an optimizer from parameter groups.
    """
    probe = nn.Parameter(torch.zeros(64))
    optimizer = factory([{"params": [probe]}])
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"the optimizer factory returned a {type(optimizer).__name__}; it must return a "
            "torch.optim.Optimizer built from the parameter groups it is given, e.g. "
            "functools.partial(torch.optim.AdamW, lr=1e-3)"
        )
    probe.grad = torch.zeros_like(probe)
    optimizer.step()
    state = sum(
        nbytes(v)
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.numel() == probe.numel()
    )
    return state / nbytes(probe)


def _cost(shape: LayerShape, forward_s: float, backward_s: float, opt_ratio: float) -> LayerCost:
    return LayerCost(
        key=shape.key,
        forward_s=forward_s,
        backward_s=backward_s,
        activation_bytes=shape.saved_bytes,
        output_bytes=shape.output_bytes,
        param_bytes=shape.param_bytes,
        grad_bytes=shape.grad_bytes,
        optimizer_bytes=int(shape.param_bytes * opt_ratio),
        separable=shape.separable,
        input_bytes=sum(math.prod(dims) * dtype.itemsize for dims, dtype in shape.inputs),
    )


def estimate(
    shapes: Sequence[LayerShape], device: torch.device, opt_ratio: float
) -> list[LayerCost]:
    """Costs from FLOPs and shapes alone (no layer runs for real)."""
    uncounted = [s.key for s in shapes if s.flops is None]
    if uncounted:
        raise ValueError(f"layers traced without their FLOPs cannot be estimated: {uncounted}")
    rate = matmul_rate(device)
    return [
        _cost(s, f / rate, 2 * f / rate, opt_ratio) for s in shapes if (f := s.flops) is not None
    ]


def sandbox_time(
    spec: LayerSpec,
    shape: LayerShape,
    device: torch.device,
    repeats: int = 4,
    flush: Callable[[], None] | None = None,
) -> tuple[float, float, int]:
    """(forward s, backward s, saved bytes) of one real layer, medians of `repeats` runs.

    After a warm-up, it runs `repeats` forwards and then their backwards, as a pipeline
    stage does. Before each timed pass the CPU caches are flushed (`pipeline.local.
    cache_flush`): in training the other layers of the stage run in between and evict this
    one's weights (the warm-up's passes are not timed, so they skip the flush).
    `flush`: a `cache_flusher` to reuse (its buffer costs as much to allocate as to write).
    """
    module = build_layer(spec, 0, device)
    params = list(module.parameters())
    saved = [0]
    flush = flush or cache_flusher(device)

    def forward(count: bool, timed: bool = True) -> tuple[float, list[torch.Tensor]]:
        carry = _example(shape.inputs, device)
        carry = tuple(t.requires_grad_(t.is_floating_point()) for t in carry)
        if timed:
            flush()
        t0 = time.perf_counter()
        with _count_saved(params, carry, saved) if count else contextlib.nullcontext():
            out = floating(as_carry(module(unwrap(carry)), spec.key))
        _sync(device)
        return time.perf_counter() - t0, [o for o in out if o.requires_grad]

    def backward(outs: list[torch.Tensor], timed: bool = True) -> float:
        if timed:
            flush()
        t0 = time.perf_counter()
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
        _sync(device)
        return time.perf_counter() - t0

    for _ in range(repeats):  # warm-up, in the timed pattern: kernels, allocator, pages
        backward(forward(False, timed=False)[1], timed=False)
    for outs in [forward(False, timed=False)[1] for _ in range(repeats)]:
        backward(outs, timed=False)
    saved[0] = sum(nbytes(t) for t in _example(shape.inputs, device))  # the held input
    runs = [forward(count=i == 0) for i in range(repeats)]
    backwards = [backward(outs) for _, outs in runs]
    return statistics.median(t for t, _ in runs), statistics.median(backwards), saved[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def sandbox(
    specs: Sequence[LayerSpec],
    shapes: Sequence[LayerShape],
    device: torch.device,
    opt_ratio: float,
    cache: CostCache,
    mine: Callable[[int], bool] = lambda index: True,
) -> list[LayerCost]:
    """Costs from a timed run per distinct signature not yet in `cache` (and `mine`)."""
    firsts: dict[str, int] = {}
    for position, shape in enumerate(shapes):
        firsts.setdefault(shape.signature, position)
    flush = None  # one buffer for every layer timed here
    for index, (signature, position) in enumerate(firsts.items()):
        if signature not in cache and mine(index):
            flush = flush or cache_flusher(device)
            timed = sandbox_time(specs[position], shapes[position], device, flush=flush)
            cache.put(signature, *timed)
    # a signature another rank timed is not here: the caller merges caches
    return [_cached(shape, cache.get(shape.signature), opt_ratio) for shape in shapes]


def _cached(shape: LayerShape, entry: Mapping[str, float] | None, opt_ratio: float) -> LayerCost:
    """`shape`'s cost from its cache entry (seconds and the bytes a real run saved); 0
    seconds and the traced bytes without one."""
    if entry is None:
        return _cost(shape, 0.0, 0.0, opt_ratio)
    cost = _cost(shape, entry["forward_s"], entry["backward_s"], opt_ratio)
    return dataclasses.replace(cost, activation_bytes=int(entry["activation_bytes"]))


def saved_bytes(spec: LayerSpec, shape: LayerShape, device: torch.device) -> int:
    """What one real forward of the layer keeps for its backward, its held input included,
    as `sandbox_time` counts it, without timing anything."""
    module = build_layer(spec, 0, device)
    carry = tuple(t.requires_grad_(t.is_floating_point()) for t in _example(shape.inputs, device))
    saved = [sum(nbytes(t) for t in carry)]
    with _count_saved(list(module.parameters()), carry, saved):
        module(unwrap(carry))
    return saved[0]


def sized(
    specs: Sequence[LayerSpec],
    shapes: Sequence[LayerShape],
    device: torch.device,
    opt_ratio: float,
    cache: CostCache,
) -> list[LayerCost]:
    """Costs whose bytes are a real run's, timed by nothing: the cache's entry where it has
    one (its seconds too), else one counted forward per distinct signature (`saved_bytes`)
    and 0 seconds. A memory budget's check before anything is timed (`pipeline.pure.shape`)."""
    counted: dict[str, Mapping[str, float]] = {}
    for position, shape in enumerate(shapes):
        if cache.get(shape.signature) is None and shape.signature not in counted:
            bytes_saved = saved_bytes(specs[position], shape, device)
            counted[shape.signature] = {
                "forward_s": 0.0,
                "backward_s": 0.0,
                "activation_bytes": bytes_saved,
            }
    return [_cached(s, cache.get(s.signature) or counted[s.signature], opt_ratio) for s in shapes]
