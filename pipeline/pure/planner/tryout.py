"""Plans chosen among measured alternatives, where the cost model cannot tell them apart.

A plan's predicted iteration is off by the cost model's error: its layers were profiled
alone and run in the pipeline beside their neighbours, and the simulator idealises the
waits. Where the best plans are predicted within that error of each other, the model cannot
rank them and a few measured steps can (a language model on 2 ranks: ZB-V predicted at
1.98 s an iteration ran 2.14 s, while 1F1B, ranked second, runs 1.83 s). Numbered:

    1. `PredictionErrors`: what the model's predictions were worth on this machine. Every
       plan that ran records its measured / predicted iteration, per schedule (the last
       `KEEP`). `corrected(plan)` scales a prediction by its schedule's median ratio (a
       schedule whose plans run 8% slower than predicted is predicted 8% slower from then
       on); `error` is how far apart two corrected predictions must be to rank them: the
       largest distance of a ratio from its schedule's median, at least `FLOOR`, and
       `UNKNOWN` while fewer than `LEARNED` plans ran
    2. `contenders(plans, errors, most)`: the plans in order of corrected prediction, those
       within (1 + error) of the best, at most `most` of them, the best first
    3. `Tryout`: the pipeline runs them in turn, `rounds` times over (A B C A B C), each
       visit `warmup` steps (not measured: its build, first allocations) and then `steps`
       measured steps; a contender's measurement is the median of all its measured steps,
       so a machine that slows for a while weighs on every contender, not on the one that
       ran then (a language model at 8 micro-batches: ZB-H1 measured 1.22 s in one visit,
       1.09 s when timed over rounds). After the least rounds, while the fastest measured
       has not beaten another in every round both ran (a round's visits follow one another,
       so a slow spell tends to weigh on them alike: paired, as a sign test), another
       round visits it and those only, up to `most_rounds` (a language model at 4
       micro-batches: three plans 5% apart, on a machine whose steps spread 35% from one
       visit to the next). Then the fastest measured is kept (switched back to if another
       ran last), and each one tried is what `PredictionErrors.learn` takes
    4. `rivals(in_force, others, error, most)`: at the correction of a plan from measured
       costs, the other plans from the same costs that the model cannot tell from the plan
       in force, or predicts faster: the other schedules' plans, and the plan in force's
       schedule on the cuts one layer from its own (`neighbouring_cuts`); with the plan in
       force first (it runs now), they are a `Tryout`'s contenders. The plan that runs is
       measured, not predicted: a plan kept on the first step's profile may be slower than
       another schedule's plan from what its stages measured (a language model at 8
       micro-batches: interleaved 1F1B kept at 1.05 s an iteration while 1F1B ran 0.94 s),
       and a cut one layer over may run faster than the measured costs predict (the same
       model at 4 micro-batches: ZB-H1 kept on [7, 3] ran 0.90 s an iteration and [8, 2]
       0.82 s, where its slower stage's measured costs sum 6% higher). Their error is not
       what the cache learned of the profile's predictions: `CHALLENGE_ERROR` at least, and
       at least how far the plan in force ran from its own prediction from those costs
       (`challenge_error`: a language model at 8 micro-batches, interleaved 1F1B predicted
       at 0.84 s ran 1.01 s, so plans 10-20% behind it by prediction were not told apart).
       The prediction errs alike for plans of one schedule and differently between
       schedules, so the places go first to each schedule's fastest plan, then to the
       other cuts

Pure: plans and seconds in, decisions out. `pipeline.distributed.tryout` runs it.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.pure.planner.base import Plan

__all__ = [
    "CHALLENGE_ERROR",
    "FLOOR",
    "KEEP",
    "LEARNED",
    "UNKNOWN",
    "Contender",
    "Move",
    "PredictionErrors",
    "Tryout",
    "challenge_error",
    "contenders",
    "neighbouring_cuts",
    "rivals",
]

KEEP = 32  # ratios kept per schedule, newest last
LEARNED = 2  # plans measured before the model's error is its own
FLOOR = 0.03  # the least error: a few per cent is a step's own noise
UNKNOWN = 0.15  # the error assumed before anything was measured
CHALLENGE_ERROR = 0.10  # the least error of predictions from measured costs (4.)


class PredictionErrors:
    """Measured / predicted iteration of the plans that ran, per schedule (1.)."""

    def __init__(self, ratios: Mapping[str, Sequence[float]] | None = None) -> None:
        self._ratios: dict[str, list[float]] = {
            name: [float(r) for r in values][-KEEP:] for name, values in (ratios or {}).items()
        }

    def learn(self, plan: Plan, measured_s: float) -> None:
        """`plan` ran at `measured_s` seconds an iteration."""
        if plan.predicted_iteration_s <= 0 or not math.isfinite(measured_s) or measured_s <= 0:
            return
        ratios = self._ratios.setdefault(plan.schedule, [])
        ratios.append(measured_s / plan.predicted_iteration_s)
        del ratios[:-KEEP]

    def bias(self, schedule: str) -> float:
        """The median measured / predicted of `schedule`'s plans (1.0: none measured)."""
        ratios = self._ratios.get(schedule)
        return statistics.median(ratios) if ratios else 1.0

    def corrected(self, plan: Plan) -> float:
        """`plan`'s predicted iteration, corrected by its schedule's bias."""
        return plan.predicted_iteration_s * self.bias(plan.schedule)

    @property
    def error(self) -> float:
        """How far apart (as a fraction) two corrected predictions must be to rank them."""
        spread = [
            abs(ratio / self.bias(name) - 1)
            for name, ratios in self._ratios.items()
            for ratio in ratios
        ]
        if len(spread) < LEARNED:
            return UNKNOWN
        return max(FLOOR, max(spread))

    def to_dict(self) -> dict[str, list[float]]:
        return {name: list(ratios) for name, ratios in self._ratios.items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[float]]) -> PredictionErrors:
        return cls(data)


