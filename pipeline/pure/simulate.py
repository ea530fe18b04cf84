"""Replay a schedule on paper: iteration time, bubbles and in-flight memory, no process.

Schedules are data (`pipeline.pure.schedule`), so their timing can be predicted by executing the
lowered action lists against per-stage costs instead of against tensors. The planners use
this to predict a plan's iteration time, and tests use it to check a schedule's shape
(closed forms for bubbles and in-flight micro-batches) without starting anything.

Semantics, one stage at a time in the order of its list:

* FORWARD i / BACKWARD i start when the stage is free and their input has arrived (stage 0's
  forwards and the last stage's backwards need no message), and take the stage's
  forward_s / backward_s;
* a split backward (`zbh1`) divides backward_s: BACKWARD_INPUT i waits like BACKWARD i and
  takes backward_s - weight_s, BACKWARD_WEIGHT i waits for nothing and takes weight_s.
  The split assumed (`stage_costs`): W is half of the backward of every layer the runtime
  splits (kept layers), the rest, and the time recompute or swap adds, is BI's. Half is what
  FLOPs give for matrix products (y = x W: dx = dy W^T and dW = x^T dy cost the same);
* a message arrives link.time(bytes) after the compute that produced it finished; an
  activation has the sender's output_bytes, a gradient the receiver's output_bytes;
* RECV_* / SEND_* take no stage time (non-blocking posts);
* OPTIMIZER_STEP waits for every message the stage sent to arrive, then takes optimizer_s;
  in a stream (`2bw`, n_steps > 1 steps in one list, no flush) it waits for nothing.

A stream's `step_s` is its steady-state time per step: the time between the stages'
(latest) OPTIMIZER_STEP(0) and OPTIMIZER_STEP(T - 2), over T - 2 steps, so neither the
warm-up nor the cool-down counts (T >= 3; fewer: iteration_s / T). For one step it is
iteration_s.

A micro-batch is in flight on a stage from the start of its forward to the end of its
backward (of its BACKWARD_WEIGHT when split); it holds the stage's activation_bytes
meanwhile. `to_chrome_trace` renders the result for Perfetto / chrome://tracing (through
`pipeline.pure.timeline.chrome_trace`).

Several stages per rank (`interleaved_1f1b`, `zbv`: `pipeline.pure.placement`): `stages`
still holds one cost per stage, v * R of them, and the schedule's placement says which rank
runs each. A rank is one executor: it runs its merged list one action at a time, so its
stages share its time; a hand-over between two stages of one rank is ready when its
producer finished (no link time); the optimizer step of a rank takes the sum of its
stages' optimizer_s. Per stage: busy_s, idle_s, peak_in_flight, peak_activation_bytes; per
rank: rank_busy_s, rank_idle_s and peak_rank_activation_bytes, the peak over time of the
activations all its stages hold together (not the sum of their peaks). The bubble fraction
is the ranks' idle share, sum(rank_idle_s) / (R * iteration_s): with one stage per rank, the
stages' (every figure is then what it always was).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.pure.costs import LayerCost, LinkCost, action_effects
from pipeline.pure.partition import bounds, check_sizes
from pipeline.pure.placement import Placement
from pipeline.pure.schedule import (
    Action,
    Op,
    ScheduleError,
    ScheduleLike,
    is_stream,
    placement_of,
    spec_of,
    stage_actions,
    validate,
)
from pipeline.pure.timeline import Span, chrome_trace

__all__ = ["Event", "SimResult", "StageCost", "simulate", "stage_costs", "to_chrome_trace"]


@dataclass(frozen=True)
class StageCost:
    """What one stage costs per micro-batch (and per step, for the optimizer)."""

    forward_s: float
    backward_s: float
    activation_bytes: int = 0  # kept per micro-batch in flight
    output_bytes: int = 0  # sent to the next stage per micro-batch; its gradient is as big
    state_bytes: int = 0  # parameters (all weight copies), gradients, optimizer state
    optimizer_s: float = 0.0
    weight_s: float | None = None  # the part of backward_s a split backward's W takes
    grad_bytes: int | None = None  # the gradient sent back per micro-batch (None: output's)

    def __post_init__(self) -> None:
        for name in (
            "forward_s",
            "backward_s",
            "activation_bytes",
            "output_bytes",
            "state_bytes",
            "optimizer_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.weight_s is not None and not 0 <= self.weight_s <= self.backward_s:
            raise ValueError(
                f"weight_s must be in [0, backward_s={self.backward_s}], got {self.weight_s!r}"
            )

    @property
    def split_weight_s(self) -> float:
        """W's seconds when the backward is split: weight_s, or half of backward_s."""
        return self.backward_s / 2 if self.weight_s is None else self.weight_s


