"""Pipeline schedules as plain data.

A schedule says, for one stage, in which order it runs the forward and backward passes of
the micro-batches of one training step. It is a pure function

    (n_stages, n_microbatches, stage) -> list[Action]

so it can be printed, validated, simulated and tested without any process. Every action
names its stage (`Action(Op.FORWARD, i, stage)`, printed "F3@1"); the closing
`Action(Op.OPTIMIZER_STEP)` names none. The runtime (`pipeline.local.stage`) executes the
list; `lower()` adds the point-to-point messages.

Compute actions (what `gpipe`, `one_f_one_b` and `zbh1` return)::

    FORWARD(i)          run micro-batch i through this stage's layers
    BACKWARD(i)         back-propagate micro-batch i through them (input and weight gradients)
    BACKWARD_INPUT(i)   "BI": only the gradient of the inputs (what the previous stage waits
                        for); the weight gradient is left for ...
    BACKWARD_WEIGHT(i)  "W": ... this, which nothing waits for, so it can fill a bubble
                        (`pipeline.local.backward` says how the split stays exact)
    OPTIMIZER_STEP      apply the accumulated gradients (once, after the last backward)

A micro-batch's backward is either one BACKWARD or a BACKWARD_INPUT followed, later, by a
BACKWARD_WEIGHT; its activations stay until the end of the last of them, so `in_flight`
counts a micro-batch from its forward to that end.

Communication actions (added by `lower`)::

    RECV_ACT(i)   post the receive of micro-batch i's activations from stage - 1
    SEND_ACT(i)   send micro-batch i's outputs to stage + 1
    RECV_GRAD(i)  post the receive of the gradient of micro-batch i's outputs
    SEND_GRAD(i)  send the gradient of micro-batch i's inputs to stage - 1

A receive is placed just before the action that consumes it and a send just after the action
that produced it; the runtime posts the communication between two compute actions as one
group (NCCL's `batch_isend_irecv`), the consuming action waits for its receive, and the step
waits for all sends before the optimizer step (`pipeline.pure.wire_order` states the rules
and proves every list against them).

GPipe, 2 stages, 3 micro-batches (time flows right)::

    stage 0:  F0 F1 F2          B0 B1 B2     <- all forwards, then all backwards
    stage 1:     F0 F1 F2 B0 B1 B2

1F1B (PipeDream-Flush), same shape: stage s runs min(S-s-1, M) warm-up forwards, then
alternates one forward and one backward, then drains::

    stage 0:  F0 F1    B0 F2    B1    B2
    stage 1:     F0 B0    F1 B1    F2 B2

ZB-H1 (`zbh1`, `pipeline.pure.zero_bubble`): 1F1B with split backwards and 1F1B's in-flight
counts, each stage's weight gradients run after the input gradient has left (the first
stage, which sends no gradient, runs each backward whole where its W would be)::

    stage 0:  F0 F1 .  B0    F2 B1    F3 B2    .  B3       <- 14 units (B: 2 units)
    stage 1:  .  F0 B0 W0 F1 B1 W1 F2 B2 W2 F3 B3 W3       <- 1F1B: 15 units (BI shown as B)

Every schedule is registered as a `ScheduleSpec` (`pipeline.pure.schedule_spec`): its list
builder and the facts below, read by everything else (`spec_of`, `register_schedule`).

PipeDream-2BW (`2bw`, `pipeline.pure.two_bw`) spans a *stream* of steps: the schedules whose
spec says `stream` take a fourth argument, n_steps, number micro-batch i of step t
as t * M + i and put an OPTIMIZER_STEP(t) after each step's last backward. `stage_actions`,
`validate` and `simulate` take n_steps for them (1 by default).

Several stages per rank: `interleaved_1f1b` (`pipeline.pure.interleaved`) and `zbv`
(`pipeline.pure.zero_bubble`) cut the model into S = v * R stages, placed on the R ranks
by their spec's `placement` ("loop" or "v", `pipeline.pure.placement`) with
`stages_per_rank` = v. They take (n_ranks, n_microbatches, rank) and return the rank's one
merged list, every action naming its global stage (`Action.stage`); `stage_actions`,
`validate` and `simulate` read their first two arguments as ranks then. Messages are only
needed between stages on different ranks (a hand-over inside a rank is local), and for a
comm action with stage s::

    RECV_ACT   what stage s consumes, from stage s - 1     SEND_ACT   s's outputs, to s + 1
    RECV_GRAD  the gradient of s's outputs, from s + 1     SEND_GRAD  of s's inputs, to s - 1

They are lowered for all ranks at once (`pipeline.pure.multi_stage.lower_ranks`): a receive
just before its consumer no longer gives every pair of ranks one order when activations and
gradients of several stages share it. `get_schedule("interleaved_1f1b", stages_per_rank=3)`
gives other chunk counts; `placement_of(schedule, n_ranks)` says where each stage lives.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence

from pipeline.pure.actions import (
    GRAD_OPS,
    Action,
    Op,
    ScheduleError,
    ScheduleFn,
)
from pipeline.pure.actions import check_shape as _check_shape
from pipeline.pure.interleaved import interleaved_1f1b
from pipeline.pure.list_checks import check_stage, check_versions
from pipeline.pure.multi_stage import check_ranks, lower_ranks
from pipeline.pure.pipemare import pipemare
from pipeline.pure.placement import Placement
from pipeline.pure.registry import Registry
from pipeline.pure.schedule_spec import ScheduleSpec, resolve_schedule_name
from pipeline.pure.two_bw import pipedream_2bw
from pipeline.pure.wire_order import check_order
from pipeline.pure.zero_bubble import zbh1, zbv

__all__ = [
    "SCHEDULES",
    "Action",
    "Op",
    "Placement",
    "ScheduleError",
    "ScheduleFn",
    "ScheduleLike",
    "ScheduleSpec",
    "forward_only",
    "get_schedule",
    "gpipe",
    "in_flight",
    "interleaved_1f1b",
    "is_multi_stage",
    "is_stream",
    "lower",
    "lower_lazily",
    "one_f_one_b",
    "pipedream_2bw",
    "placement_for",
    "placement_of",
    "register_schedule",
    "spec_of",
    "stage_actions",
    "validate",
    "zbh1",
    "zbv",
]


ScheduleLike = str | ScheduleSpec | ScheduleFn  # a registered name, a spec, or a plain builder


def _gpipe(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """All forwards, then all backwards, then one optimizer step.

    Backwards run in micro-batch order (as in `torch.distributed.pipelining`), so gradients
    accumulate in the same order as in 1F1B and in single-process gradient accumulation.
    """
    _check_shape(n_stages, n_microbatches, stage)
    forwards = [Action(Op.FORWARD, i, stage) for i in range(n_microbatches)]
    backwards = [Action(Op.BACKWARD, i, stage) for i in range(n_microbatches)]
    return [*forwards, *backwards, Action(Op.OPTIMIZER_STEP)]


def _one_f_one_b(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """PipeDream-Flush: warm-up forwards, one-forward-one-backward, drain, optimizer step."""
    _check_shape(n_stages, n_microbatches, stage)
    warmup = min(n_stages - stage - 1, n_microbatches)
    actions = [Action(Op.FORWARD, i, stage) for i in range(warmup)]
    next_forward, next_backward = warmup, 0
    while next_backward < n_microbatches:
        if next_forward < n_microbatches:
            actions.append(Action(Op.FORWARD, next_forward, stage))
            next_forward += 1
        actions.append(Action(Op.BACKWARD, next_backward, stage))
        next_backward += 1
    actions.append(Action(Op.OPTIMIZER_STEP))
    return actions


def forward_only(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """Inference: every micro-batch's forward, no backward, no optimizer step."""
    _check_shape(n_stages, n_microbatches, stage)
    return [Action(Op.FORWARD, i, stage) for i in range(n_microbatches)]


