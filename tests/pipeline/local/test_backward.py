"""Split backward equals the fused one, bit for bit, and runs no autograd node twice."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.local.backward import backward_input, fused_backward
from pipeline.local.models import MLPBlock, mlp_stack, transformer_stack
from pipeline.local.spec import LayerSpec
from pipeline.local.stage import Stage

CPU = torch.device("cpu")
_COUNTED = {
    "aten.mm",
    "aten.addmm",
    "aten.bmm",
    "aten.convolution_backward",
    "aten.embedding_dense_backward",
    "aten.native_batch_norm_backward",
}


class Counter(TorchDispatchMode):
    """Counts the expensive kernels a backward runs; a kernel that takes an output mask
    counts once per gradient it computes (a split runs it twice, each half of the mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        if name in _COUNTED:
            mask = args[-1] if name.endswith("_backward") and "embedding" not in name else [1]
            self.calls[name] = self.calls.get(name, 0) + sum(map(bool, mask))
        return func(*args, **(kwargs or {}))


class SharedTranspose(nn.Module):
    """One transposed weight used by two products: a weight-side node with two parents."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wt = self.w.t()
        return torch.tanh(x @ wt) @ wt


class TokenBias(nn.Module):
    """A carry (hidden, ids): the embedding's backward lies only on the weight side."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.proj = nn.Embedding(11, 8), nn.Linear(8, 8)

    def forward(self, carry: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        h, ids = carry
        return self.proj(h + self.emb(ids)), ids


def _seq() -> list[tuple[torch.Tensor, bool]]:
    return [(torch.randn(2, 5, 16), True)]


def _flat() -> list[tuple[torch.Tensor, bool]]:
    return [(torch.randn(4, 8), True)]


LAYERS: dict[str, tuple[Callable[[], nn.Module], Callable[[], list[tuple[torch.Tensor, bool]]]]] = {
    # name: (layer, inputs as (tensor, needs a gradient))
    "linear": (lambda: nn.Linear(8, 8), _flat),
    "linear, batch input": (lambda: nn.Linear(8, 8), lambda: [(torch.randn(4, 8), False)]),
    "mlp block, batch norm": (lambda: MLPBlock(8, 16, 0.1, True), _flat),
    "transformer": (lambda: transformer_stack(1, 16, 2)[0].factory(), _seq),
    "transformer, batch input": (
        lambda: transformer_stack(1, 16, 2)[0].factory(),
        lambda: [(torch.randn(2, 5, 16), False)],
    ),
    "conv": (
        lambda: nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.ReLU(), nn.Conv1d(4, 4, 3, 1, 1)),
        lambda: [(torch.randn(2, 4, 9), True)],
    ),
    "embedding carry": (
        TokenBias,
        lambda: [(torch.randn(4, 8), True), (torch.randint(0, 11, (4,)), False)],
    ),
    "shared transpose": (SharedTranspose, _flat),
    "layer applied twice": (lambda: nn.Sequential(*[nn.Linear(8, 8)] * 2), _flat),
    "no parameters": (nn.GELU, _flat),
}
SPLIT = {
    "linear",
    "linear, batch input",
    "mlp block, batch norm",
    "transformer",
    "transformer, batch input",
    "conv",
    "embedding carry",
    "no parameters",
}


def _run(name: str, split: bool) -> dict[str, Any]:
    make_layer, make_inputs = LAYERS[name]
    torch.manual_seed(0)
    layer = make_layer()
    torch.manual_seed(1)
    inputs = tuple(t.detach().requires_grad_(grad) for t, grad in make_inputs())
    torch.manual_seed(2)  # dropout masks
    out = layer(inputs[0] if len(inputs) == 1 else inputs)
    outputs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.is_floating_point()]
    torch.manual_seed(3)
    grads = [torch.randn_like(o) for o in outputs]
    floating = [t for t in inputs if t.is_floating_point()]
    counter = Counter()
    result: dict[str, Any] = {}
    with counter:
        if split:
            result["inputs"], work = backward_input(outputs, grads, floating)
            result["params after B"] = [p.grad for p in layer.parameters()]
            result["B calls"], result["W left"] = dict(counter.calls), bool(work)
            work.run()
            assert not work  # the graph is W's no more
        else:
            result["inputs"] = fused_backward(outputs, grads, floating)
    result["params"] = [p.grad for p in layer.parameters()]
    result["calls"] = counter.calls
    return result


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_split_equals_fused_bit_for_bit_and_runs_each_kernel_once(name: str) -> None:
    torch.set_num_threads(1)
    fused, split = _run(name, split=False), _run(name, split=True)
    for a, b in zip(fused["inputs"], split["inputs"], strict=True):
        assert torch.equal(a, b), name
    for a, b in zip(fused["params"], split["params"], strict=True):
        assert a is not None and b is not None and torch.equal(a, b), name
    assert split["calls"] == fused["calls"], name  # no product computed twice
    if name in SPLIT:  # B leaves every weight gradient to W
        assert all(g is None for g in split["params after B"]), name
        has_params = name != "no parameters"
        assert split["W left"] == has_params, name
    else:  # not splittable: the fused backward ran in B, W has nothing to do
        assert all(g is not None for g in split["params after B"]), name
        assert not split["W left"], name