@dataclass(frozen=True)
class Event:
    """One action that took stage time: [start_s, end_s) on `stage`."""

    stage: int
    action: Action
    start_s: float
    end_s: float


@dataclass(frozen=True)
class SimResult:
    schedule: str
    n_microbatches: int
    iteration_s: float  # when the last stage finishes its optimizer step
    busy_s: tuple[float, ...]  # per stage
    idle_s: tuple[float, ...]  # per stage: iteration_s - busy_s
    bubble_fraction: float  # sum(rank_idle_s) / (n_ranks * iteration_s)
    peak_in_flight: tuple[int, ...]  # micro-batches, per stage
    peak_activation_bytes: tuple[int, ...]  # peak_in_flight * activation_bytes, per stage
    events: tuple[Event, ...]  # forwards, backwards and optimizer steps, by start time
    n_steps: int = 1  # steps in the list (a stream schedule's; else 1)
    step_s: float = 0.0  # steady-state seconds per step (module doc)
    ranks: tuple[int, ...] = ()  # the rank of each stage (the schedule's placement)
    rank_busy_s: tuple[float, ...] = ()  # per rank: the sum of its stages' busy_s
    rank_idle_s: tuple[float, ...] = ()  # per rank: iteration_s - rank_busy_s
    peak_rank_activation_bytes: tuple[int, ...] = ()  # per rank: peak of its stages' sum

    @property
    def n_stages(self) -> int:
        return len(self.busy_s)

    @property
    def n_ranks(self) -> int:
        return len(self.rank_busy_s)


