"""ZB-H1, the zero-bubble schedule that keeps 1F1B's memory (Qi et al., ICLR 2024).

A schedule is data (`pipeline.pure.schedule`); this one is long enough to live apart.
It needs split backwards: BACKWARD_INPUT, then later BACKWARD_WEIGHT, which the runtime
runs exactly and without running any autograd node twice (`pipeline.local.backward`).

`zbh1` (after "Zero Bubble Pipeline Parallelism") is 1F1B with split backwards, where each
stage keeps 1F1B's in-flight count min(S - s, M) and computes weight gradients while the
input gradient it just sent travels upstream. The lists come from replaying the stages
with unit costs (F = BI = W = 1, the paper's assumption) and, whenever a stage is free,
taking the first of: the oldest BI whose gradient has arrived; the next forward, if its
activations have arrived and the in-flight count allows it; the oldest pending W. A list
built from one valid execution orders every action after what it waits for, so it never
deadlocks, whatever the real costs. 2 stages, 4 micro-batches, one column per unit of
time (BI shown as B; 1F1B, whose backward takes two units, needs 15)::

    stage 0:  F0 F1 .  B0 W0 F2 B1 W1 F3 B2 W2 .  B3 W3    <- 14 units
    stage 1:  .  F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3

The paper's ZB-H1 lets every stage hold S micro-batches (the peak of 1F1B's first stage);
here each stage holds exactly what it holds under 1F1B, because a stage's memory budget is
what the planner enforces and a split micro-batch keeps its whole graph until W. The last
stage then holds one micro-batch and runs F, BI, W of each in turn, so with unit costs no
schedule under these limits beats 3M + 2(S - 1); this one reaches it. Its bubble is 2(S - 1)
units per stage, two thirds of 1F1B's 3(S - 1) (the paper's, with more memory: S - 1).
Under these limits every W comes right after its own BI (so at most one micro-batch waits
for its W): the step is shorter because the gradient leaves a stage after BI instead of
after the whole backward, and the stage above runs its BI while this one runs W.

The first stage sends no gradient upstream, so its split would buy nothing and cost the
split's overhead (`pipeline.local.backward`: about 1.2x a fused backward on CPU): its list
runs one fused BACKWARD where the replay put W, the same work at the same point::

    stage 0:  F0 F1 .  B0    F2 B1    F3 B2    .  B3       <- the same 14 units
"""

from __future__ import annotations

import functools
import math

from pipeline.pure.actions import Action, Op, check_shape

__all__ = ["zbh1"]


def zbh1(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """ZB-H1: 1F1B's in-flight counts, split backwards, W's filling the waits (module doc)."""
    check_shape(n_stages, n_microbatches, stage)
    limits = tuple(min(n_stages - s, n_microbatches) for s in range(n_stages))
    actions = list(_split_lists(n_stages, n_microbatches, limits)[stage])
    if stage == 0:
        actions = _fused_at_w(actions)
    return [*actions, Action(Op.OPTIMIZER_STEP)]


def _fused_at_w(actions: list[Action]) -> list[Action]:
    """The first stage's list without splits: each BI_i dropped, its W_i a whole B_i.

    Nothing waits for the first stage's input gradient (the batch needs none), so its BI
    only delays W's work; a fused backward where W stood does the same work in one pass,
    at the same point, and skips the split's cost, which lies outside the kernels (planning
    the split in Python, one autograd engine call per split node, the hooks).
    """
    fused = [a for a in actions if a.op is not Op.BACKWARD_INPUT]
    return [Action(Op.BACKWARD, a.microbatch) if a.op is Op.BACKWARD_WEIGHT else a
            for a in fused]  # fmt: skip


@functools.lru_cache(maxsize=64)
def _split_lists(
    n_stages: int, n_microbatches: int, limit: tuple[int, ...]
) -> tuple[tuple[Action, ...], ...]:
    """Every stage's compute list, from a unit-cost replay with these in-flight limits."""
    S, M = n_stages, n_microbatches
    lists: list[list[Action]] = [[] for _ in range(S)]
    act = [[math.inf] * M for _ in range(S)]  # when stage s may start F_i (activation there)
    grad = [[math.inf] * M for _ in range(S)]  # when stage s may start BI_i (gradient there)
    act[0] = [0.0] * M
    free = [0.0] * S
    nxt_f, nxt_b, nxt_w = [0] * S, [0] * S, [0] * S
    while any(w < M for w in nxt_w):
        # the stage that can start something earliest goes first (ties: lower stage)
        best: tuple[float, int, Action] | None = None
        for s in range(S):
            option = _zbh1_next(s, free[s], nxt_f[s], nxt_b[s], nxt_w[s], limit[s], M,
                                act[s], grad[s])  # fmt: skip
            if option is not None and (best is None or option[0] < best[0]):
                best = (option[0], s, option[1])
        assert best is not None, "the unit-cost replay cannot stall"
        start, s, action = best
        free[s] = start + 1.0
        lists[s].append(action)
        i = action.microbatch
        if action.op is Op.FORWARD:
            nxt_f[s] += 1
            if s + 1 < S:
                act[s + 1][i] = free[s]
            else:
                grad[s][i] = free[s]  # the last stage's BI follows its own forward
        elif action.op is Op.BACKWARD_INPUT:
            nxt_b[s] += 1
            if s > 0:
                grad[s - 1][i] = free[s]
        else:
            nxt_w[s] += 1
    return tuple(tuple(actions) for actions in lists)


def _zbh1_next(
    s: int, free: float, f: int, b: int, w: int, limit: int, m: int,
    act: list[float], grad: list[float],
) -> tuple[float, Action] | None:  # fmt: skip
    """(start time, action) of what stage s does next in the replay, None if nothing is left."""
    candidates: list[tuple[float, int, Action]] = []  # (start, priority, action)
    if b < f:
        candidates.append((max(free, grad[b]), 0, Action(Op.BACKWARD_INPUT, b)))
    if f < m and f - w < limit:
        candidates.append((max(free, act[f]), 1, Action(Op.FORWARD, f)))
    if w < b:
        candidates.append((free, 2, Action(Op.BACKWARD_WEIGHT, w)))
    if not candidates:
        return None
    start, _, action = min(candidates, key=lambda c: (c[0], c[1]))
    return start, action
