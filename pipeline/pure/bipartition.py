"""Bi-Partition's cost model and its exact search: where the forward and backward cuts go.

A plan with `handoff[s] = k` runs the forward of stage s's last k layers on s and their
backward on s + 1 (`pipeline.distributed.handoff` runs it; only separable layers qualify,
`LayerCost.separable`). Per micro-batch, with F and B a layer's forward and backward:

    stage s        sum F over its layers + sum B over the layers it does not hand on
                   + sum B over the k_in layers handed to it by s - 1
    memory of s    a handed layer keeps nothing on s (its forward makes no graph) and its
                   input on s + 1 (which also holds replicas: parameters and gradients)
    boundary       s sends the k inputs besides its output; one gradient comes back

`search` minimises the bottleneck (largest stage time) jointly over contiguous partitions
and handoffs, exactly, by dynamic programming over (stage, first layer, layers handed in):

    best[s][i][k] = min over the stage's end j and its handoff k' of
                    max(time(s; i, j, k, k'), best[s + 1][j][k'])

with k' at most `max_handoff`, the trailing separable layers of [i, j) and j - i - 1;
O(S L^2 K^2). Ties go to fewer handed layers (no gratuitous cut). `tests/pipeline/pure/
test_bipartition.py` checks it against brute force over every partition and handoff.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from itertools import accumulate

from pipeline.pure.costs import LayerCost
from pipeline.pure.partition import bounds
from pipeline.pure.simulate import StageCost

__all__ = ["handed_stage_costs", "search", "stage_times"]


def stage_times(
    costs: Sequence[LayerCost], sizes: Sequence[int], handoff: Sequence[int]
) -> list[float]:
    """Each stage's forward + backward seconds per micro-batch under a handoff (module doc)."""
    out = []
    for s, (a, e) in enumerate(bounds(sizes)):
        k_in = handoff[s - 1] if s > 0 else 0
        k_out = handoff[s] if s < len(handoff) else 0
        out.append(
            sum(c.forward_s for c in costs[a:e])
            + sum(c.backward_s for c in costs[a : e - k_out])
            + sum(c.backward_s for c in costs[a - k_in : a])
        )
    return out


def handed_stage_costs(
    stages: Sequence[StageCost],
    costs: Sequence[LayerCost],
    sizes: Sequence[int],
    handoff: Sequence[int],
) -> list[StageCost]:
    """Whole-layer stage costs (`pipeline.pure.simulate.stage_costs`) moved by a handoff."""
    out = list(stages)
    for s, ((_, e), k) in enumerate(zip(bounds(sizes), handoff, strict=False)):
        if not k:
            continue
        handed = costs[e - k : e]
        moved = sum(c.backward_s for c in handed)
        inputs = sum(costs[j - 1].output_bytes for j in range(e - k, e) if j > 0)
        replicas = sum(c.param_bytes + c.grad_bytes for c in handed)
        src, dst = out[s], out[s + 1]
        out[s] = StageCost(
            forward_s=src.forward_s,
            backward_s=src.backward_s - moved,
            activation_bytes=max(src.activation_bytes - sum(c.activation_bytes for c in handed), 0),
            output_bytes=src.output_bytes + inputs,
            state_bytes=src.state_bytes,
            grad_bytes=costs[e - k - 1].output_bytes,  # the first handed layer's input
            optimizer_s=src.optimizer_s,
            weight_s=None if src.weight_s is None else max(src.weight_s - moved / 2, 0.0),
        )
        out[s + 1] = StageCost(
            forward_s=dst.forward_s,
            backward_s=dst.backward_s + moved,
            activation_bytes=dst.activation_bytes + inputs,
            output_bytes=dst.output_bytes,
            state_bytes=dst.state_bytes + replicas,
            optimizer_s=dst.optimizer_s,
            weight_s=dst.weight_s,
        )
    return out


def search(
    costs: Sequence[LayerCost], n_stages: int, max_handoff: int = 4
) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
    """(bottleneck, sizes, handoff) minimising the largest stage time (module doc)."""
    n = len(costs)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot split {n} layers into {n_stages} stages")
    fwd = [0.0, *accumulate(c.forward_s for c in costs)]
    bwd = [0.0, *accumulate(c.backward_s for c in costs)]
    trailing = [0] * (n + 1)  # separable layers ending just before j, in a row
    for j in range(1, n + 1):
        trailing[j] = trailing[j - 1] + 1 if costs[j - 1].separable else 0

    @functools.cache
    def best(s: int, i: int, k_in: int) -> tuple[float, int, tuple[tuple[int, int], ...]]:
        """(bottleneck, handed layers, ((end, k_out) per stage)) for stages s.. from layer i."""
        last = s == n_stages - 1
        result: tuple[float, int, tuple[tuple[int, int], ...]] = (math.inf, 0, ())
        for j in [n] if last else range(i + 1, n - (n_stages - s - 1) + 1):
            limit = 0 if last else min(max_handoff, trailing[j], j - i - 1)
            for k_out in range(limit + 1):
                t = (fwd[j] - fwd[i]) + (bwd[j - k_out] - bwd[i]) + (bwd[i] - bwd[i - k_in])
                if t > result[0]:
                    continue
                if last:
                    rest: tuple[float, int, tuple[tuple[int, int], ...]] = (0.0, 0, ())
                else:
                    rest = best(s + 1, j, k_out)
                candidate = (max(t, rest[0]), rest[1] + k_out, ((j, k_out), *rest[2]))
                if candidate[:2] < result[:2]:
                    result = candidate
        return result

    bottleneck, _, cuts = best(0, 0, 0)
    ends = [j for j, _ in cuts]
    sizes = tuple(e - a for a, e in zip([0, *ends[:-1]], ends, strict=True))
    return bottleneck, sizes, tuple(k for _, k in cuts[:-1])
