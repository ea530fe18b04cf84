"""What a layer and a link cost: the numbers every planner and the simulator work from.

A profile (`pipeline.local.profiler`) turns each layer into a `LayerCost`; the planners
(`pipeline.pure.planner`) partition a list of them, and the simulator (`pipeline.pure.simulate`)
replays a schedule on the per-stage sums. Keeping the data model here, apart from torch,
lets all of that run and be tested without a process or a tensor.

Units: seconds per micro-batch, bytes per micro-batch for activations, bytes for state.

Memory actions, per layer (the runtime's `pipeline.local.stage_memory` implements them)::

    keep       saved activations stay on the device until the backward: activation_bytes
    recompute  the forward keeps only its input; re-run before the backward: +recompute_s
    swap       saved activations go to host memory and come back: +2 host transfers

A layer's input is the previous layer's output, so a recomputed (or swapped) layer keeps
`kept_bytes(costs, i)` = min(activation_bytes, previous output_bytes) per micro-batch. The
first layer's input is the micro-batch itself, `input_bytes` where the profile recorded it
(the stage holds it for the backward as it holds any layer's input; unrecorded: 0).
The last layer feeds the loss in the forward: it keeps everything whatever its action.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import Any

__all__ = [
    "FORMAT_VERSION",
    "MEMORY_ACTIONS",
    "LayerCost",
    "LinkCost",
    "action_effects",
    "costs_from_dict",
    "costs_to_dict",
    "from_json",
    "kept_bytes",
    "to_json",
]

FORMAT_VERSION = 1
MEMORY_ACTIONS = ("keep", "recompute", "swap")

_SECONDS = ("forward_s", "backward_s")
_BYTES = ("activation_bytes", "output_bytes", "param_bytes", "grad_bytes", "optimizer_bytes")
_OPTIONAL_BYTES = ("isolated_peak_bytes", "added_peak_bytes", "input_bytes")


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return float(value)


def _bytes(name: str, value: Any) -> int:
    """Bytes as an int; measured averages (floats) are rounded to the nearest byte."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of bytes, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return int(value) if isinstance(value, Integral) else round(float(value))


@dataclass(frozen=True)
class LayerCost:
    """One layer's profile: times per micro-batch, bytes per micro-batch, state bytes.

    activation_bytes  kept for backward per micro-batch (saved tensors + the held input)
    output_bytes      handed to the next layer per micro-batch (the stage boundary if last)
    input_bytes       what it receives per micro-batch (None: not recorded); a first layer
                      that recomputes keeps it (`kept_bytes`)
    param/grad/optimizer_bytes  the layer's state, whatever the micro-batch count
    recompute_s       time a recompute adds; None means forward_s (see `recompute_time`)
    separable         the next stage can run its backward (`pipeline.pure.bipartition`)

    CAPSlog peaks (`pipeline.pure.planner.memory`), None = derived from the numbers above:
    added_peak_bytes     what the layer adds to a stage's peak: activation + state bytes
    isolated_peak_bytes  the peak of a stage holding it alone: added peak + output_bytes
    """

    key: str
    forward_s: float
    backward_s: float
    activation_bytes: int = 0
    output_bytes: int = 0
    param_bytes: int = 0
    grad_bytes: int = 0
    optimizer_bytes: int = 0
    recompute_s: float | None = None
    isolated_peak_bytes: int | None = None
    added_peak_bytes: int | None = None
    separable: bool = False
    input_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"a layer key must be a non-empty string, got {self.key!r}")
        for name in _SECONDS:
            object.__setattr__(self, name, _seconds(f"{self.key}: {name}", getattr(self, name)))
        for name in _BYTES:
            object.__setattr__(self, name, _bytes(f"{self.key}: {name}", getattr(self, name)))
        if self.recompute_s is not None:
            value = _seconds(f"{self.key}: recompute_s", self.recompute_s)
            object.__setattr__(self, "recompute_s", value)
        for name in _OPTIONAL_BYTES:
            if getattr(self, name) is not None:
                value = _bytes(f"{self.key}: {name}", getattr(self, name))
                object.__setattr__(self, name, value)

    @property
    def compute_s(self) -> float:
        """Forward + backward seconds per micro-batch."""
        return self.forward_s + self.backward_s

    @property
    def state_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what a migration moves."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @property
    def recompute_time(self) -> float:
        """Seconds a recompute adds per micro-batch (the forward again, unless profiled)."""
        return self.forward_s if self.recompute_s is None else self.recompute_s

    @property
    def added_peak(self) -> int:
        if self.added_peak_bytes is not None:
            return self.added_peak_bytes
        return self.activation_bytes + self.state_bytes

    @property
    def isolated_peak(self) -> int:
        if self.isolated_peak_bytes is not None:
            return self.isolated_peak_bytes
        return self.added_peak + self.output_bytes


