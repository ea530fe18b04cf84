"""Layers whose backward another stage can run, exactly: what Bi-Partition's cut needs.

Bi-Partition (docs/algorithms.md) cuts the forward and the backward at different places: the
last k layers of stage s run their forward on s and their backward on s + 1, which moves
about two thirds of their cost (B ~ 2F) across the boundary instead of all of it, so the
stages even out where whole layers cannot. An autograd graph cannot cross processes, and
recomputing the layer on s + 1 to get one would be dominated by simply moving the layer
(s + 1 would pay F + B, exactly what the move costs, while s would save less). What is left,
and what this module provides, are layers whose backward is a closed formula of tensors that
can be shipped: the layer's input x (sent with the activations), its parameters (a replica
on s + 1, refreshed at every step) and the gradient of its output g (which s + 1 computes
anyway). `nn.Linear` is one, with the products autograd's addmm backward computes:

    grad_x = g W        grad_W = g^T x        grad_b = sum of g over the leading dims

and so are the parameterless activations `nn.GELU`, `nn.ReLU`, `nn.SiLU` and `nn.Tanh`
(autograd's own backward kernels, fed the input), so a cut can hand on a Linear with its
activation.

A user makes another layer type eligible with `separable(MyLayer)(backward_fn)`, where
`backward_fn(module, x, g)` returns (grad_x, {parameter name: gradient}) for one tensor in
and one tensor out, or (grad_x, a zero-argument function returning that dict): a split
schedule (ZB-H1) then computes the weight gradients in its W action, off the critical
path, as the built-in Linear does. `tests/pipeline/local/test_separable.py` holds every
registered type to autograd's gradients (the contract every registration must pass).

`HandedLayers` is the receiving stage's side: replicas of the previous stage's last k
layers, their backward run in reverse order, and their summed gradients, which go back to
the owner before its optimizer step (`pipeline.distributed.handoff` has the protocol).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch
from torch import nn

from pipeline.local.spec import LayerSpec, build_layer

__all__ = ["HandedLayers", "SeparableBackward", "is_separable", "separable", "separable_types"]

Grads = dict[str, torch.Tensor]
SeparableBackward = Callable[
    [nn.Module, torch.Tensor, torch.Tensor], tuple[torch.Tensor, Grads | Callable[[], Grads]]
]
_REGISTRY: dict[type[nn.Module], SeparableBackward] = {}


def separable(cls: type[nn.Module]) -> Callable[[SeparableBackward], SeparableBackward]:
    """Register `fn(module, x, grad_out) -> (grad_x, {param name: grad})` for `cls`."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise TypeError(f"separable() takes an nn.Module subclass, got {cls!r}")

    def register(fn: SeparableBackward) -> SeparableBackward:
        if not callable(fn):
            raise TypeError(f"a separable backward must be callable, got {fn!r}")
        _REGISTRY[cls] = fn
        return fn

    return register


def _backward_fn(module: nn.Module) -> SeparableBackward | None:
    return _REGISTRY.get(type(module))  # exact type: a subclass may change the forward


def separable_types() -> tuple[type[nn.Module], ...]:
    """Every layer type registered so far (what the contract test holds to autograd)."""
    return tuple(_REGISTRY)


def is_separable(module: nn.Module) -> bool:
    """Whether another stage can run this layer's backward (a registered exact type)."""
    return _backward_fn(module) is not None


@separable(nn.Linear)
def _linear_backward(
    module: nn.Module, x: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, Callable[[], Grads]]:
    assert isinstance(module, nn.Linear)
    g2 = grad.reshape(-1, grad.shape[-1])
    bias = module.bias is not None

    def weight_grads() -> Grads:
        grads = {"weight": g2.t().mm(x.reshape(-1, x.shape[-1]))}
        if bias:
            grads["bias"] = g2.sum(0)
        return grads

    return grad.matmul(module.weight), weight_grads


# Activations without parameters: autograd's own backward kernels, from the input
_ACTIVATIONS: dict[
    type[nn.Module], Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
] = {
    nn.GELU: lambda m, x, g: torch.ops.aten.gelu_backward(g, x, approximate=m.approximate),
    nn.ReLU: lambda m, x, g: torch.ops.aten.threshold_backward(g, x, 0),
    nn.SiLU: lambda m, x, g: torch.ops.aten.silu_backward(g, x),
    nn.Tanh: lambda m, x, g: torch.ops.aten.tanh_backward(g, torch.tanh(x)),
}


def _activation_backward(
    module: nn.Module, x: torch.Tensor, grad: torch.Tensor
) -> tuple[torch.Tensor, Grads]:
    return _ACTIVATIONS[type(module)](module, x, grad), {}


for _cls in _ACTIVATIONS:
    separable(_cls)(_activation_backward)


class HandedLayers:
    """Replicas of the previous stage's last k layers, whose backward runs on this stage."""

    def __init__(self, specs: Sequence[LayerSpec], seed: int, device: torch.device) -> None:
        self.keys = [spec.key for spec in specs]
        self.modules = [build_layer(spec, seed, device) for spec in specs]
        for key, module in zip(self.keys, self.modules, strict=True):
            if not is_separable(module):
                raise ValueError(
                    f"layer {key!r} ({type(module).__name__}) cannot have its backward run on "
                    "the next stage: Bi-Partition needs a separable layer (nn.Linear, or a "
                    "type registered with pipeline.separable)"
                )
        self._grads: list[dict[str, torch.Tensor]] = [{} for _ in self.modules]

    def __len__(self) -> int:
        return len(self.modules)

    def parameters(self) -> list[torch.Tensor]:
        """In a fixed order the owner shares: layer by layer, `named_parameters` order."""
        return [p for m in self.modules for p in m.parameters()]

    def backward(
        self, inputs: Sequence[torch.Tensor], grad: torch.Tensor, defer: bool = False
    ) -> tuple[torch.Tensor, list[Callable[[], None]]]:
        """The handed layers' backward, last first: the gradient of the first handed
        layer's input, and (with `defer`) what still accumulates their weight gradients,
        for a split schedule's W; without `defer` they are accumulated now."""
        later: list[Callable[[], None]] = []
        with torch.no_grad():
            for j in reversed(range(len(self.modules))):
                module = self.modules[j]
                fn = _backward_fn(module)
                assert fn is not None, "checked when the replicas were built"
                grad, grads = fn(module, inputs[j], grad)
                if defer and callable(grads):
                    later.append(functools.partial(self._accumulate, j, grads))
                else:
                    self._accumulate(j, grads)
        return grad, later

    def _accumulate(self, j: int, grads: Grads | Callable[[], Grads]) -> None:
        with torch.no_grad():
            acc = self._grads[j]
            for name, g in (grads() if callable(grads) else grads).items():
                acc[name] = acc[name] + g if name in acc else g.clone()

    def gradients(self) -> list[torch.Tensor]:
        """This step's summed gradients in `parameters()` order (zeros where none arrived)."""
        out = []
        for module, acc in zip(self.modules, self._grads, strict=True):
            for name, p in module.named_parameters():
                out.append(acc.get(name, torch.zeros_like(p)))
        return out

    def zero_grads(self) -> None:
        self._grads = [{} for _ in self.modules]