def test_b_runs_only_the_input_side_products() -> None:
    split = _run("linear", split=True)
    assert split["B calls"] == {"aten.mm": 1}  # dx = dy W; dW = dy^T x is W's
    assert _run("linear, batch input", split=True)["B calls"] == {}  # stage 0: all is W's
    transformer = _run("transformer", split=True)
    assert transformer["B calls"]["aten.mm"] * 2 == transformer["calls"]["aten.mm"]


# -- a whole stage: keep and recompute layers, the loss, the first and a middle stage -----------
def _stage(index: int, n_stages: int, specs: list[LayerSpec], actions: list[str]) -> Stage:
    return Stage(
        index,
        n_stages,
        specs,
        seed=4,
        device=CPU,
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        loss_fn=F.cross_entropy,
        actions=actions,
    )


@pytest.mark.parametrize("index,n_stages", [(0, 2), (1, 3), (1, 2)])
@pytest.mark.parametrize(
    "actions", [["keep"] * 3, ["recompute", "keep", "keep"], ["keep", "recompute", "keep"]]
)
def test_a_stage_split_equals_fused(index: int, n_stages: int, actions: list[str]) -> None:
    torch.set_num_threads(1)
    specs = mlp_stack([6, 12, 12, 3], dropout=0.2)
    m = 3
    g = torch.Generator().manual_seed(5)
    xs = [(torch.randn(4, 6, generator=g),) for _ in range(m)]
    ys = [torch.randint(0, 3, (4,), generator=g) for _ in range(m)]
    out_grads = [(torch.randn(4, 3, generator=g),) for _ in range(m)]
    last = index == n_stages - 1
    results = []
    for split in (False, True):
        stage = _stage(index, n_stages, specs, actions)
        stage.begin_step(0, m, measure_memory=True)
        states = [stage.forward(i, stage.input_carry(xs[i], i), ys[i]) for i in range(m)]
        input_grads = []
        for i in range(m):  # ZB-H1's order on a last stage: F0 BI0 W0 ... here all F first
            grads = () if last else out_grads[i]
            input_grads.append(stage.backward(states[i], i, grads, split=split))
        if split:
            assert stage.saved.current > 0  # the graphs stay until W
            for i in range(m):
                stage.backward_weight(states[i], i)
                assert states[i].weight == {}
        assert stage.saved.current == 0
        times = stage.end_step()
        names = [s.name for s in stage.spans]
        assert ("W0" in names) == split and ("BI0" in names) == split
        results.append(
            (
                [[g.clone() for g in gs] for gs in input_grads],
                [p.grad.clone() for p in stage.parameters() if p.grad is not None],
                times.backward_s,
            )
        )
    (fused_in, fused_params, _), (split_in, split_params, backward_s) = results
    assert len(fused_params) == len(split_params) == 6
    for a, b in zip(fused_params, split_params, strict=True):
        assert torch.equal(a, b)
    for fused_grads, split_grads in zip(fused_in, split_in, strict=True):
        assert len(fused_grads) == len(split_grads) == (0 if index == 0 else 1)
        assert all(torch.equal(x, y) for x, y in zip(fused_grads, split_grads, strict=True))
    assert backward_s > 0