@dataclass(frozen=True)
class LinkCost:
    """A point-to-point link: time(n) = latency_s + n / bandwidth_bytes_per_s.

    `LinkCost.free()` (infinite bandwidth, no latency) models an ideal link.
    """

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        bw = self.bandwidth_bytes_per_s
        if isinstance(bw, bool) or not isinstance(bw, Real) or math.isnan(bw) or bw <= 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bw!r}")
        object.__setattr__(self, "latency_s", _seconds("latency_s", self.latency_s))

    @classmethod
    def free(cls) -> LinkCost:
        return cls(math.inf, 0.0)

    def time(self, nbytes: float) -> float:
        """Seconds to deliver one message of `nbytes` bytes."""
        if nbytes < 0:
            raise ValueError(f"a message cannot have {nbytes} bytes")
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


# About gloo between two processes on one host: what plans assume until a link is measured.
HOST_LINK = LinkCost(bandwidth_bytes_per_s=1e9, latency_s=1e-4)


def kept_bytes(costs: Sequence[LayerCost], index: int) -> int:
    """Bytes layer `index` keeps per micro-batch when recomputed or swapped: its input.

    The model's last layer keeps everything: the loss is computed from its output in the
    forward, so the runtime runs it as "keep" whatever the plan says
    (`pipeline.local.stage_memory`), and a plan that recomputes it would save nothing."""
    if index == len(costs) - 1:
        return costs[index].activation_bytes
    held = costs[index - 1].output_bytes if index > 0 else (costs[0].input_bytes or 0)
    return min(costs[index].activation_bytes, held)


def action_effects(
    costs: Sequence[LayerCost],
    actions: Sequence[str] | None = None,
    host_link: LinkCost | None = None,
) -> list[tuple[float, int]]:
    """(seconds added, activation bytes kept) per micro-batch for each layer's action.

    A swap moves the saved bytes (all but the input) to the host after the forward and
    back before the backward: 2 * host_link.time(saved bytes), not overlapped (a bound).
    """
    actions = ["keep"] * len(costs) if actions is None else list(actions)
    if len(actions) != len(costs):
        raise ValueError(f"{len(actions)} memory actions for {len(costs)} layers")
    effects = []
    for i, (cost, action) in enumerate(zip(costs, actions, strict=True)):
        if action == "keep":
            effects.append((0.0, cost.activation_bytes))
        elif action == "recompute":
            effects.append((cost.recompute_time, kept_bytes(costs, i)))
        elif action == "swap":
            if host_link is None:
                raise ValueError(f"layer {cost.key!r} swaps, but no host link was given")
            kept = kept_bytes(costs, i)
            effects.append((2 * host_link.time(cost.activation_bytes - kept), kept))
        else:
            raise ValueError(
                f"layer {cost.key!r}: unknown memory action {action!r}; "
                f"valid actions: {list(MEMORY_ACTIONS)}"
            )
    return effects


def costs_to_dict(costs: Sequence[LayerCost]) -> dict[str, Any]:
    """A versioned, JSON-ready dict; optional fields left unset are omitted."""
    layers = [{k: v for k, v in asdict(c).items() if v is not None} for c in costs]
    return {"version": FORMAT_VERSION, "layers": layers}


def costs_from_dict(data: dict[str, Any]) -> list[LayerCost]:
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise ValueError(f"unknown layer-cost format version {version!r} (want {FORMAT_VERSION})")
    known = {f.name for f in fields(LayerCost)}
    costs = []
    for position, layer in enumerate(data.get("layers", [])):
        unknown = set(layer) - known
        if unknown:
            raise ValueError(f"layer {position}: unknown fields {sorted(unknown)}")
        try:
            costs.append(LayerCost(**layer))
        except TypeError as e:  # a required field is missing
            raise ValueError(f"layer {position}: {e}") from None
    return costs


def to_json(costs: Sequence[LayerCost], indent: int | None = None) -> str:
    return json.dumps(costs_to_dict(costs), indent=indent)


def from_json(text: str) -> list[LayerCost]:
    return costs_from_dict(json.loads(text))
