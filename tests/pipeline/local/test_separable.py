"""Separable layers: every registered type's backward equals autograd's (the contract),
and the replicas a stage keeps accumulate exactly what autograd would."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest
import torch
from torch import nn

import pipeline
from pipeline.local.separable import HandedLayers, is_separable, separable_types
from pipeline.local.spec import LayerSpec, build_layer

CPU = torch.device("cpu")


class Scale(nn.Module):
    """A user's layer type, registered below: y = x * w (per feature)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


@pipeline.separable(Scale)
def _scale_backward(
    module: nn.Module, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    assert isinstance(module, Scale)
    return g * module.w, {"w": (g * x).reshape(-1, x.shape[-1]).sum(0)}


# one factory per registered type (or more); the test feeds inputs of several ranks
EXAMPLES: dict[type[nn.Module], list[Callable[[], nn.Module]]] = {
    nn.Linear: [functools.partial(nn.Linear, 8, 6), functools.partial(nn.Linear, 8, 6, bias=False)],
    Scale: [functools.partial(Scale, 8)],
    nn.GELU: [nn.GELU, functools.partial(nn.GELU, approximate="tanh")],
    nn.ReLU: [nn.ReLU],
    nn.SiLU: [nn.SiLU],
    nn.Tanh: [nn.Tanh],
}


def autograd_grads(module: nn.Module, xs: list[torch.Tensor], gs: list[torch.Tensor]) -> list:
    """Input gradients per call and the parameters' gradients summed over the calls."""
    module.zero_grad(set_to_none=True)
    input_grads = []
    for x, g in zip(xs, gs, strict=True):
        x = x.detach().requires_grad_(True)
        module(x).backward(g)
        assert x.grad is not None
        input_grads.append(x.grad)
    return [input_grads, [p.grad for p in module.parameters()]]


@pytest.mark.parametrize("cls", separable_types(), ids=lambda c: c.__name__)
@pytest.mark.parametrize("shape", [(5,), (3, 4)])
@pytest.mark.parametrize("defer", [False, True], ids=["fused", "weights in W"])
def test_every_separable_type_matches_autograd(
    cls: type[nn.Module], shape: tuple[int, ...], defer: bool
) -> None:
    linear: list[Callable[[], nn.Module]] | None = None
    if issubclass(cls, nn.Linear):
        linear = [functools.partial(cls, 8, 6)]
    examples = EXAMPLES.get(cls, linear)  # other tests' Linear subclasses take Linear's args
    assert examples, f"add an example of {cls.__name__} to EXAMPLES"
    g = torch.Generator().manual_seed(0)
    for factory in examples:
        spec = LayerSpec("layer", factory)
        handed = HandedLayers([spec], seed=1, device=CPU)
        module = build_layer(spec, 1, CPU)  # the same weights: built from (seed, key)
        xs = [torch.randn(*shape, 8, generator=g) for _ in range(3)]
        out = module(xs[0]).shape
        gs = [torch.randn(out, generator=g) for _ in range(3)]
        expected_inputs, expected_params = autograd_grads(module, xs, gs)
        got_inputs, deferred = [], []
        for x, grad in zip(xs, gs, strict=True):
            got, later = handed.backward([x], grad, defer=defer)
            got_inputs.append(got)
            deferred += later
        assert bool(deferred) == (defer and cls is nn.Linear)  # Linear defers its W
        for accumulate in deferred:  # a split schedule's W actions, in micro-batch order
            accumulate()
        for got, want in zip(got_inputs, expected_inputs, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for got, want in zip(handed.gradients(), expected_params, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        handed.zero_grads()
        assert all(not t.any() for t in handed.gradients())


def test_a_chain_of_handed_layers_backpropagates_in_reverse() -> None:
    specs = [
        LayerSpec("a", functools.partial(nn.Linear, 8, 6)),
        LayerSpec("b", functools.partial(Scale, 6)),
    ]
    handed = HandedLayers(specs, seed=2, device=CPU)
    a, b = (build_layer(s, 2, CPU) for s in specs)
    x = torch.randn(4, 8, requires_grad=True)
    hidden = a(x)
    grad = torch.randn(4, 6)
    b(hidden).backward(grad)
    got, _ = handed.backward([x.detach(), hidden.detach()], grad)
    torch.testing.assert_close(got, x.grad)
    expected = [p.grad for p in (*a.parameters(), *b.parameters())]
    for g_got, g_want in zip(handed.gradients(), expected, strict=True):
        torch.testing.assert_close(g_got, g_want)


def test_layers_that_are_not_separable_are_refused_by_name() -> None:
    assert is_separable(nn.Linear(2, 2)) and not is_separable(nn.Sequential(nn.Linear(2, 2)))

    class Sub(nn.Linear):  # a subclass may change the forward: not separable by inheritance
        pass

    assert not is_separable(Sub(2, 2))
    with pytest.raises(ValueError, match=r"'mlp' \(Sequential\).*pipeline.separable"):
        HandedLayers(
            [LayerSpec("mlp", functools.partial(nn.Sequential, nn.Linear(2, 2)))],
            seed=0,
            device=CPU,
        )
    with pytest.raises(TypeError, match="nn.Module subclass"):
        pipeline.separable(int)  # type: ignore[arg-type]
