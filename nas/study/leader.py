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
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from nas import storage
from nas.errors import HeartbeatError, LeaderError, describe
from nas.progress import progress_bars
from nas.search import ProgressiveDynamicHurdles
from nas.search.lineage import KEY_MUTATED, KEY_PARENT
from nas.settings import NasSettings
from nas.study import inherited
from nas.study.inherited import InheritFrom
from nas.study.tracker_setup import run_directories, study_tracker
from nas.study.trials import (
    DUPLICATE_OF,
    INVALID,
    MODEL_DIGEST,
    OWNER,
    Outcome,
    fail_running,
    finished,
    model_digest,
    model_key,
    open_study,
    param_window,
    remaining,
    sample_architecture,
    seed_architectures,
    time_left,
    trials_table,
)
from nas.tracking.base import TRACKER_RUN_ID, TrialEnd
from search_spaces.architecture import (
    Architecture,
    InvalidArchitecture,
    from_json,
    functional_key,
    summary,
    to_json,
)
from search_spaces.edited import edited_tensors
from search_spaces.evolved_transformer import validate

__all__ = ["MAX_INVALID_IN_A_ROW", "Leader", "LeaderError", "TrialOrder"]

logger = logging.getLogger(__name__)

MAX_INVALID_IN_A_ROW = 1000  # every proposal is outside the window or trained: stop
ORPHANED = "left running by a worker that stopped"  # fail_reason of a dead worker's trial


