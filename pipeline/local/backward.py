"""Split backward: a layer's input gradient now (B), its weight gradient later (W), exactly.

Zero-bubble schedules (`pipeline.pure.schedule.zbh1`) send the gradient of a stage's inputs
upstream as soon as it exists and compute the weight gradients when the stage would
otherwise wait. Asking autograd for the inputs' gradient and later for the parameters'
gradient would run the input-side chain twice; this module runs every node once.

The stage runs layers one at a time, each on a detached leaf input, so one layer's graph is
its own. For one layer and one micro-batch (`plan` reads the graph, Python only)::

    I          the graph's nodes on a path from an output to an input: what B must run
    split      nodes of I with an edge out of I that leads to a parameter (a Linear's addmm:
               one edge toward the input, one toward the weight); those edges: the frontier
    W roots    outputs whose node is not in I (stage 0's first layer: the batch needs no
               gradient, so its whole backward is W's)

    B  autograd.grad(outputs, inputs, grads, retain_graph=True), with a pre-hook on every
       split node that keeps the gradient arriving there. The engine runs only I, and each
       node computes only the outputs on I's paths: addmm skips its weight-gradient product.
    W  1. per split node n: autograd.grad(n's inputs <- kept gradient, inputs=n's frontier
          edges). The engine runs n alone and computes only its frontier outputs.
       2. autograd.backward(frontier edges and W roots <- their gradients): the weight-only
          rest of the graph (transposes, chunks, an embedding's backward) runs and
          accumulates into .grad, freeing the graph; dropping the layer's tensors frees the rest.

Why it is exact. A node outside I reaches no input, so it cannot reach I either: a path from
an output to a parameter leaves I at most once, through a frontier edge, or never enters it
(a W root). A parameter's gradient is therefore the sum, over frontier edges and W roots, of
what flows through them into the weight-only part of the graph, which is what W runs. Every
predecessor of a node of I is in I, so B delivers each split node its whole gradient, and
step 1 computes the frontier outputs from it exactly as a fused backward would. Step 1 runs
n alone only if n is the sole predecessor of each of its frontier targets; a layer where
that fails (a weight-side node shared by two input-side ops, e.g. one transposed weight
used by two matrix products) is not split: its fused backward runs in B and W has nothing
to do for it. So are recomputed and swapped layers (`Stage`): keeping a recomputed graph
until W would undo the recompute's saving. A custom `autograd.Function` on the split may
compute its weight output in B as well (and drop it): still exact, just not cheaper.

Memory: a split micro-batch keeps its graph (retain_graph=True) from B to W, plus the
gradient at each split node (output-sized), so it counts as in flight until W ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["WeightGrad", "backward_input", "fused_backward"]


@dataclass
class _SplitNode:
    node: Node
    frontier: list[GradientEdge]
    grads: tuple[torch.Tensor | None, ...] = ()  # arriving at the node in B (its pre-hook)


@dataclass
class WeightGrad:
    """What B leaves for W on one layer: split nodes, W roots and their gradients."""

    split: list[_SplitNode] = field(default_factory=list)
    roots: list[tuple[GradientEdge, torch.Tensor]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.split or self.roots)

    def run(self) -> None:
        """W: the parameters' gradients, accumulated into their .grad (module doc)."""
        edges, grads = [e for e, _ in self.roots], [g for _, g in self.roots]
        for split in self.split:
            slots = [
                (GradientEdge(split.node, j), g) for j, g in enumerate(split.grads) if g is not None
            ]
            if not slots:
                continue
            out = torch.autograd.grad(
                [e for e, _ in slots], split.frontier, [g for _, g in slots], allow_unused=True
            )
            for edge, grad in zip(split.frontier, out, strict=True):
                if grad is not None:
                    edges.append(edge)
                    grads.append(grad)
        self.split, self.roots = [], []
        if edges:
            torch.autograd.backward(edges, grads)


def fused_backward(
    outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Input and weight gradients at once; the inputs' gradients (zeros where none flows)."""
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [t.grad if t.grad is not None else torch.zeros_like(t) for t in inputs]


def backward_input(
    outputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], WeightGrad]:
    """B: the inputs' gradients (zeros where none flows) and what W must still do.

    `inputs` are the layer's floating inputs (leaves), `outputs` its floating outputs with
    their gradients `grads`. A layer whose graph cannot be split (module doc) runs its fused
    backward here and returns an empty `WeightGrad`.
    """
    pairs = [(o, g) for o, g in zip(outputs, grads, strict=True) if o.requires_grad]
    wanted = [t for t in inputs if t.requires_grad]
    plan = _plan(pairs, wanted) if pairs else WeightGrad()
    if plan is None:
        return fused_backward(outputs, grads, inputs), WeightGrad()
    found: Sequence[torch.Tensor | None] = [None] * len(wanted)
    if wanted and pairs:
        handles = [split.node.register_prehook(_keeper(split)) for split in plan.split]
        try:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                wanted,
                [g for _, g in pairs],
                retain_graph=bool(plan),
                allow_unused=True,
            )
        finally:
            for handle in handles:
                handle.remove()
    by_id = {id(t): g for t, g in zip(wanted, found, strict=True)}
    result = [by_id.get(id(t)) for t in inputs]
    zeros = [torch.zeros_like(t) if g is None else g for g, t in zip(result, inputs, strict=True)]
    return zeros, plan


def _keeper(split: _SplitNode) -> Any:
    def keep(grads: tuple[torch.Tensor | None, ...]) -> None:
        split.grads = tuple(grads)

    return keep


def _plan(
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> WeightGrad | None:
    """Split nodes, frontiers and W roots of the graph from the outputs (None: no split)."""
    outputs = [o for o, _ in pairs]
    input_nodes = {get_gradient_edge(t).node for t in inputs}
    roots = [get_gradient_edge(o) for o in outputs]
    order: list[Node] = []  # every node reachable from the roots, children before parents
    children: dict[Node, list[tuple[Node, int]]] = {}
    stack: list[tuple[Node, bool]] = [(e.node, False) for e in roots]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in children:
            continue
        children[node] = [(n, k) for n, k in node.next_functions if n is not None]
        stack.append((node, True))
        stack.extend((n, False) for n, _ in children[node] if n not in children)
    reaches_input: dict[Node, bool] = {}
    reaches_param: dict[Node, bool] = {}
    parents: dict[Node, set[Node]] = {}
    for node in order:
        if node in reaches_input:
            continue  # appended twice when reached twice before its children were done
        leaf = not children[node] and hasattr(node, "variable")  # AccumulateGrad
        reaches_input[node] = node in input_nodes or any(
            reaches_input[n] for n, _ in children[node]
        )
        reaches_param[node] = (leaf and node not in input_nodes) or any(
            reaches_param[n] for n, _ in children[node]
        )
        for n, _ in children[node]:
            parents.setdefault(n, set()).add(node)
    plan = WeightGrad()
    for node in reaches_input:
        if not reaches_input[node]:
            continue
        frontier = [
            GradientEdge(n, k)
            for n, k in children[node]
            if not reaches_input[n] and reaches_param[n]
        ]
        if not frontier:
            continue
        if any(parents[e.node] != {node} for e in frontier):
            return None  # a weight-side node with another predecessor: not split
        unique = list({(id(e.node), e.output_nr): e for e in frontier}.values())
        plan.split.append(_SplitNode(node, unique))
    for (_, grad), edge in zip(pairs, roots, strict=True):
        if not reaches_input[edge.node] and reaches_param[edge.node]:
            plan.roots.append((edge, grad))
    return plan
