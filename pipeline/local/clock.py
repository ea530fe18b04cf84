"""Time readings that are true on a GPU: what the planner and `stats()` are told a layer costs.

CUDA kernels run asynchronously. `time.perf_counter()` around a layer's forward on a GPU
measures how long the host took to *launch* its kernels, which can be a small fraction of
the time the GPU spends running them; a planner fed such figures balances launch overhead,
not compute. `clock(device)` returns the function every measured boundary of a stage reads:

* CPU: `time.perf_counter`, as it is (the work is done when the call returns);
* CUDA: the time after the device's *current* stream has finished what was queued on it
  (a synchronise at each measured boundary), so an interval between two readings is the
  kernels' time. Only the current stream, never the whole device: a NCCL receive in
  flight on its own stream may be waiting for this rank's next send, and waiting for it
  here would deadlock. A receive the stage has waited for (`Work.wait` makes the current
  stream wait on it) is included, so a wait's reading after it is the transfer's time.

The synchronise costs the overlap of the host's launches with the GPU's work at those
boundaries (a layer, a wait, an optimizer step); it is the price of figures that mean
what they say on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

__all__ = ["clock"]


def clock(device: torch.device) -> Callable[[], float]:
    """A reading of seconds that, on `device`, counts the work queued before it."""
    if device.type != "cuda":
        return time.perf_counter

    def after_the_stream() -> float:
        torch.cuda.current_stream(device).synchronize()
        return time.perf_counter()

    return after_the_stream