gpipe = ScheduleSpec("gpipe", _gpipe)
one_f_one_b = ScheduleSpec("1f1b", _one_f_one_b)

# Every schedule by name: what `get_schedule`, the planners and the runtime look up.
SCHEDULES: Registry[ScheduleSpec] = Registry(
    "schedule",
    {
        spec.name: spec
        for spec in (gpipe, one_f_one_b, zbh1, pipedream_2bw, pipemare, interleaved_1f1b, zbv)
    },
)


def register_schedule(spec: ScheduleSpec, *, replace: bool = False) -> ScheduleSpec:
    """Add `spec` to `SCHEDULES` under its name, so that `schedule="<name>"` finds it; an
    existing name needs `replace=True`. Returns `spec`."""
    if not isinstance(spec, ScheduleSpec):
        raise TypeError(f"register_schedule takes a ScheduleSpec, got {type(spec).__name__}")
    SCHEDULES.register(spec.name.lower(), spec, replace=replace)
    return spec


def get_schedule(name: str, stages_per_rank: int | None = None) -> ScheduleSpec:
    """The schedule registered as `name` (or a torch.distributed.pipelining name it is an
    alias of, `resolve_schedule_name`); with `stages_per_rank`, its variant with that many
    stages per rank (`interleaved_1f1b` takes any v >= 1, `zbv` 2, the others 1)."""
    spec = SCHEDULES[resolve_schedule_name(name, SCHEDULES)]
    return spec.with_stages_per_rank(stages_per_rank)