def simulate(
    schedule: ScheduleLike,
    stages: Sequence[StageCost],
    n_microbatches: int,
    link: LinkCost | None = None,
    n_steps: int = 1,
) -> SimResult:
    """Execute every rank's lowered action list against `stages` costs (see module doc).

    `stages` holds one cost per stage: for a schedule with v stages per rank, v * R of them,
    placed on the R ranks by the schedule's placement (`placement_of`).
    """
    n_stages = len(stages)
    if n_stages < 1:
        raise ValueError("simulate needs at least one stage")
    placement = _placement(schedule, n_stages)
    n_ranks, last = placement.n_ranks, n_stages - 1
    # malformed or deadlocking: ScheduleError
    validate(schedule, n_ranks, n_microbatches, n_steps)
    link = link or LinkCost.free()
    stream = is_stream(schedule)
    lists = [stage_actions(schedule, n_ranks, n_microbatches, r, n_steps) for r in range(n_ranks)]
    free = [0.0] * n_ranks
    pc = [0] * n_ranks
    arrival: dict[tuple[str, int, int], float] = {}  # (kind, receiving stage, micro-batch) -> s
    finished: dict[tuple[int, Op, int], float] = {}  # (stage, op, micro-batch) -> s
    grad_done: dict[tuple[int, int], float] = {}  # (stage, micro-batch) -> inputs' grad ready
    last_arrival = [0.0] * n_ranks  # latest arrival of a message the rank sent
    live = [0] * n_stages
    peak = [0] * n_stages
    held, peak_held = [0] * n_ranks, [0] * n_ranks  # activation bytes a rank holds
    events: list[Event] = []

    def run(r: int, s: int, action: Action, ready: float, seconds: float) -> None:
        start = max(free[r], ready)
        free[r] = start + seconds
        if action.op is Op.OPTIMIZER_STEP:  # by the step it closes (a flushed list: 0)
            index = action.step if action.step is not None else 0
        else:
            index = action.microbatch_index
        finished[(s, action.op, index)] = free[r]
        events.append(Event(s, action, start, free[r]))

    def hold(r: int, s: int, count: int) -> None:
        live[s] += count
        peak[s] = max(peak[s], live[s])
        held[r] += count * stages[s].activation_bytes
        peak_held[r] = max(peak_held[r], held[r])

    def step(r: int, a: Action) -> bool:
        """Execute `a` on rank r if its input is there; False if it must wait."""
        if a.op is Op.OPTIMIZER_STEP:  # the rank steps all its stages (timed on its first)
            seconds = sum(stages[x].optimizer_s for x in placement.stages_of(r))
            run(r, placement.stages_of(r)[0], a, 0.0 if stream else last_arrival[r], seconds)
            return True
        s, i = a.stage_index, a.microbatch_index
        cost = stages[s]
        if a.op is Op.FORWARD:
            if s == 0:
                ready: float | None = 0.0
            elif not placement.crosses(s - 1):  # a hand-over: its producer ran on this rank
                ready = finished[(s - 1, Op.FORWARD, i)]
            else:
                ready = arrival.get(("act", s, i))
            if ready is None:
                return False
            run(r, s, a, ready, cost.forward_s)
            hold(r, s, +1)
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            if s == last:
                ready = 0.0
            elif not placement.crosses(s):
                ready = grad_done[(s + 1, i)]
            else:
                ready = arrival.get(("grad", s, i))
            if ready is None:
                return False
            split = a.op is Op.BACKWARD_INPUT
            run(r, s, a, ready, cost.backward_s - (cost.split_weight_s if split else 0.0))
            grad_done[(s, i)] = free[r]
            if not split:
                hold(r, s, -1)
        elif a.op is Op.BACKWARD_WEIGHT:
            run(r, s, a, 0.0, cost.split_weight_s)
            hold(r, s, -1)
        elif a.op is Op.SEND_ACT:
            t = finished[(s, Op.FORWARD, i)] + link.time(cost.output_bytes)
            arrival[("act", s + 1, i)] = t
            last_arrival[r] = max(last_arrival[r], t)
        elif a.op is Op.SEND_GRAD:
            sent = stages[s - 1]
            t = grad_done[(s, i)] + link.time(
                sent.output_bytes if sent.grad_bytes is None else sent.grad_bytes
            )
            arrival[("grad", s - 1, i)] = t
            last_arrival[r] = max(last_arrival[r], t)
        return True  # receives are posts: no stage time

    progressed = True
    while progressed:
        progressed = False
        for r in range(n_ranks):
            while pc[r] < len(lists[r]) and step(r, lists[r][pc[r]]):
                pc[r] += 1
                progressed = True
    stuck = {r: lists[r][pc[r]] for r in range(n_ranks) if pc[r] < len(lists[r])}
    if stuck:
        who = "stages" if placement.stages_per_rank == 1 else "ranks"
        raise ScheduleError(f"deadlock: {who} wait forever at {stuck}")

    iteration = max(free)
    busy = [0.0] * n_stages
    for e in events:
        busy[e.stage] += e.end_s - e.start_s
    idle = [iteration - b for b in busy]
    rank_busy = [sum(busy[x] for x in placement.stages_of(r)) for r in range(n_ranks)]
    rank_idle = [iteration - b for b in rank_busy]
    bubble = sum(rank_idle) / (n_ranks * iteration) if iteration > 0 else 0.0
    name = spec_of(schedule).name
    firsts = [placement.stages_of(r)[0] for r in range(n_ranks)]
    updates = (
        [max(finished[(s, Op.OPTIMIZER_STEP, t)] for s in firsts) for t in range(n_steps)]
        if stream
        else []
    )
    step_s = (updates[-2] - updates[0]) / (n_steps - 2) if n_steps >= 3 else iteration / n_steps
    return SimResult(
        schedule=name,
        n_microbatches=n_microbatches,
        iteration_s=iteration,
        busy_s=tuple(busy),
        idle_s=tuple(idle),
        bubble_fraction=bubble,
        peak_in_flight=tuple(peak),
        peak_activation_bytes=tuple(peak[s] * stages[s].activation_bytes for s in range(n_stages)),
        events=tuple(sorted(events, key=lambda e: (e.start_s, e.stage))),
        n_steps=n_steps,
        step_s=step_s,
        ranks=tuple(placement.rank_of(s) for s in range(n_stages)),
        rank_busy_s=tuple(rank_busy),
        rank_idle_s=tuple(rank_idle),
        peak_rank_activation_bytes=tuple(peak_held),
    )


