"""Splitting a batch into micro-batches, the same way on every rank.

The batch input and the target may each be a tensor or a tuple of tensors; every tensor is
split into `n` equal chunks along dim 0, so micro-batch i of a tuple is the tuple of the
i-th chunks.
"""

from __future__ import annotations

from typing import Any

import torch

from pipeline.local.carry import as_carry

__all__ = ["batch_size", "split_microbatches"]


def split_microbatches(value: Any, n: int, what: str) -> list[Any]:
    """Split a tensor (or a tuple/list of tensors, element-wise) into n equal chunks on dim 0."""
    if isinstance(value, torch.Tensor):
        size = value.shape[0] if value.dim() else 0
        if size == 0 or size % n:
            raise ValueError(
                f"{what} has batch size {size}, which n_microbatches={n} does not divide; "
                f"use a batch size that is a multiple of {n}"
            )
        return list(value.chunk(n))
    if isinstance(value, tuple | list) and value:
        columns = [split_microbatches(v, n, f"{what}[{i}]") for i, v in enumerate(value)]
        return [tuple(chunks) for chunks in zip(*columns, strict=True)]
    raise TypeError(f"{what} must be a tensor or a tuple of tensors, got {type(value).__name__}")


def batch_size(x: Any) -> int:
    return int(as_carry(x, "x")[0].shape[0])
