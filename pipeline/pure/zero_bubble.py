"""ZB-H1 and ZB-V, the zero-bubble schedules that keep 1F1B's memory (Qi et al., ICLR 2024).

A schedule is data (`pipeline.pure.schedule`); these are long enough to live apart.
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

`zbv` (the paper's section 6) cuts the model into 2R stages placed in a V
(`pipeline.pure.placement`: rank r holds stages r and 2R - 1 - r), so rank 0 holds both the
first stage and the loss stage: a micro-batch's backward starts on the rank its forward
started from, and the fill of one chunk is the drain of the other. Its order (`zbv`'s doc)
fills what is left with weight gradients. R = 2, M = 4; F, B (BI), W are chunk 0's (stages
0, 1), f, b, w chunk 1's (stages 3, 2); each takes 1 unit (the paper's F = B = W), rank 0's
stage 0 runs its backward whole (2 units, as in `zbh1`)::

    rank 0:  F0 F1 F2 f0 b0 w0 f1 b1 w1 F3 B0 -- f2 b2 w2 B1 -- f3 b3 w3 B2 -- B3 -- .
    rank 1:  .  F0 f0 F1 f1 b0 w0 F2 B0 W0 f2 b1 w1 F3 B1 W1 f3 b2 w2 B2 b3 B3 W2 w3 W3
                                                               <- 25 units; ideal: 24

The only bubble left is the ramp: rank r cannot start before r chunk forwards, so with
M >= 2R - 1 the step takes the ideal plus (R - 1) chunk forwards, whatever M (1F1B: (R - 1)
whole forwards and backwards). Every rank holds at most 2R chunk activations, 1F1B's peak
(its first stage's R whole ones).
"""

from __future__ import annotations

import functools
import math

from pipeline.pure.actions import Action, Op, check_shape
from pipeline.pure.schedule_spec import ScheduleSpec

__all__ = ["zbh1", "zbv"]


def _zbh1(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """ZB-H1: 1F1B's in-flight counts, split backwards, W's filling the waits (module doc)."""
    check_shape(n_stages, n_microbatches, stage)
    limits = tuple(min(n_stages - s, n_microbatches) for s in range(n_stages))
    actions = list(_split_lists(n_stages, n_microbatches, limits)[stage])
    if stage == 0:
        actions = _fused_at_w(actions, stage=0)
    return [*actions, Action(Op.OPTIMIZER_STEP)]


def _fused_at_w(actions: list[Action], stage: int) -> list[Action]:
    """Stage `stage`'s actions without splits: each BI_i dropped, its W_i a whole B_i.

    Nothing waits for the first stage's input gradient (the batch needs none), so its BI
    only delays W's work; a fused backward where W stood does the same work in one pass,
    at the same point, and skips the split's cost, which lies outside the kernels (planning
    the split in Python, one autograd engine call per split node, the hooks).
    """
    fused = [a for a in actions if (a.op, a.stage) != (Op.BACKWARD_INPUT, stage)]
    return [
        Action(Op.BACKWARD, a.microbatch, a.stage)
        if (a.op, a.stage) == (Op.BACKWARD_WEIGHT, stage)
        else a
        for a in fused
    ]


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
            option = _zbh1_next(
                s, free[s], nxt_f[s], nxt_b[s], nxt_w[s], limit[s], M, act[s], grad[s]
            )
            if option is not None and (best is None or option[0] < best[0]):
                best = (option[0], s, option[1])
        assert best is not None, "the unit-cost replay cannot stall"
        start, s, action = best
        free[s] = start + 1.0
        lists[s].append(action)
        i = action.microbatch_index
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
    s: int,
    free: float,
    f: int,
    b: int,
    w: int,
    limit: int,
    m: int,
    act: list[float],
    grad: list[float],
) -> tuple[float, Action] | None:
    """(start time, action) of what stage s does next in the replay, None if nothing is left."""
    candidates: list[tuple[float, int, Action]] = []  # (start, priority, action)
    if b < f:
        candidates.append((max(free, grad[b]), 0, Action(Op.BACKWARD_INPUT, b, s)))
    if f < m and f - w < limit:
        candidates.append((max(free, act[f]), 1, Action(Op.FORWARD, f, s)))
    if w < b:
        candidates.append((free, 2, Action(Op.BACKWARD_WEIGHT, w, s)))
    if not candidates:
        return None
    start, _, action = min(candidates, key=lambda c: (c[0], c[1]))
    return start, action