def _placement(schedule: ScheduleLike, n_stages: int) -> Placement:
    """The schedule's placement of `n_stages` stages (a multiple of its stages per rank)."""
    spec = spec_of(schedule)
    v = spec.stages_per_rank
    if n_stages % v:
        raise ValueError(
            f"schedule {spec.name!r} places {v} stages on each rank: the stage "
            f"costs must be a multiple of {v}, got {n_stages}"
        )
    return placement_of(schedule, n_stages // v)


def stage_costs(
    costs: Sequence[LayerCost],
    sizes: Sequence[int],
    actions: Sequence[str] | None = None,
    *,
    host_link: LinkCost | None = None,
    weight_copies: int = 1,
) -> list[StageCost]:
    """Per-stage sums of layer costs for a partition (`sizes`) and per-layer memory actions.

    The time a recompute or a swap adds counts in the backward (where it is paid, on the
    critical path); activation bytes are what each layer keeps under its action
    (`pipeline.pure.costs.action_effects`); weight_copies counts parameters more than once
    (2 for PipeDream-2BW's double-buffered weights). weight_s, what a split backward's W
    takes, is half the backward of the kept layers: the runtime runs a recomputed or
    swapped layer's whole backward in BI (`pipeline.local.backward`).
    """
    sizes = check_sizes(sizes, len(costs), len(sizes))
    effects = action_effects(costs, actions, host_link)
    result = []
    for start, stop in bounds(sizes):
        layers = costs[start:stop]
        added = sum(effects[i][0] for i in range(start, stop))
        kept = [c for i, c in enumerate(layers, start) if actions is None or actions[i] == "keep"]
        result.append(
            StageCost(
                forward_s=sum(c.forward_s for c in layers),
                backward_s=sum(c.backward_s for c in layers) + added,
                weight_s=sum(c.backward_s for c in kept) / 2,
                activation_bytes=sum(effects[i][1] for i in range(start, stop)),
                output_bytes=layers[-1].output_bytes,
                state_bytes=sum(
                    weight_copies * c.param_bytes + c.grad_bytes + c.optimizer_bytes for c in layers
                ),
            )
        )
    return result


_CATEGORY = {
    Op.FORWARD: "forward",
    Op.BACKWARD: "backward",
    Op.BACKWARD_INPUT: "backward",
    Op.BACKWARD_WEIGHT: "weight",
    Op.OPTIMIZER_STEP: "optimizer",
}


def to_chrome_trace(result: SimResult, title: str = "simulated") -> dict[str, Any]:
    """`pipeline.pure.timeline.chrome_trace` of the simulated step: one row per stage, one
    "X" event per forward ("F3"), backward ("B3"; split: "BI3" and "W3") and optimizer step,
    categories "forward", "backward", "weight", "optimizer"; the schedule, micro-batches,
    iteration time and bubble fraction in "otherData". Write it with `json.dump` and open it in https://ui.perfetto.dev.
    With several stages per rank, the rows are grouped by rank (one process per rank, its
    stages' rows inside; a rank's optimizer step on its first stage's row).
    """
    several = len(set(result.ranks)) < result.n_stages
    spans = [
        Span(
            e.stage,
            e.action.label,
            e.start_s,
            e.end_s,
            _CATEGORY.get(e.action.op, "other"),
            result.ranks[e.stage] if several else -1,
        )
        for e in result.events
    ]
    other = {
        "schedule": result.schedule,
        "n_microbatches": result.n_microbatches,
        "iteration_s": result.iteration_s,
        "bubble_fraction": result.bubble_fraction,
    }
    return chrome_trace(spans, title, other)