def spec_of(schedule: ScheduleLike) -> ScheduleSpec:
    """`schedule` as a spec: a registered name looked up, a spec as it is, a plain builder
    function as a flushed schedule with one stage per rank (named after the function)."""
    if isinstance(schedule, ScheduleSpec):
        return schedule
    if isinstance(schedule, str):
        return get_schedule(schedule)
    if callable(schedule):
        return ScheduleSpec(getattr(schedule, "__name__", "custom"), schedule)
    raise TypeError(
        f"a schedule is a registered name, a ScheduleSpec or a builder function, got {schedule!r}"
    )


def is_stream(schedule: ScheduleLike) -> bool:
    """True for schedules without a flush, whose lists span a stream of steps (2BW)."""
    return spec_of(schedule).stream


def is_multi_stage(schedule: ScheduleLike) -> bool:
    """True for schedules whose lists are per rank, naming stages (a `placement`)."""
    return spec_of(schedule).multi_stage


def placement_of(schedule: ScheduleLike, n_ranks: int) -> Placement:
    """Where `schedule` puts its stages on `n_ranks` ranks: its spec's `placement` and
    `stages_per_rank`, or one stage per rank (`Placement.single`)."""
    spec = spec_of(schedule)
    if spec.placement is None:
        return Placement.single(n_ranks)
    return Placement(spec.placement, n_ranks, spec.stages_per_rank)


