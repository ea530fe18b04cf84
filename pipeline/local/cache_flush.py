"""Evicting the CPU caches before a timed pass, at the price the machine's caches ask.

`pipeline.local.profiler.sandbox_time` times one layer alone, but in training the other
layers of its stage run between two of its passes and evict its weights and inputs from the
caches they do not share with it. Before each timed pass a flush writes a buffer larger than
those caches. How large is the machine's business:

    cache levels (Linux: /sys/devices/system/cpu/cpu0/cache)     flush writes
    L1 48 KB, L2 2 MB, L3 32 MB                                   64 MB (2 x L3)
    L1 48 KB, L2 2 MB, L3 300 MB (a server's shared L3)            4 MB (2 x L2)
    not listed (another OS)                                       64 MB

Twice the largest cache that twice fits in `MAX_FLUSH_BYTES`: a larger cache (a server's
L3 of hundreds of MB) cannot be evicted at any reasonable price, and it holds a small
stage's layers between their passes in training too; writing 64 MB there only cost the
profile time (each layer is timed after 8 flushes: a new candidate's sizing spent most of
its seconds in them).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["MAX_FLUSH_BYTES", "cache_flusher", "flush_bytes"]

MAX_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of common desktop CPUs
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def flush_bytes(caches: Path = _CACHES) -> int:
    """Bytes a flush writes: twice the largest data cache of `caches` (sysfs's layout)
    whose double fits in `MAX_FLUSH_BYTES`; `MAX_FLUSH_BYTES` when none is listed."""
    sizes = [size for size in _cache_sizes(caches) if 2 * size <= MAX_FLUSH_BYTES]
    return 2 * max(sizes) if sizes else MAX_FLUSH_BYTES


def cache_flusher(device: torch.device, n_bytes: int | None = None) -> Callable[[], None]:
    """A function that evicts the CPU caches by writing `n_bytes` (default `flush_bytes()`);
    a no-op on a GPU. The buffer lives as long as the function (it costs as much to
    allocate as to write: make one per profile, not per layer)."""
    if device.type != "cpu":
        return lambda: None
    buffer = torch.zeros((n_bytes or flush_bytes()) // 4, dtype=torch.float32)

    def flush() -> None:
        buffer.add_(1.0)

    return flush


def _cache_sizes(caches: Path) -> list[int]:
    """The sizes of the data and unified caches listed under `caches` (none if unreadable)."""
    sizes = []
    for level in sorted(caches.glob("index*")):
        try:
            kind = (level / "type").read_text().strip()
            text = (level / "size").read_text().strip()
        except OSError:
            continue
        if kind in ("Data", "Unified") and text:
            number, unit = text[:-1], text[-1].upper()
            if unit in _UNITS and number.isdigit():
                sizes.append(int(number) * _UNITS[unit])
            elif text.isdigit():
                sizes.append(int(text))
    return sizes
