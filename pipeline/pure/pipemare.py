"""PipeMare's schedule (Yang et al., arXiv 1910.05124): asynchronous 1F1B, one weight copy.

The list is PipeDream-2BW's stream list (`pipeline.pure.two_bw.stream_actions`): 1F1B over
the micro-batches of a stream of steps, numbered g = t * M + i, warm-up once and cool-down
once, an OPTIMIZER_STEP(t) after the stage's last backward of step t. What differs is what
the runtime does with it, so the schedule is a separate entry of the registry:

  * one weight copy per stage (`weight_copies = 1`, what the planners and the simulator
    count), updated in place after every `update_every` of the stage's own backwards
    (`pipeline.local.asynchronous`), so a micro-batch's forward and backward see different
    weights on every stage but the last;
  * OPTIMIZER_STEP(t) applies nothing: it only closes step t for the stream's agreement
    (losses, failures; `pipeline.distributed.stream`).

It has no M >= S - 1 condition (2BW's second version needs one; one copy does not).
"""

from __future__ import annotations

from pipeline.pure.actions import Action
from pipeline.pure.schedule_spec import ScheduleSpec
from pipeline.pure.two_bw import stream_actions

__all__ = ["pipemare"]


def _pipemare(n_stages: int, n_microbatches: int, stage: int, n_steps: int = 1) -> list[Action]:
    """PipeMare's list for a stream of `n_steps` steps (module doc)."""
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    return list(stream_actions(n_stages, n_microbatches, stage, lambda t: t < n_steps))


# One weight copy, a stream, updates applied while earlier micro-batches are in flight.
pipemare = ScheduleSpec("pipemare", _pipemare, stream=True, asynchronous=True)