@dataclass(frozen=True)
class TrialOrder:
    """What every rank needs to train a trial: its number, architecture, evolution parent."""

    number: int
    architecture: str  # JSON (search_spaces.architecture.to_json)
    parent: int | None
    # the tensors the child's edit of its parent touches (`search_spaces.edited`): inheriting
    # from the parent, they start afresh
    edited: tuple[str, ...] = ()
    # study.fidelity=inherited (`nas.study.inherited`): the trained parent it is judged from (None:
    # from scratch), and where rank 0 writes its weights for its own children
    inherit: InheritFrom | None = None
    weights_to: str | None = None


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
        self.settings, self.owner = settings, owner
        self.deadline = deadline  # time.time() after which no trial starts
        self.study = open_study(settings)
        self._fail_orphans()
        self.multi = len(settings.study.objectives) > 1
        self.seeds = {to_json(arch) for arch in seed_architectures(settings).values()}
        self.trained: dict[int, str] = {}  # finished trial number -> its architecture (JSON)
        self.trial: optuna.Trial | None = None
        self.heartbeat: storage.Heartbeat | None = None
        self.deferred: BaseException | None = None  # a logging error between decisions
        self.end: StudyEnd | None = None  # set by close()
        self.tracker = study_tracker(settings)
        self.artifacts, self.weights_dir = None, None  # study.fidelity=inherited's weights
        if settings.study.fidelity == "inherited":
            self.artifacts = inherited.artifact_store(settings)
            self.weights_dir = Path(tempfile.mkdtemp(prefix="nas-weights-"))
        self.progress = progress_bars(show=progress)
        self.bar_study = self.progress.add_task(
            f"study {settings.study.name}",
            total=settings.study.n_trials,
            completed=finished(self.study),
        )
        self.bar_trial = self.progress.add_task("trial", total=settings.train.steps)
        storage.on_wait(self.study, self._storage_waits)  # an outage shows on the study bar
        try:
            self.tracker.start_study(settings.study.name, dataclasses.asdict(settings))
        except Exception:
            self.tracker.close()  # no run is left open
            raise
        self.progress.start()

    # -- decisions -------------------------------------------------------------------------
    def next_trial(self) -> TrialOrder | None:
        """Ask until an architecture comes out; None when the study has enough trials or
        its time is up (this run's `study.timeout_s`, the study's `study.time_budget_s`).

        A proposal outside the space's parameter window (the one rule a sample can still
        break) is failed as invalid, does not count, and the next is asked; so is one whose
        model a complete or pruned trial already trained (the same architecture, or one whose
        blocks differ only in the order of their branches: `functional_key`; same settings, same
        training seed: it would only repeat that trial) or a peer's running trial trains,
        recorded with `duplicate_of`. A sampler that raises while the architecture is
        sampled fails that trial with its cause.

        Before each ask the trials of workers that died or hung are failed and enqueued
        again (`_fail_orphans`): a retry is asked before any new proposal, so a live worker
        takes over a dead peer's trial while the study runs. While a live peer trains, the
        sampler is reseeded (`_out_of_step_with_peers`).
        """
        invalid = 0
        while True:
            self._fail_orphans()  # a peer that died since: its trial is enqueued again
            if not (
                self._left() > 0
                and time.time() < self.deadline
                and time_left(self.study, self.settings)
            ):
                break
            if invalid == MAX_INVALID_IN_A_ROW:
                raise RuntimeError(
                    f"{invalid} proposals in a row fell outside the parameter "
                    f"window {self.settings.search_space.param_window} (x the "
                    f"{self.settings.search_space.window_reference}'s size) or "
                    "repeated a trained architecture"
                )
            self._out_of_step_with_peers()
            # SQLite has no row lock: two workers popping the same enqueued trial at once
            # would both get it, so they take turns (a database server needs no lock)
            with storage.one_check_at_a_time(self.study):
                trial = self.study.ask()
            trial.set_user_attr(OWNER, self.owner)  # first: a crash from here on is found
            try:
                arch = self._sample(trial)
            except InvalidArchitecture as error:
                trial.set_user_attr(INVALID, True)
                self._fail_now(trial, f"InvalidArchitecture: {error}")
                invalid += 1
                continue
            except Exception as error:  # the sampler (or a bug) raised while suggesting
                self._fail_now(trial, f"sampling raised {describe(error)}")
                continue
            key = functional_key(arch)
            twin, verb = self._trained_before(key), "trained"
            if twin is None:
                twin, verb = self._trained_now(key, trial.number), "trains"  # a peer, now
            if twin is not None:
                trial.set_user_attr(INVALID, True)
                trial.set_user_attr(DUPLICATE_OF, twin)
                self._fail_now(trial, f"Duplicate: trial {twin} {verb} this architecture")
                invalid += 1
                continue
            trial.set_user_attr(MODEL_DIGEST, model_digest(key))  # peers see it trains
            return self._begin(trial, to_json(arch), summary(arch))
        return None

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        """A training step between evaluations: no decision; an error waits for the next."""
        self.progress.update(self.bar_trial, completed=step)
        if self.deferred is None:
            try:
                self.tracker.log_step(step, metrics)
            except Exception as error:
                self.deferred = error

    def evaluated(self, step: int, metrics: dict[str, Any]) -> bool:
        """An evaluation: log it, report the fitness and decide whether to prune."""
        self._raise_deferred()
        self.progress.update(self.bar_trial, completed=step)
        self.tracker.log_step(step, metrics)
        value, trial = metrics[self.settings.study.fitness], self.trial
        assert trial is not None, "evaluated() outside a trial"
        if not self.multi:
            trial.report(value, step)
            return bool(trial.should_prune())
        # Optuna 5 refuses report/should_prune with several objectives: the hurdles are
        # applied to the fitness itself, the decision written on the trial, which a failing
        # one ends as pruned
        pruner = self.study.pruner
        if not isinstance(pruner, ProgressiveDynamicHurdles) or step not in pruner.budgets:
            return False
        pruner.record(trial, step, value)
        return not pruner.passes(self.study, step, value, trial=trial)

    def finish(self, number: int, outcome: Outcome) -> None:
        """Record how trial `number` ended; its tracker run ends whatever storage says."""
        trial = self.trial
        assert trial is not None and trial.number == number, (number, trial)
        self.trial = None
        try:
            if self.heartbeat is not None:
                self.heartbeat.stop()
            try:  # an error left by the last steps fails the trial it happened in
                self._raise_deferred()
            except (LeaderError, HeartbeatError) as error:
                outcome = Outcome(TrialEnd.FAILED, outcome.attrs | {"fail_reason": describe(error)})
            self._tell(trial, outcome)
        finally:
            self.tracker.end_trial(outcome.state, outcome.attrs, outcome.attrs.get("fail_reason"))
            self.progress.advance(self.bar_study)

    def close(self, error: BaseException | None = None) -> StudyEnd:
        """End the study run: its summary to the tracker, every tracker run finished.

        Never raises; what fails here is returned in `close_errors` (and, when the study
        already failed with `error`, added to it as a note, so the first error stays first).
        A trial still open stays RUNNING: the caller fails it as interrupted and asks it
        again (`trials.fail_running`). A second call returns the first call's account.
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

        if self.heartbeat is not None:
            attempt("stop the heartbeat", self.heartbeat.stop)
        attempt("stop the progress bars", self.progress.stop)
        attempt("end the study", self._end_study)
        attempt("close the tracker", self.tracker.close)
        if self.weights_dir is not None:  # the study's artifact store keeps what counts
            shutil.rmtree(self.weights_dir, ignore_errors=True)
        count = attempt("count finished trials", lambda: finished(self.study)) or 0
        if error is not None:
            for problem in problems:
                error.add_note(f"while closing the study, also: {problem}")
        self.end = StudyEnd(count, tuple(run_directories(self.tracker)), tuple(problems))
        return self.end

    # -- helpers ---------------------------------------------------------------------------
    def _sample(self, trial: optuna.Trial) -> Any:
        """The trial's architecture. The parameter window is relative to the seed
        Transformer of the space (2 layers per cell of `min_cells`), and the two seed
        architectures are trained whatever the window says: they are the baselines."""
        arch = sample_architecture(trial, self.settings)
        window = param_window(self.settings)
        if window is not None and to_json(arch) not in self.seeds:
            validate(arch, window=window)
        return arch

    def _trained_before(self, key: str) -> int | None:
        """The first complete or pruned trial that trained the model of `functional_key`
        `key` (the same architecture, or one that differs only in branch order), or None."""
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        for stored in self.study.get_trials(deepcopy=False, states=done):
            if stored.number not in self.trained:
                self.trained[stored.number] = model_key(stored, self.settings)
        return min((n for n, a in self.trained.items() if a == key), default=None)

    def _trained_now(self, key: str, asking: int) -> int | None:
        """The first running trial (other than `asking`) that trains the model of `key`:
        a peer's, or None. Two workers that created the study at once may both have
        enqueued the seeds; the second copy is failed here, not trained beside the first."""
        digest = model_digest(key)
        twins = (t.number for t in self._running() if t.user_attrs.get(MODEL_DIGEST) == digest)
        return min((n for n in twins if n != asking), default=None)

    def _begin(self, trial: optuna.Trial, arch_json: str, text: str) -> TrialOrder:
        self.trial = trial
        self.heartbeat = storage.Heartbeat(self.study, trial)
        self.heartbeat.start()
        self.progress.reset(
            self.bar_trial,
            total=self.settings.train.steps,
            description=f"trial {trial.number}: {text[:60]}",
        )
        self.tracker.start_trial(
            trial.number, dict(trial.params), {"architecture": arch_json, "summary": text}
        )
        run_id = self.tracker.run_id  # the trial's W&B run (or mirror line key), for lookups
        if run_id is not None:
            trial.set_user_attr(TRACKER_RUN_ID, run_id)
        stored = self.study.get_trials(deepcopy=False)  # numbers are indices
        attrs = stored[trial.number].system_attrs
        parent = attrs.get(KEY_PARENT)
        edited: tuple[str, ...] = ()
        if parent is not None:
            edit = attrs.get(KEY_MUTATED), stored[parent].params, trial.params
            edited = _edited(*edit, from_json(arch_json))
        if self.weights_dir is None:
            return TrialOrder(trial.number, arch_json, parent, edited)
        source = None
        if parent is not None and self.artifacts is not None:
            source = inherited.parent_of(
                self.study, parent, self.settings, self.artifacts, self.weights_dir
            )
        weights_to = str(inherited.weights_file(self.weights_dir, trial.number))
        return TrialOrder(trial.number, arch_json, parent, edited, source, weights_to)

    def record_control(self, parent: int, metrics: dict[str, float]) -> None:
        """The control of `parent` measured (`nas.study.inherited`): kept for its later children."""
        inherited.record_control(self.study, parent, self.settings.study.inherit_steps, metrics)

    def _tell(self, trial: optuna.Trial, outcome: Outcome) -> None:
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        weights = (
            inherited.weights_file(self.weights_dir, trial.number) if self.weights_dir else None
        )
        if outcome.state == TrialEnd.COMPLETE and weights is not None and weights.exists():
            assert self.artifacts is not None
            inherited.keep_weights(trial, self.artifacts, weights)
        budget = self.settings.pipeline.memory_budget
        if budget is not None and "peak_memory_bytes" in outcome.attrs:
            # feasible when <= 0: the samplers (TPE, NSGA-II, GP) prefer feasible trials
            trial.set_constraint("memory", outcome.attrs["peak_memory_bytes"] - budget)
        state = {
            TrialEnd.COMPLETE: optuna.trial.TrialState.COMPLETE,
            TrialEnd.PRUNED: optuna.trial.TrialState.PRUNED,
            TrialEnd.FAILED: optuna.trial.TrialState.FAIL,
        }[outcome.state]
        complete = outcome.state == TrialEnd.COMPLETE
        self.study.tell(trial, outcome.values if complete else None, state=state)
        if outcome.state == TrialEnd.FAILED:
            logger.warning("trial %d failed: %s", trial.number, outcome.attrs.get("fail_reason"))
        else:
            logger.info("trial %d %s: %s", trial.number, outcome.state, outcome.values)

    def _fail_orphans(self) -> None:
        """Fail the trials of workers that died or hung (this worker's earlier run, or a
        peer: owner gone, heartbeat silent) and enqueue them again (`fail_running`: a read
        of the running trials and their heartbeats; a peer checking at once fails none
        twice)."""
        fail_running(self.study, ORPHANED, max_retries=self.settings.study.max_retries)

    def _out_of_step_with_peers(self) -> None:
        """While another worker trains a trial of this study, reseed the sampler (at random,
        as Optuna does for `n_jobs` > 1) before asking: workers started with one `seed`
        would otherwise propose the same architecture at once. A worker alone stays
        reproducible from `seed`."""
        if any(t.user_attrs.get(OWNER) != self.owner for t in self._running()):
            self.study.sampler.reseed_rng()

    def _left(self) -> int:
        """Trials still to start: `study.n_trials` less the finished ones and those peers
        train now, so that workers on one study stop together at `n_trials` (a peer's trial
        that then fails is asked again by that peer, which goes on asking). A running trial
        of this worker's own (it trains none while it asks) was left by an earlier run of it
        that stopped: the heartbeat fails it, so it does not count here."""
        peers = [t for t in self._running() if t.user_attrs.get(OWNER) != self.owner]
        return remaining(self.study, self.settings.study.n_trials) - len(peers)

    def _running(self) -> list[optuna.trial.FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))

    def _fail_now(self, trial: optuna.Trial, cause: str) -> None:
        trial.set_user_attr("fail_reason", cause)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _storage_waits(self, message: str | None) -> None:
        """The storage is unreachable (`message`: its calls wait and retry, logged by
        `nas.storage.retrying`) or answers again (None): the study bar says which."""
        name = f"study {self.settings.study.name}"
        self.progress.update(self.bar_study, description=f"{name}: {message}" if message else name)

    def _raise_deferred(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.check()
        if self.deferred is not None:
            error, self.deferred = self.deferred, None
            raise LeaderError.of("log a training step", error)

    def _end_study(self) -> None:
        table = trials_table(self.study)
        best = {t.number for t in self.study.best_trials} if finished(self.study) else set()
        front = [row for row in table if row["number"] in best]
        self.tracker.end_study(
            table,
            front,
            {"finished": finished(self.study), "objectives": list(self.settings.study.objectives)},
        )


def _edited(
    name: str | None, parent: dict[str, Any], child: dict[str, Any], architecture: Architecture
) -> tuple[str, ...]:
    """The tensors of the child `architecture` its edit of parameter `name` touches (none
    when it did not edit a parameter both asked, or one the space does not name): they
    start afresh when it inherits its parent's weights."""
    if name is None or name not in parent or name not in child:
        return ()
    try:
        return tuple(edited_tensors(name, parent[name], child[name], architecture))
    except ValueError:
        return ()
