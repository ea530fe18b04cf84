"""Rank 0's side of a study: the Optuna study, its trials, the tracker and the progress bars.

Every stage process runs the same study loop (`nas.study.run`); only rank 0 holds a `Leader`,
which makes the decisions the others wait for: which trial (and architecture) comes next,
whether a trial is pruned, and what is recorded when it ends. Each public method is one
such decision, called through `nas.study.run`'s `Decisions`, which hands the result, or the error
that prevented it, to every rank. So a method may raise anything (a locked or vanished
storage, a tracker that fails, a sampler bug) and no rank is left waiting:

    ┌ rank 0 ──────────────────────┐         ┌ ranks 1..S-1 ┐
    │ decision = leader.method()   │         │              │
    │   or LeaderError(cause)      │─bcast──>│ same value / │
    └──────────────────────────────┘         │ same error   │
                                             └──────────────┘

A database server's outage never reaches a decision unless it outlasts
`study.storage_wait_s`: the study's storage waits it out below every call
(`nas.storage.retrying`), and the study bar says so while it waits.

Training steps between two evaluations make no decision: their metrics are logged at once,
and a logging error is kept and raised by the next decision (`evaluated` or `finish`), so
it reaches every rank at the next evaluation. A heartbeat thread that dies is raised there
too. `close` never raises: it finishes every tracker run even when one part fails and
returns what went wrong, so the first error of a study is never replaced by a later one.

The leader is composed of parts that each own their state: the asks (`nas.study.asking`),
the trial training now with its heartbeat (`nas.study.running`), the progress bars
(`nas.study.bars`) and, at inherited fidelity, the trials' weights
(`nas.study.kept_weights.TrialWeights`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import optuna

from nas import storage
from nas.errors import HeartbeatError, LeaderError, describe
from nas.search.fidelity import Fidelity
from nas.search.lineage import KEY_MUTATED, KEY_PARENT
from nas.settings import NasSettings, lower_is_better
from nas.study import judging, leading, promotion, strategies
from nas.study.asking import Asker
from nas.study.bars import StudyBars
from nas.study.judging import InheritFrom
from nas.study.kept_weights import INHERIT_REFUSED, INHERITED_COPY, TrialWeights, WeightsError
from nas.study.opening import open_study
from nas.study.running import RunningTrial
from nas.study.space import architecture_of, configured_space
from nas.study.tracker_setup import run_directories, study_tracker
from nas.study.trials import Outcome, finished, trials_table
from nas.tracking.base import TRACKER_RUN_ID, TrialEnd
from search_spaces.architecture import Architecture, summary, to_json

__all__ = ["Leader", "LeaderError", "StudyEnd", "TrialOrder"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class TrialOrder:
    """What every rank needs to train a trial: its number, architecture, evolution parent."""

    number: int
    architecture: str  # JSON (search_spaces.architecture.to_json)
    parent: int | None
    # the tensors the child's edit of its parent touches (`search_spaces.edited`): inheriting
    # from the parent, they start afresh
    edited: tuple[str, ...] = ()
    # study.fidelity=inherited (`nas.study.judging`): the trained parent it is judged from (None:
    # from scratch), and where rank 0 writes its weights for its own children
    inherit: InheritFrom | None = None
    weights_to: str | None = None
    # study.checkpoint_every: the folder its full-budget training checkpoints into (its
    # first attempt's: a retry goes on from there; `nas.study.checkpoints`)
    checkpoints: str | None = None
    # no other trial is to start after it (`study.n_trials` is reached with it) and no
    # peer's trial runs (`Asker.alone`): the pool lends it the processes no one else will
    # want (`nas.study.pooled`)
    last: bool = False


@dataclass(frozen=True)
class StudyEnd:
    """Rank 0's account of a study run: finished trials, tracker run folders, errors met
    while closing (kept, never raised over the study's own error)."""

    finished: int
    run_dirs: tuple[str, ...]
    close_errors: tuple[str, ...] = ()


class Leader:
    """Rank 0: asks, reports, prunes, tells and tracks (module docstring)."""

    def __init__(
        self,
        settings: NasSettings,
        owner: str,
        deadline: float = math.inf,
        *,
        progress: bool = True,
    ) -> None:
        self.settings = settings
        self.study = open_study(settings)
        self.space = configured_space(settings)
        self.asker = Asker(settings, self.study, self.space, owner, deadline)
        self.asker.fail_orphans()
        self.running: RunningTrial | None = None  # the trial training now
        self.end: StudyEnd | None = None  # set by close()
        self.tracker = study_tracker(settings)
        self.weights = (
            TrialWeights(settings) if settings.study.fidelity == Fidelity.INHERITED else None
        )
        self.bars = StudyBars(
            settings.study.name,
            settings.study.n_trials,
            finished(self.study),
            settings.train.steps,
            show=progress,
        )
        storage.on_wait(self.study, self.bars.storage_waits)  # an outage shows on the study bar
        try:
            self.tracker.start_study(settings.study.name, dataclasses.asdict(settings))
        except Exception:
            self.tracker.close()  # no run is left open
            raise
        self.bars.start()

    @property
    def heartbeat(self) -> storage.Heartbeat | None:
        """The heartbeat of the trial training now (None between trials)."""
        return None if self.running is None else self.running.heartbeat

    # -- decisions -------------------------------------------------------------------------
    def call(self, method: Callable[..., T], *args: Any) -> T:
        """`method(self, *args)`: how `Decisions` has a decision made here."""
        return method(self, *args)

    def next_trial(self) -> TrialOrder | None:
        """The next trial worth training, begun (`nas.study.asking` says which trials are
        failed instead); None when the study has enough trials or its time is up (this
        run's `study.timeout_s`, the study's `study.time_budget_s`)."""
        asked = self.asker.next()
        if asked is None:
            return None
        trial, arch = asked
        order = self._begin(trial, arch)
        return dataclasses.replace(order, last=self.asker.alone())

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        """A training step between evaluations: no decision; an error waits for the next."""
        running = self._current()
        self.bars.trial_at(step)
        running.attempt(lambda: self.tracker.log_step(step, metrics))

    def evaluated(self, step: int, metrics: dict[str, Any]) -> bool:
        """An evaluation: log it, report the fitness and decide whether to prune."""
        running = self._current()
        running.check()
        self.bars.trial_at(step)
        self.tracker.log_step(step, metrics)
        value, trial = metrics[self.settings.study.fitness], running.trial
        if len(self.settings.study.objectives) == 1:
            trial.report(value, step)
            return bool(trial.should_prune())
        return strategies.prune_on_fitness(self.study, trial, step, value)

    def finish(self, number: int, outcome: Outcome) -> None:
        """Record how trial `number` ended; its tracker run ends whatever storage says."""
        running = self._current()
        assert running.number == number, (number, running.number)
        self.running = None
        try:
            running.stop()
            try:  # an error left by the last steps fails the trial it happened in
                running.check()
            except (LeaderError, HeartbeatError) as error:
                outcome = Outcome(TrialEnd.FAILED, outcome.attrs | {"fail_reason": describe(error)})
            self._tell(running.trial, outcome)
            self._forget_checkpoints(number)  # recorded: nothing left to resume
        finally:
            self.tracker.end_trial(outcome.state, outcome.attrs, outcome.attrs.get("fail_reason"))
            self.bars.trial_ends()

    def interrupt(self, number: int, cause: str) -> None:
        """The processes training trial `number` died (on the stage pool: the worker goes
        on): its heartbeat stops and its tracker run ends failed; the trial stays RUNNING
        for `nas.study.orphans.fail_running` to fail and ask again."""
        running = self._current()
        assert running.number == number, (number, running.number)
        self.running = None
        try:
            running.stop()
        finally:
            self.tracker.end_trial(TrialEnd.FAILED, {}, cause)
            self.bars.trial_ends()

    def record_control(self, parent: int, metrics: dict[str, float]) -> None:
        """The control of `parent` measured (`nas.study.judging`): kept for its later children."""
        judging.record_control(self.study, parent, self.settings.study.inherit_steps, metrics)

    def promotes(self, difference: float, parent: int) -> bool:
        """Whether a child of `parent` judged at inherited fidelity, whose paired difference
        on the fitness is `difference`, is trained again in full (`nas.study.promotion`)."""
        study = self.settings.study
        trials = self.study.get_trials(deepcopy=False)
        return promotion.promotes(trials, study.fitness, difference, parent, study.promote_window)

    def challenge(self, value: float) -> leading.Challenge | None:
        """Whether a trial measured at the full budget, its fitness `value` on the study's
        seed, would lead the study (`nas.study.leading`): the leader to pair it with on the
        second seed, or None (it would not lead, or nothing leads yet)."""
        settings, study = self.settings, self.settings.study
        trials, attrs = self.study.get_trials(deepcopy=False), self.study.user_attrs
        best = leading.leader(trials, attrs, settings.seed, study.fitness)
        if best is None or lower_is_better(study.fitness, value) >= leading.standing(
            best, attrs, settings.seed, study.fitness
        ):
            return None
        known = leading.seed_values(best, attrs, settings.seed)
        lacking = study.confirm_seed not in known
        return leading.Challenge(best.number, architecture_of(best, settings) if lacking else None)

    def record_seed_value(self, number: int, seed: int, value: float) -> None:
        """Finished trial `number`'s fitness on `seed`, measured later (`nas.study.leading`)."""
        self.study.set_user_attr(leading.study_attr(number, seed), float(value))

    def close(self, error: BaseException | None = None) -> StudyEnd:
        """End the study run: its summary to the tracker, every tracker run finished.

        Never raises; what fails here is returned in `close_errors` (and, when the study
        already failed with `error`, added to it as a note, so the first error stays first).
        A trial still open stays RUNNING: the caller fails it as interrupted and asks it
        again (`nas.study.orphans.fail_running`). A second call returns the first call's
        account.
        """
        if self.end is not None:
            return self.end
        problems: list[str] = []

        def attempt(what: str, work: Any) -> Any:
            try:
                return work()
            except Exception as failure:
                problems.append(f"{what}: {describe(failure)}")
                return None

        if self.running is not None:
            attempt("stop the heartbeat", self.running.stop)
        attempt("stop the progress bars", self.bars.stop)
        attempt("end the study", self._end_study)
        attempt("close the tracker", self.tracker.close)
        if self.weights is not None:  # the study's artifact store keeps what counts
            self.weights.remove()
        count = attempt("count finished trials", lambda: finished(self.study)) or 0
        if error is not None:
            for problem in problems:
                error.add_note(f"while closing the study, also: {problem}")
        self.end = StudyEnd(count, tuple(run_directories(self.tracker)), tuple(problems))
        return self.end

    # -- helpers ---------------------------------------------------------------------------
    def _current(self) -> RunningTrial:
        assert self.running is not None, "a trial's decision outside a trial"
        return self.running

    def _begin(self, trial: optuna.Trial, arch: Architecture) -> TrialOrder:
        arch_json, text = to_json(arch), summary(arch)
        self.running = RunningTrial(self.study, trial)
        self.bars.trial_begins(trial.number, text)
        self.tracker.start_trial(
            trial.number, dict(trial.params), {"architecture": arch_json, "summary": text}
        )
        run_id = self.tracker.run_id  # the trial's W&B run (or mirror line key), for lookups
        if run_id is not None:
            trial.set_user_attr(TRACKER_RUN_ID, run_id)
        parent, edited = self._lineage(trial, arch)
        checkpoints = self._checkpoints(trial.number)
        if self.weights is None:
            return TrialOrder(trial.number, arch_json, parent, edited, checkpoints=checkpoints)
        self.weights.keep_late(self.study)  # the store may take what it could not before
        source = None
        if parent is not None:
            try:
                source = judging.parent_of(self.study, parent, self.settings, self.weights)
            except WeightsError as error:  # the child trains from scratch, saying why
                logger.warning("trial %d trains from scratch: %s", trial.number, error)
                trial.set_user_attr(INHERIT_REFUSED, str(error))
                self.weights.refused(self.study, error)  # a worker with a copy repairs them
            else:
                if source is None:  # no weights kept: its later children come from others
                    self.weights.pass_over(self.study, parent)
            if source is not None:
                trial.set_user_attr(INHERITED_COPY, self.weights.copy_of(parent))
        weights_to = str(self.weights.file(trial.number))
        return TrialOrder(trial.number, arch_json, parent, edited, source, weights_to, checkpoints)

    def _checkpoints(self, number: int) -> str | None:
        """Where trial `number` and every retry of it keep their checkpoints (None: it
        keeps none, `study.checkpoint_every`)."""
        if not self.settings.study.checkpoint_every:
            return None
        first = storage.first_attempt(self.study.get_trials(deepcopy=False), number).number
        folder = Path(self.settings.studies_dir) / "checkpoints" / self.settings.study.name
        return str(folder / f"trial-{first}")

    def _forget_checkpoints(self, number: int) -> None:
        folder = self._checkpoints(number)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def _lineage(
        self, trial: optuna.Trial, arch: Architecture
    ) -> tuple[int | None, tuple[str, ...]]:
        """The trial's evolution parent (None: not a child) and the tensors of `arch` its
        edit of the parent touches (none when it did not edit a parameter both asked, or
        one the space does not name): they start afresh when it inherits the parent's
        weights."""
        stored = self.study.get_trials(deepcopy=False)  # numbers are indices
        attrs = storage.first_attempt(stored, trial.number).system_attrs  # a retry's too
        parent, name = attrs.get(KEY_PARENT), attrs.get(KEY_MUTATED)
        if parent is None:
            return None, ()
        before, after = stored[parent].params, trial.params
        if name is None or name not in before or name not in after:
            return parent, ()
        try:
            return parent, tuple(self.space.edited_tensors(name, before[name], after[name], arch))
        except ValueError:
            return parent, ()

    def _tell(self, trial: optuna.Trial, outcome: Outcome) -> None:
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        complete = outcome.state == TrialEnd.COMPLETE
        if complete and self.weights is not None:
            self.weights.keep(trial)
        budget = self.settings.pipeline.memory_budget
        if budget is not None and "peak_memory_bytes" in outcome.attrs:
            # feasible when <= 0: the samplers (TPE, NSGA-II, GP) prefer feasible trials
            trial.set_constraint("memory", outcome.attrs["peak_memory_bytes"] - budget)
        state = {
            TrialEnd.COMPLETE: optuna.trial.TrialState.COMPLETE,
            TrialEnd.PRUNED: optuna.trial.TrialState.PRUNED,
            TrialEnd.FAILED: optuna.trial.TrialState.FAIL,
        }[outcome.state]
        self.study.tell(trial, outcome.values if complete else None, state=state)
        if outcome.state == TrialEnd.FAILED:
            logger.warning("trial %d failed: %s", trial.number, outcome.attrs.get("fail_reason"))
        else:
            logger.info("trial %d %s: %s", trial.number, outcome.state, outcome.values)

    def _end_study(self) -> None:
        table = trials_table(self.study)
        best = {t.number for t in self.study.best_trials} if finished(self.study) else set()
        front = [row for row in table if row["number"] in best]
        summary: dict[str, Any] = {
            "finished": finished(self.study),
            "objectives": list(self.settings.study.objectives),
        }
        if self.weights is not None and self.settings.study.promote:  # nas.study.promotion
            trials = self.study.get_trials(deepcopy=False)
            summary["promotion"] = promotion.agreement(
                trials, self.settings.study.fitness
            ).to_dict()
        self.tracker.end_study(table, front, summary)