def placement_for(schedule: ScheduleLike, n_stages: int) -> Placement:
    """Where `schedule` puts `n_stages` stages: several per rank for an interleaved or V
    schedule (`n_stages` must then be a multiple of its stages per rank), else one each."""
    spec = spec_of(schedule)
    v = spec.stages_per_rank
    if n_stages % v:
        raise ValueError(
            f"schedule {spec.name!r} places {v} stages on each rank: the number of stages "
            f"must be a multiple of {v}, got {n_stages}"
        )
    return placement_of(spec, n_stages // v)


def lower(compute: Sequence[Action], stage: int, n_stages: int) -> list[Action]:
    """Add the point-to-point messages a compute list needs on `stage`.

    Each send right after the action that produced its payload; each receive just before
    the action that consumes it, so the sends of one compute and the receive of the next
    are posted together, as one group (`pipeline.pure.wire_order`: NCCL's rules).
    """
    return list(lower_lazily(compute, stage, n_stages))


def lower_lazily(compute: Iterable[Action], stage: int, n_stages: int) -> Iterator[Action]:
    """`lower`, one action at a time (a stream's list is pulled as batches arrive)."""
    first, last = stage == 0, stage == n_stages - 1
    for action in compute:
        if action.op is Op.OPTIMIZER_STEP:
            yield action
            continue
        if action.stage != stage:
            raise ScheduleError(
                f"stage {stage}'s list holds {action}, of stage {action.stage}: lists of "
                "ranks that hold several stages are lowered together (multi_stage.lower_ranks)"
            )
        i = action.microbatch
        if action.op is Op.FORWARD and not first:
            yield Action(Op.RECV_ACT, i, stage)
        elif action.op in GRAD_OPS and not last:
            yield Action(Op.RECV_GRAD, i, stage)
        yield action
        if action.op is Op.FORWARD and not last:
            yield Action(Op.SEND_ACT, i, stage)
        elif action.op in GRAD_OPS and not first:
            yield Action(Op.SEND_GRAD, i, stage)


def stage_actions(
    schedule: ScheduleLike,
    n_stages: int,
    n_microbatches: int,
    stage: int,
    n_steps: int = 1,
) -> list[Action]:
    """The lowered action list one stage executes per training step (per stream of
    `n_steps` steps for a stream schedule); for a schedule with several stages per rank,
    the list of rank `stage` of `n_stages` ranks (module doc)."""
    spec = spec_of(schedule)
    if spec.stream:
        return lower(spec(n_stages, n_microbatches, stage, n_steps), stage, n_stages)
    if spec.multi_stage and n_steps == 1:  # n_stages ranks; `stage` is a rank
        _check_shape(n_stages, n_microbatches, stage)
        return list(_lowered_ranks(spec, n_stages, n_microbatches)[stage])
    if n_steps != 1:
        raise ValueError(
            f"schedule {spec.name!r} has a flush: one step per list, got n_steps={n_steps}"
        )
    return lower(spec(n_stages, n_microbatches, stage), stage, n_stages)


@functools.lru_cache(maxsize=64)
def _lowered_ranks(
    spec: ScheduleSpec, n_ranks: int, n_microbatches: int
) -> tuple[tuple[Action, ...], ...]:
    """Every rank's lowered list of a multi-stage schedule, its compute lists checked first."""
    placement = placement_of(spec, n_ranks)
    computes = [spec(n_ranks, n_microbatches, r) for r in range(n_ranks)]
    check_ranks(computes, placement, n_microbatches)
    return tuple(tuple(actions) for actions in lower_ranks(computes, placement))


def in_flight(actions: Sequence[Action]) -> int:
    """Largest number of micro-batches whose forward ran and whose backward has not ended.

    A split backward ends with its BACKWARD_WEIGHT: the graph is kept until then.
    """
    live = peak = 0
    for action in actions:
        if action.op is Op.FORWARD:
            live += 1
            peak = max(peak, live)
        elif action.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
            live -= 1
    return peak


def validate(schedule: ScheduleLike, n_stages: int, n_microbatches: int, n_steps: int = 1) -> None:
    """Raise `ScheduleError` unless every stage's lowered list is correct and deadlock-free.

    Checks: each micro-batch is forwarded and back-propagated exactly once per stage, its
    forward first (back-propagated: one BACKWARD, or one BACKWARD_INPUT and after it one
    BACKWARD_WEIGHT); one optimizer step after the last backward (a stream: OPTIMIZER_STEP(t)
    after step t's last backward and before the stage's first forward of step t + 2, so two
    weight versions suffice: `pipeline.pure.two_bw.check_2bw`); every send has the matching
    receive on the peer (and no receive waits for a send that never comes); executing all
    stages with non-blocking sends and receives and blocking compute never deadlocks; and
    between two stages, in each direction, the receives are posted in the order of the
    sends (`pipeline.pure.wire_order`: NCCL matches messages by order, not by tag).

    A schedule with several stages per rank: `n_stages` ranks, and the same checks per
    stage, in micro-batch order, plus each hand-over inside a rank after its producer
    (`pipeline.pure.multi_stage.check_ranks`) and `check_order` on the ranks' lists.
    """
    if is_multi_stage(schedule):  # n_stages ranks (`pipeline.pure.multi_stage`)
        lists = [
            stage_actions(schedule, n_stages, n_microbatches, r, n_steps) for r in range(n_stages)
        ]
        check_order(lists, placement=placement_of(schedule, n_stages))
        return
    lists = [stage_actions(schedule, n_stages, n_microbatches, s, n_steps) for s in range(n_stages)]
    for s, actions in enumerate(lists):
        check_stage(actions, s, n_microbatches * n_steps)
        if n_steps > 1 or is_stream(schedule):
            check_versions(actions, s, n_microbatches, n_steps)
    check_order(lists)  # executes the lists: order, sizes, no stall (`pipeline.pure.wire_order`)
