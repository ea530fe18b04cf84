"""Interleaved 1F1B (Narayanan et al., SC 2021; Megatron-LM): v model chunks per rank.

A schedule is data (`pipeline.pure.schedule`). With one stage per rank, 1F1B's bubble is
(R - 1) stage-steps of fill and drain per rank, against M micro-batches of work: the
fraction (R - 1) / (M + R - 1). Cutting the model into S = v * R stages, placed in a loop
(`pipeline.pure.placement`: stage s on rank s mod R), makes each stage v times shorter while
the fill and drain still cross R ranks, so the bubble shrinks to (R - 1) / v stage-steps of
the old size: (R - 1) / (v * M) of the ideal time, Megatron's figure, at the cost of v times
as many messages and more activations held during the longer warm-up.

The function takes (n_ranks, n_microbatches, rank) and returns the rank's merged compute
list, every action naming its global stage. The order, on every rank, is Megatron's:

* the micro-batches go in groups of R, and a group runs through chunk 0, then chunk 1, ...,
  then chunk v - 1 before the next group starts: "depth first", so a micro-batch leaving
  rank R - 1's chunk c arrives when rank 0 turns to chunk c + 1. Any M >= 1 is allowed:
  when R does not divide M, the M // R groups hold R to 2R - 1 micro-batches, sizes within
  one of each other, larger first (like torch's flexible rounds, which need equal sizes);
  with M < R one group holds all of them. (A last group smaller than R can deadlock, e.g.
  R = 5, v = 2, M = 7 in groups of 5 and 2: rank 0's warm-up reaches into the small group's
  chunk 1, whose inputs rank 4 forwards only after a backward that waits for rank 0.) With
  M >= R the bubble is Megatron's; with M < R rank 0 waits at every turn of the loop;
* backwards walk the same table with the chunks reversed (chunk v - 1 first);
* rank r runs 2(R - 1 - r) + (v - 1) * g warm-up forwards (g the first, largest group), then
  alternates one forward and one backward, then drains the backwards (v = 1: R - 1 - r
  warm-up forwards, so `interleaved(1)` is 1F1B with its stages named).

R = 2, v = 2, M = 4: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3; F / B are chunk 0's
(stages 0, 1), f / b chunk 1's (stages 2, 3); a chunk's F takes 1 unit, its B 2 (so a
one-stage-per-rank 1F1B stage takes 2 and 4); one column per unit::

    rank 0:  F0 F1 f0 f1 F2 .  b0 -- F3 b1 -- f2 B0 -- f3 B1 -- .  b2 -- .  b3 -- B2 -- B3 --
    rank 1:  .  F0 F1 f0 b0 -- f1 b1 -- F2 B0 -- F3 B1 -- f2 b2 -- f3 b3 -- B2 -- B3 -- .  .
                                                           <- 27 units; 1F1B: 30, ideal: 24

The bubble is (R - 1)(F + B) / v = 3 units against 1F1B's 6: (R - 1) / (v * M) of the ideal.

`interleaved(v)` gives the schedule with v chunks per rank; `interleaved_1f1b` is v = 2.
Its attributes `placement = "loop"` and `stages_per_rank = v` tell the lowering, `validate`,
the simulator and the runtime how to read the lists.
"""

from __future__ import annotations

import functools
import itertools

from pipeline.pure.actions import Action, Op, check_shape
from pipeline.pure.schedule_spec import ScheduleSpec

__all__ = ["interleaved", "interleaved_1f1b", "microbatch_groups"]


def microbatch_groups(n_ranks: int, n_microbatches: int) -> list[range]:
    """max(1, M // R) groups of consecutive micro-batches, sizes within one of each other,
    the larger first: R each when R divides M (Megatron's), never fewer than R unless M < R."""
    count = max(1, n_microbatches // n_ranks)
    size, extra = divmod(n_microbatches, count)
    starts = [k * size + min(k, extra) for k in range(count + 1)]
    return [range(a, b) for a, b in itertools.pairwise(starts)]


def _order(n_ranks: int, n_microbatches: int, rank: int, v: int) -> list[Action]:
    """Rank `rank`'s compute list with v chunks per rank, in Megatron's order (module doc)."""
    check_shape(n_ranks, n_microbatches, rank)
    groups = microbatch_groups(n_ranks, n_microbatches)
    chunks = list(range(v))
    forwards = [(c, i) for group in groups for c in chunks for i in group]
    backwards = [(c, i) for group in groups for c in reversed(chunks) for i in group]
    total = len(forwards)
    # one chunk: 1F1B's warm-up (the round trip needs no second hop per rank)
    hops = 2 if v > 1 else 1
    warmup = min(hops * (n_ranks - 1 - rank) + (v - 1) * len(groups[0]), total)

    def act(op: Op, chunk: int, i: int) -> Action:
        return Action(op, i, chunk * n_ranks + rank)

    actions = [act(Op.FORWARD, *forwards[k]) for k in range(warmup)]
    for k in range(total):
        if warmup + k < total:
            actions.append(act(Op.FORWARD, *forwards[warmup + k]))
        actions.append(act(Op.BACKWARD, *backwards[k]))
    return [*actions, Action(Op.OPTIMIZER_STEP)]


@functools.cache
def interleaved(stages_per_rank: int) -> ScheduleSpec:
    """Interleaved 1F1B with `stages_per_rank` chunks per rank, loop placement (module doc)."""
    if not isinstance(stages_per_rank, int) or stages_per_rank < 1:
        raise ValueError(f"stages_per_rank must be >= 1 (an int), got {stages_per_rank!r}")
    return ScheduleSpec(
        "interleaved_1f1b",
        functools.partial(_order, v=stages_per_rank),
        placement="loop",
        stages_per_rank=stages_per_rank,
        rechunk=interleaved,
    )


interleaved_1f1b = interleaved(2)