@dataclass(frozen=True)
class Contender:
    """A plan tried by the `Tryout`, with its corrected prediction."""

    plan: Plan
    corrected_s: float

    @property
    def schedule(self) -> str:
        return self.plan.schedule


def contenders(plans: Sequence[Plan], errors: PredictionErrors, most: int) -> list[Contender]:
    """The plans the model cannot tell from the best (2.), the best first."""
    if most < 1:
        raise ValueError(f"most must be >= 1, got {most!r}")
    ranked = sorted((Contender(p, errors.corrected(p)) for p in plans), key=lambda c: c.corrected_s)
    if not ranked:
        return []
    limit = ranked[0].corrected_s * (1 + errors.error)
    return [c for c in ranked if c.corrected_s <= limit][:most]


def neighbouring_cuts(sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """The cuts one layer from `sizes`: each boundary between two neighbouring stages moved
    by one layer, either way, no stage left empty; boundary by boundary, the later stage's
    first layer moved earlier first."""
    cuts = []
    for i in range(len(sizes) - 1):
        for moved in (1, -1):  # stage i + 1's first layer to stage i; stage i's last on
            cut = list(sizes)
            cut[i], cut[i + 1] = cut[i] + moved, cut[i + 1] - moved
            if min(cut[i], cut[i + 1]) >= 1:
                cuts.append(tuple(cut))
    return cuts


def challenge_error(learned: float, iteration_s: float, predicted_s: float) -> float:
    """The error within which the correction's rivals are tried (4.): `CHALLENGE_ERROR`, the
    cache's `learned` error, and how far the plan in force ran (`iteration_s` an iteration,
    measured) from its `predicted_s` from the measured costs, whichever is largest (a plan
    not measured or not predicted: the other two)."""
    if predicted_s <= 0 or not math.isfinite(iteration_s) or iteration_s <= 0:
        return max(CHALLENGE_ERROR, learned)
    return max(CHALLENGE_ERROR, learned, abs(iteration_s / predicted_s - 1))


def rivals(in_force: Plan, others: Sequence[Plan], error: float, most: int) -> list[Contender]:
    """The plan in force and the `others` (plans predicted from the same measured costs;
    one with the plan in force's schedule and cut is left out: it is the plan in force)
    within `error` of the fastest prediction of them all, at most `most` in all (4.): the
    plan in force first, then the others fastest first, the places going first to each
    other schedule's fastest, then to the rest (the plan in force's schedule is in already);
    [] when none of the others is close enough to try. One set of costs, so no schedule's
    bias is applied."""
    if most < 1:
        raise ValueError(f"most must be >= 1, got {most!r}")
    if error < 0:
        raise ValueError(f"error must be >= 0, got {error!r}")
    ranked = sorted(
        (p for p in others if (p.schedule, p.sizes) != (in_force.schedule, in_force.sizes)),
        key=lambda p: p.predicted_iteration_s,
    )
    best = min([in_force.predicted_iteration_s, *(p.predicted_iteration_s for p in ranked)])
    close = [p for p in ranked if p.predicted_iteration_s <= best * (1 + error)]
    leads: list[Plan] = []  # each other schedule's fastest
    rest: list[Plan] = []
    schedules = {in_force.schedule}
    for p in close:
        (rest if p.schedule in schedules else leads).append(p)
        schedules.add(p.schedule)
    chosen = sorted([*leads, *rest][: most - 1], key=lambda p: p.predicted_iteration_s)
    if not chosen:
        return []
    return [Contender(p, p.predicted_iteration_s) for p in (in_force, *chosen)]


class Move(enum.Enum):
    """What the pipeline does after a step of a `Tryout` (3.)."""

    STAY = "stay"  # go on with the plan in force
    SWITCH = "switch"  # switch to `Tryout.current`, the next one to try
    KEEP = "keep"  # over: `Tryout.current` is kept (switched back to if another ran last)


@dataclass
class _Tried:
    contender: Contender
    visits: dict[int, list[float]] = field(default_factory=dict)  # round -> measured steps

    @property
    def seconds(self) -> list[float]:
        return [s for steps in self.visits.values() for s in steps]

    def visit_s(self, round_: int) -> float:
        """The median of its measured steps in round `round_` (inf: it did not run then)."""
        steps = self.visits.get(round_)
        return statistics.median(steps) if steps else math.inf


class Tryout:
    """The contenders run in turn; the fastest measured kept (module doc, 3.)."""

    def __init__(
        self,
        tried: Sequence[Contender],
        *,
        warmup: int = 1,
        steps: int = 3,
        rounds: int = 1,
        most_rounds: int | None = None,
    ) -> None:
        if len(tried) < 2:
            raise ValueError(f"a tryout needs at least 2 contenders, got {len(tried)}")
        if warmup < 0 or steps < 1 or rounds < 1:
            raise ValueError(
                f"warmup must be >= 0, steps and rounds >= 1, got {warmup!r}, {steps!r}, {rounds!r}"
            )
        most_rounds = rounds if most_rounds is None else most_rounds
        if most_rounds < rounds:
            raise ValueError(f"most_rounds must be >= rounds ({rounds}), got {most_rounds!r}")
        self._tried = [_Tried(c) for c in tried]
        self._warmup, self._steps = warmup, steps
        self._rounds, self._most_rounds = rounds, most_rounds
        self._round = 1  # the round under way (1-based)
        self._playing = list(range(len(tried)))  # the contenders the round visits, in order
        self._index = 0  # the contender in force (once done: the one kept)
        self._last = 0  # the contender that ran last
        self._seen = 0  # its steps so far, warm-up included
        self._done = False

    @property
    def current(self) -> Contender:
        """The contender in force (after `KEEP`: the one kept)."""
        return self._tried[self._index].contender

    @property
    def ran_last(self) -> Contender:
        """The contender that ran last: the plan in force until the one kept replaces it."""
        return self._tried[self._last].contender

    @property
    def done(self) -> bool:
        return self._done

    @property
    def rounds_run(self) -> int:
        """The rounds begun so far (once done: all it ran)."""
        return self._round

    def stepped(self, seconds: float) -> Move:
        """The plan in force ran one more step in `seconds`: what to do next."""
        if self._done:
            return Move.STAY
        self._seen += 1
        if self._seen <= self._warmup:
            return Move.STAY
        visit = self._tried[self._index].visits.setdefault(self._round, [])
        visit.append(seconds)
        if len(visit) < self._steps:
            return Move.STAY
        following = self._playing.index(self._index) + 1
        if following == len(self._playing):  # the round is over
            if not self._another_round():
                return self._keep()
            self._round += 1
            following = 0
        self._index, self._seen = self._playing[following], 0
        self._last = self._index
        return Move.SWITCH

    def _another_round(self) -> bool:
        """After the least rounds, another (up to the most) while the fastest measured has
        not beaten every other in every round both ran: of it and those (module doc, 3.)."""
        if self._round >= self._most_rounds:
            return False
        if self._round < self._rounds:
            return True
        leader = self._fastest()
        open_ = [
            i
            for i in range(len(self._tried))
            if i == leader or (i in self._playing and not self._beats(leader, i))
        ]
        # the one in force last (a next round never begins with a switch to itself)
        self._playing = sorted(open_, key=lambda i: i == self._index)
        return len(self._playing) > 1

    def _beats(self, leader: int, other: int) -> bool:
        both = [r for r in self._tried[other].visits if r in self._tried[leader].visits]
        return bool(both) and all(
            self._tried[leader].visit_s(r) < self._tried[other].visit_s(r) for r in both
        )

    def _fastest(self) -> int:
        return min(range(len(self._tried)), key=self.measured_s)

    def _keep(self) -> Move:
        self._done = True
        self._last = self._index
        self._index = self._fastest()
        return Move.KEEP

    def measured_s(self, index: int) -> float:
        """Contender `index`'s measurement: the median of its measured steps (inf: none)."""
        seconds = self._tried[index].seconds
        return statistics.median(seconds) if seconds else math.inf

    def results(self) -> list[tuple[Contender, float]]:
        """Every contender with its measurement, in the order tried."""
        return [(t.contender, self.measured_s(i)) for i, t in enumerate(self._tried)]

    def to_dict(self) -> dict[str, Any]:
        """What the tryout event records."""
        return {
            "kept": self.current.schedule if self._done else None,
            "kept_sizes": list(self.current.plan.sizes) if self._done else None,
            "rounds": self._round,
            "tried": [
                {
                    "schedule": c.schedule,
                    "sizes": list(c.plan.sizes),
                    "predicted_iteration_s": c.plan.predicted_iteration_s,
                    "corrected_s": c.corrected_s,
                    "measured_s": None if math.isinf(measured) else measured,
                    "visits_s": [t.visit_s(r) for r in sorted(t.visits)],
                }
                for (c, measured), t in zip(self.results(), self._tried, strict=True)
            ],
        }