# -- ZB-V: two stages per rank in a V ------------------------------------------------------
def _zbv(n_ranks: int, n_microbatches: int, rank: int) -> list[Action]:
    """ZB-V (Qi et al., section 6): V placement, split backwards, the paper's order.

    Rank r holds stage r (chunk 0, going down) and stage 2R - 1 - r (chunk 1, coming back
    up; `pipeline.pure.placement`), so rank 0 holds the first stage and the loss stage. Its
    list, tokens "F0" = forward of chunk 0, "B1" = BACKWARD_INPUT of chunk 1, "W0" = weight
    gradient of chunk 0, each token taking the next micro-batch of its kind and chunk:

        warm-up    F0 x (2(R - r) - 1), then (F1 F0) x r, then (F1 B1 W1) x (R - r)
        steady     (F0 B0 W0 F1 B1 W1) until every forward is issued (F0 dropped when none
                   is left)
        cool-down  (B0 B1) x r, then (B0 W0) x (R - r), then the pending W1s, the pending W0s

    The pattern fills the V only with at least 2R - 1 micro-batches; with fewer, it is
    built for 2R - 1 and the actions of the missing micro-batches are dropped (a sub-order
    of a valid order is valid: every dependency is within one micro-batch). Stage 0 sends
    no gradient, so, as in `zbh1`, its backward runs whole where its W stood.
    """
    check_shape(n_ranks, n_microbatches, rank)
    n = max(n_microbatches, 2 * n_ranks - 1)
    actions = [a for a in _zbv_pattern(n_ranks, n, rank) if a.microbatch_index < n_microbatches]
    if rank == 0:
        actions = _fused_at_w(actions, stage=0)
    return [*actions, Action(Op.OPTIMIZER_STEP)]


zbh1 = ScheduleSpec("zbh1", _zbh1, split_backward=True)
zbv = ScheduleSpec("zbv", _zbv, placement="v", stages_per_rank=2, split_backward=True)


def _zbv_pattern(n_ranks: int, n: int, rank: int) -> list[Action]:
    """The token order of `zbv`'s doc for n micro-batches, tokens made actions."""
    R, r = n_ranks, rank
    ops = {"F": Op.FORWARD, "B": Op.BACKWARD_INPUT, "W": Op.BACKWARD_WEIGHT}
    stage = {0: r, 1: 2 * R - 1 - r}
    issued: dict[str, int] = {}  # token -> how many were issued

    def emit(*tokens: str) -> list[Action]:
        out = []
        for token in tokens:
            i = issued.get(token, 0)
            issued[token] = i + 1
            out.append(Action(ops[token[0]], i, stage[int(token[1])]))
        return out

    actions = emit(*["F0"] * (2 * (R - r) - 1), *["F1", "F0"] * r, *["F1", "B1", "W1"] * (R - r))
    count = issued.get
    while count("F0", 0) < n or count("F1", 0) < count("F0", 0):
        first = ["F0"] if count("F0", 0) < n else []
        actions += emit(*first, "B0", "W0", "F1", "B1", "W1")
    actions += emit(*["B0", "B1"] * r, *["B0", "W0"] * (R - r))
    actions += emit(*["W1"] * (count("B1", 0) - count("W1", 0)))
    actions += emit(*["W0"] * (count("B0", 0) - count("W0", 0)))
    return actions
