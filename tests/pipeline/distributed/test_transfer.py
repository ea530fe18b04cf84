"""The migration wire format: any nest of tensors survives pack -> unpack bit for bit."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from pipeline.distributed.transfer import pack, unpack


def _equal(a: Any, b: Any) -> bool:
    if torch.is_tensor(a):
        return (
            torch.is_tensor(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and torch.equal(a.detach(), b)
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
    ],
)
def test_every_dtype_round_trips(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 5, 7, generator=g) * 100
    t = values.to(dtype) if dtype is not torch.bool else values > 0
    odd = t[:1, :3, :1].clone()  # 3 elements: the next tensor starts at an unaligned byte count
    obj = {"a": t, "odd": odd, "after": t.clone()}
    skeleton, data = pack(obj)
    assert _equal(obj, unpack(skeleton, data))


def test_a_nest_with_everything_round_trips() -> None:
    p = torch.nn.Parameter(torch.randn(4, 4))
    obj: dict[str, Any] = {
        "key": "block3",
        "meter": {"forward_s": 0.25, "steps": 3},
        "module": {"weight": p, "num_batches_tracked": torch.tensor(7)},
        "grads": [None, torch.randn(4, 4).t(), torch.empty(0, 3)],  # non-contiguous, empty
        "optimizer": [{"step": torch.tensor(5.0), "exp_avg": torch.randn(2, 2)}, {}],
        "shape": (1, 2),
        "group": {"lr": 1e-3, "betas": (0.9, 0.999)},
    }
    skeleton, data = pack(obj)
    assert data.dtype == torch.uint8
    assert len(skeleton) < 4096  # tensor bytes travel in `data`, not in the pickle
    back = unpack(skeleton, data)
    assert _equal({**obj, "module": {**obj["module"], "weight": p.detach().requires_grad_()}}, back)
    assert pickle.loads(skeleton)["key"] == "block3"
