"""PipeDream-2BW (Narayanan et al., ICML 2021): 1F1B without flushes, two weight versions.

A schedule is data (`pipeline.pure.schedule`); this one spans a *stream* of steps instead
of one, so it lives apart. Micro-batch i of step t is numbered globally, g = t * M + i, and
a stage's list for a stream of T steps is 1F1B over the T * M micro-batches, with an
OPTIMIZER_STEP(t) (`Action(Op.OPTIMIZER_STEP, step=t)`) right after the stage's last backward
of step t. Warm-up happens once, at the start of the stream, and cool-down once, at its
end: between the steps there is no flush. 2 stages, M = 2, T = 2 (S0 = OPTIMIZER_STEP(0))::

    stage 0:  F0 F1    B0 F2    B1 S0 F3    B2    B3 S1
    stage 1:     F0 B0    F1 B1 S0    F2 B2 F3 B3 S1

Semantics (the paper's): every micro-batch of step t runs its forward *and* its backward
with W(t-1), so W(t+1) = W(t) - lr * grad f(W(t-1)), with W(-1) = W(0); for a general
optimizer, the update of W(t) uses the gradients computed at W(t-1). A stage's
OPTIMIZER_STEP(t) turns W(t) into W(t+1), which step t + 2 is the first to use; step t + 1's
micro-batches, some of which are in flight across OPTIMIZER_STEP(t), keep using W(t). So a
stage holds two versions: the one in-flight micro-batches use and the newest. That is
safe only if a stage's OPTIMIZER_STEP(t) comes before its first forward of step t + 2: in
1F1B stage s runs its forward of micro-batch g + (S - s - 1) before its backward of g,
so this needs M >= S - 1 (`validate` checks the order; `check_2bw` says why up front).

`stream_actions` generates a list lazily, asking `has_step(t)` whether step t exists only
when it is about to need its first forward: the runtime uses it with a batch iterator
whose length it does not know (`pipeline.distributed.stream`). The runtime applies each
update when the version it produces is first needed; see that module for the protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from pipeline.pure.actions import Action, Op, check_shape
from pipeline.pure.schedule_spec import ScheduleSpec

__all__ = ["check_2bw", "pipedream_2bw", "stream_actions"]


def check_2bw(n_stages: int, n_microbatches: int) -> None:
    """Raise ValueError unless two weight versions suffice (module doc: M >= S - 1)."""
    if n_microbatches < n_stages - 1:
        raise ValueError(
            f"PipeDream-2BW needs n_microbatches >= n_stages - 1 ({n_stages - 1}), got "
            f"{n_microbatches}: with fewer, stage 0 would start step t + 2 before applying "
            "step t's update, which needs a third weight version"
        )


def stream_actions(
    n_stages: int, n_microbatches: int, stage: int, has_step: Callable[[int], bool]
) -> Iterator[Action]:
    """Stage `stage`'s compute list for a stream whose step t exists iff `has_step(t)`.

    `has_step` is asked for steps 0, 1, 2, ... in order, each once, when the list first
    needs its answer; after a False it is asked nothing more.
    """
    check_shape(n_stages, n_microbatches, stage)
    m, warmup = n_microbatches, n_stages - stage - 1
    forwarded = backwarded = 0
    known, ended = -1, False  # the last step known to exist; has_step said False

    def more() -> bool:
        nonlocal known, ended
        t = forwarded // m
        if t > known and not ended:
            if has_step(t):
                known = t
            else:
                ended = True
        return t <= known

    while forwarded < warmup and more():
        yield Action(Op.FORWARD, forwarded, stage)
        forwarded += 1
    while True:
        if more():
            yield Action(Op.FORWARD, forwarded, stage)
            forwarded += 1
        if backwarded == forwarded:
            return
        yield Action(Op.BACKWARD, backwarded, stage)
        backwarded += 1
        if backwarded % m == 0:
            yield Action(Op.OPTIMIZER_STEP, step=backwarded // m - 1)


def _pipedream_2bw(
    n_stages: int, n_microbatches: int, stage: int, n_steps: int = 1
) -> list[Action]:
    """PipeDream-2BW's list for a stream of `n_steps` steps (module doc)."""
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    return list(stream_actions(n_stages, n_microbatches, stage, lambda t: t < n_steps))


# Parameters are held twice, and the list spans a stream.
pipedream_2bw = ScheduleSpec("2bw", _pipedream_2bw, stream=True, weight_copies=2)
