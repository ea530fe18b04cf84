"""Measure what a stage really spends while it trains: time and saved activations per layer.

Two instruments, both cheap enough to leave on:

* `LayerMeter`: per layer, the forward and backward seconds of each micro-batch and the
  bytes it leaves behind for backward; smoothed across steps (exponential moving average)
  so the planner sees costs, not noise.
* `SavedBytes`: counts the tensors autograd saves (`torch.autograd.graph.saved_tensors_hooks`)
  and the boundary tensors the stage holds, per micro-batch, deduplicated by storage, with
  parameters excluded. The stage adds a micro-batch's storages at its forward and drops them
  after its backward, so `peak` is the real largest in-flight activation footprint of the
  step under the schedule actually executed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["LayerMeter", "SavedBytes"]

_SMOOTHING = 0.3  # weight of the newest step in the moving averages


@dataclass
class LayerMeter:
    """Smoothed per-micro-batch costs of one layer, as measured on its stage."""

    forward_s: float = 0.0
    backward_s: float = 0.0
    activation_bytes: float = 0.0  # saved for backward + held input, per micro-batch
    output_bytes: float = 0.0  # the carry it hands to the next layer, per micro-batch
    steps: int = 0
    input_bytes: int | None = None  # what it receives per micro-batch, as profiled

    def update(self, forward_s: float, backward_s: float, activation: float, output: float) -> None:
        a = 1.0 if self.steps == 0 else _SMOOTHING
        self.forward_s += a * (forward_s - self.forward_s)
        self.backward_s += a * (backward_s - self.backward_s)
        self.activation_bytes += a * (activation - self.activation_bytes)
        self.output_bytes += a * (output - self.output_bytes)
        self.steps += 1


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


@dataclass
class SavedBytes:
    """Live bytes of activations per micro-batch on one stage, and their peak in a step."""

    exclude: set[int] = field(default_factory=set)  # data_ptrs of parameters
    live: dict[tuple[int, int], int] = field(default_factory=dict)  # storage -> users
    by_microbatch: dict[int, set[tuple[int, int]]] = field(default_factory=dict)
    current: int = 0
    peak: int = 0

    def begin_step(self, params: Sequence[torch.Tensor]) -> None:
        self.exclude = {p.untyped_storage().data_ptr() for p in params}
        self.live.clear()
        self.by_microbatch.clear()
        self.current = self.peak = 0

    def hold(self, microbatch: int, tensors: Sequence[torch.Tensor]) -> int:
        """Account tensors micro-batch `microbatch` keeps; returns the bytes newly added."""
        mine = self.by_microbatch.setdefault(microbatch, set())
        added = 0
        for t in tensors:
            if t.device.type == "meta" or t.untyped_storage().data_ptr() in self.exclude:
                continue
            key = _storage_key(t)
            if key in mine:
                continue
            mine.add(key)
            users = self.live.get(key, 0)
            self.live[key] = users + 1
            if users == 0:
                added += key[1]
        self.current += added
        self.peak = max(self.peak, self.current)
        return added

    def release(self, microbatch: int) -> None:
        for key in self.by_microbatch.pop(microbatch, set()):
            users = self.live[key] - 1
            if users:
                self.live[key] = users
            else:
                del self.live[key]
                self.current -= key[1]

    @contextmanager
    def saving(self, microbatch: int, added: list[int]) -> Iterator[None]:
        """Inside: every tensor autograd saves is held by `microbatch`; bytes go to added[0]."""

        def pack(t: torch.Tensor) -> torch.Tensor:
            added[0] += self.hold(microbatch, [t])
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield
