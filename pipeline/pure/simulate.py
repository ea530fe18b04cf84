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
    placement_for,
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
    if len(stages) < 1:
        raise ValueError("simulate needs at least one stage")
    placement = placement_for(schedule, len(stages))
    # malformed or deadlocking: ScheduleError
    validate(schedule, placement.n_ranks, n_microbatches, n_steps)
    lists = [
        stage_actions(schedule, placement.n_ranks, n_microbatches, r, n_steps)
        for r in range(placement.n_ranks)
    ]
    replay = _Replay(stages, placement, link or LinkCost.free(), stream=is_stream(schedule))
    replay.run_all(lists)
    return replay.result(spec_of(schedule).name, n_microbatches, n_steps)


class _Replay:
    """The state of one replay: each rank's clock, when each compute finished and each
    message arrives, and the activations each stage and rank holds."""

    def __init__(
        self, stages: Sequence[StageCost], placement: Placement, link: LinkCost, *, stream: bool
    ) -> None:
        n_stages, n_ranks = len(stages), placement.n_ranks
        self.stages, self.placement, self.link, self.stream = stages, placement, link, stream
        self.last = n_stages - 1
        self.free = [0.0] * n_ranks  # when each rank is next free
        self.arrival: dict[tuple[str, int, int], float] = {}  # (kind, receiving stage, mb) -> s
        self.finished: dict[tuple[int, Op, int], float] = {}  # (stage, op, micro-batch) -> s
        self.grad_done: dict[tuple[int, int], float] = {}  # (stage, mb) -> inputs' grad ready
        self.last_arrival = [0.0] * n_ranks  # latest arrival of a message the rank sent
        self.live = [0] * n_stages
        self.peak = [0] * n_stages
        self.held = [0] * n_ranks  # activation bytes a rank holds
        self.peak_held = [0] * n_ranks
        self.events: list[Event] = []

    def run_all(self, lists: Sequence[Sequence[Action]]) -> None:
        """Run the ranks' lists round-robin, each as far as its inputs allow, to the end."""
        pc = [0] * len(lists)
        progressed = True
        while progressed:
            progressed = False
            for r, actions in enumerate(lists):
                while pc[r] < len(actions) and self.step(r, actions[pc[r]]):
                    pc[r] += 1
                    progressed = True
        stuck = {r: lists[r][pc[r]] for r in range(len(lists)) if pc[r] < len(lists[r])}
        if stuck:
            who = "stages" if self.placement.stages_per_rank == 1 else "ranks"
            raise ScheduleError(f"deadlock: {who} wait forever at {stuck}")

    def step(self, r: int, a: Action) -> bool:
        """Execute `a` on rank r if its input is there; False if it must wait."""
        if a.op is Op.OPTIMIZER_STEP:  # the rank steps all its stages (timed on its first)
            own = self.placement.stages_of(r)
            seconds = sum(self.stages[x].optimizer_s for x in own)
            self._run(r, own[0], a, 0.0 if self.stream else self.last_arrival[r], seconds)
            return True
        s, i = a.stage_index, a.microbatch_index
        cost = self.stages[s]
        if a.op is Op.FORWARD:
            ready = self._activation_ready(s, i)
            if ready is None:
                return False
            self._run(r, s, a, ready, cost.forward_s)
            self._hold(r, s, +1)
        elif a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            ready = self._gradient_ready(s, i)
            if ready is None:
                return False
            split = a.op is Op.BACKWARD_INPUT
            self._run(r, s, a, ready, cost.backward_s - (cost.split_weight_s if split else 0.0))
            self.grad_done[(s, i)] = self.free[r]
            if not split:
                self._hold(r, s, -1)
        elif a.op is Op.BACKWARD_WEIGHT:
            self._run(r, s, a, 0.0, cost.split_weight_s)
            self._hold(r, s, -1)
        elif a.op in (Op.SEND_ACT, Op.SEND_GRAD):
            self._send(r, a)
        return True  # receives are posts: no stage time

    def _activation_ready(self, s: int, i: int) -> float | None:
        """When stage s's input of micro-batch i is there (None: not sent yet)."""
        if s == 0:
            return 0.0
        if not self.placement.crosses(s - 1):  # a hand-over: its producer ran on this rank
            return self.finished[(s - 1, Op.FORWARD, i)]
        return self.arrival.get(("act", s, i))

    def _gradient_ready(self, s: int, i: int) -> float | None:
        """When the gradient of stage s's output of micro-batch i is there (None: not sent)."""
        if s == self.last:
            return 0.0
        if not self.placement.crosses(s):
            return self.grad_done[(s + 1, i)]
        return self.arrival.get(("grad", s, i))

    def _send(self, r: int, a: Action) -> None:
        """Record when the message `a` sends arrives at its peer stage."""
        s, i = a.stage_index, a.microbatch_index
        if a.op is Op.SEND_ACT:
            t = self.finished[(s, Op.FORWARD, i)] + self.link.time(self.stages[s].output_bytes)
            self.arrival[("act", s + 1, i)] = t
        else:
            sent = self.stages[s - 1]
            t = self.grad_done[(s, i)] + self.link.time(
                sent.output_bytes if sent.grad_bytes is None else sent.grad_bytes
            )
            self.arrival[("grad", s - 1, i)] = t
        self.last_arrival[r] = max(self.last_arrival[r], t)

    def _run(self, r: int, s: int, action: Action, ready: float, seconds: float) -> None:
        start = max(self.free[r], ready)
        self.free[r] = start + seconds
        if action.op is Op.OPTIMIZER_STEP:  # by the step it closes (a flushed list: 0)
            index = action.step if action.step is not None else 0
        else:
            index = action.microbatch_index
        self.finished[(s, action.op, index)] = self.free[r]
        self.events.append(Event(s, action, start, self.free[r]))

    def _hold(self, r: int, s: int, count: int) -> None:
        self.live[s] += count
        self.peak[s] = max(self.peak[s], self.live[s])
        self.held[r] += count * self.stages[s].activation_bytes
        self.peak_held[r] = max(self.peak_held[r], self.held[r])

    def result(self, name: str, n_microbatches: int, n_steps: int) -> SimResult:
        """The figures of the finished replay (`run_all`)."""
        placement, n_stages, n_ranks = self.placement, len(self.stages), self.placement.n_ranks
        iteration = max(self.free)
        busy = [0.0] * n_stages
        for e in self.events:
            busy[e.stage] += e.end_s - e.start_s
        rank_busy = [sum(busy[x] for x in placement.stages_of(r)) for r in range(n_ranks)]
        rank_idle = [iteration - b for b in rank_busy]
        return SimResult(
            schedule=name,
            n_microbatches=n_microbatches,
            iteration_s=iteration,
            busy_s=tuple(busy),
            idle_s=tuple(iteration - b for b in busy),
            bubble_fraction=sum(rank_idle) / (n_ranks * iteration) if iteration > 0 else 0.0,
            peak_in_flight=tuple(self.peak),
            peak_activation_bytes=tuple(
                self.peak[s] * self.stages[s].activation_bytes for s in range(n_stages)
            ),
            events=tuple(sorted(self.events, key=lambda e: (e.start_s, e.stage))),
            n_steps=n_steps,
            step_s=self._step_s(iteration, n_steps),
            ranks=tuple(placement.rank_of(s) for s in range(n_stages)),
            rank_busy_s=tuple(rank_busy),
            rank_idle_s=tuple(rank_idle),
            peak_rank_activation_bytes=tuple(self.peak_held),
        )

    def _step_s(self, iteration: float, n_steps: int) -> float:
        """A stream's steady-state seconds per step (module doc); else iteration / n_steps."""
        if n_steps < 3:
            return iteration / n_steps
        assert self.stream, "a flushed list holds one step"
        firsts = [self.placement.stages_of(r)[0] for r in range(self.placement.n_ranks)]
        updates = [
            max(self.finished[(s, Op.OPTIMIZER_STEP, t)] for s in firsts) for t in range(n_steps)
        ]
        return (updates[-2] - updates[0]) / (n_steps - 2)


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
