"""Rank 0's asks: the next trial worth training, or none when the study has enough.

A trial asked of Optuna is trained only if its architecture is one the study should train:

* the space accepts it (`SearchSpace.validate`: inside its parameter window, say); the
  space's seed architectures are trained whatever it says: they are the baselines;
* no complete or pruned trial trained its model (the same architecture, or one whose
  blocks differ only in the order of their branches: `functional_key`; same settings, same
  training seed: it would only repeat that trial), and no peer's running trial trains it.

Any other is failed at once, recorded as `invalid` (with `duplicate_of` for a repeat), does
not count, and the next is asked. So is a trial asked when a peer, asking at the same moment,
took the study's last place (`Asker.surplus`: the trials that count or run, asked before
this one, already make `study.n_trials`). A sampler that raises while the architecture is sampled
fails that trial with its cause. Before each ask the trials of workers that died or hung
are failed and enqueued again (`nas.study.orphans`), so a retry is asked before any new
proposal and a live worker takes over a dead peer's trial while the study runs.
"""

from __future__ import annotations

import datetime
import time
from enum import Enum

import optuna

from nas import storage
from nas.errors import describe
from nas.settings import NasSettings
from nas.study.orphans import ORPHANED, fail_running
from nas.study.space import seed_models
from nas.study.trials import (
    DUPLICATE_OF,
    INVALID,
    MODEL_DIGEST,
    OWNER,
    counted,
    model_digest,
    remaining,
    time_left,
)
from search_spaces import SearchSpace
from search_spaces.architecture import Architecture, InvalidArchitecture, functional_key, to_json

__all__ = ["MAX_INVALID_IN_A_ROW", "Asker", "TrainedModels"]

MAX_INVALID_IN_A_ROW = 1000  # every proposal is refused by the space or trained: stop


class _Refused(Enum):
    """Why an asked trial is not trained: refused (counts toward the limit in a row), or
    its sampling raised."""

    INVALID = "invalid"
    SAMPLING_FAILED = "sampling failed"


def running_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))


def _asked(trial: optuna.trial.FrozenTrial) -> tuple[datetime.datetime, int]:
    """When a running trial was asked, then its number: the order in which peers' asks count."""
    assert trial.datetime_start is not None, "a running trial has started"
    return trial.datetime_start, trial.number


class TrainedModels:
    """Which trial trained, or trains, a model (`functional_key`): the stored trials' keys,
    rebuilt from their answers once each."""

    def __init__(self, study: optuna.Study, space: SearchSpace) -> None:
        self._study, self._space = study, space
        self._keys: dict[int, str] = {}  # finished trial number -> its model's key

    def trained_before(self, key: str) -> int | None:
        """The first complete or pruned trial that trained the model of `key`, or None."""
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        for stored in self._study.get_trials(deepcopy=False, states=done):
            if stored.number not in self._keys:
                self._keys[stored.number] = functional_key(self._space.replay(stored.params))
        return min((n for n, k in self._keys.items() if k == key), default=None)

    def trained_now(self, key: str, asking: int) -> int | None:
        """The first running trial (other than `asking`) that trains the model of `key`:
        a peer's, or None. Two workers that created the study at once may both have
        enqueued the seeds; the second copy is failed here, not trained beside the first."""
        digest = model_digest(key)
        running = running_trials(self._study)
        twins = (t.number for t in running if t.user_attrs.get(MODEL_DIGEST) == digest)
        return min((n for n in twins if n != asking), default=None)


class Asker:
    """Asks `study` for trials until one is worth training (module docstring), as `owner`,
    until `deadline` (`time.time()`) or the study has enough."""

    def __init__(
        self,
        settings: NasSettings,
        study: optuna.Study,
        space: SearchSpace,
        owner: str,
        deadline: float,
    ) -> None:
        self._settings, self._study, self._space = settings, study, space
        self.owner, self.deadline = owner, deadline
        self._seeds = {to_json(arch) for arch in seed_models(settings, space).values()}
        self._models = TrainedModels(study, space)

    def next(self) -> tuple[optuna.Trial, Architecture] | None:
        """The next trial to train and its architecture; None when the study has enough
        trials or its time is up (this run's `study.timeout_s`, the study's
        `study.time_budget_s`)."""
        invalid = 0
        while self._wanted():
            if invalid == MAX_INVALID_IN_A_ROW:
                raise RuntimeError(
                    f"{invalid} proposals in a row fell outside {self._space.limits()} or "
                    "repeated a trained architecture"
                )
            trial = self._ask()
            examined = self._examine(trial)
            if isinstance(examined, Architecture):
                return trial, examined
            invalid += examined is _Refused.INVALID
        return None

    def fail_orphans(self) -> None:
        """Fail the trials of workers that died or hung (this worker's earlier run, or a
        peer: owner gone, heartbeat silent) and enqueue them again (`fail_running`: a read
        of the running trials and their heartbeats; a peer checking at once fails none
        twice)."""
        fail_running(self._study, ORPHANED, max_retries=self._settings.study.max_retries)

    def _wanted(self) -> bool:
        """Whether another trial is wanted now (a dead peer's trials enqueued again first)."""
        self.fail_orphans()
        return (
            self.left() > 0
            and time.time() < self.deadline
            and time_left(self._study, self._settings)
        )

    def left(self) -> int:
        """Trials still to start: `study.n_trials` less the finished ones and those peers
        train now, so that workers on one study stop together at `n_trials` (a peer's trial
        that then fails is asked again by that peer, which goes on asking). A running trial
        of this worker's own counts as one to start: asked, it is the one this worker is
        about to train (or, before the ask, one an earlier run of it left: the heartbeat
        fails it). So right after an ask, 1 says it is the study's last to start."""
        return remaining(self._study, self._settings.study.n_trials) - len(self._peers())

    def alone(self) -> bool:
        """Right after an ask: its trial is the study's last to start (`left` is 1) and no
        peer's trial runs, so no other trial will want the machine's stage processes (a
        peer's trial asked before it may still be sizing its candidate, not yet holding
        any: the last must not take them all)."""
        return not self._peers() and remaining(self._study, self._settings.study.n_trials) <= 1

    def _peers(self) -> list[optuna.trial.FrozenTrial]:
        """The peers' running trials."""
        return [t for t in running_trials(self._study) if t.user_attrs.get(OWNER) != self.owner]

    def _ask(self) -> optuna.Trial:
        """A new trial, marked as this worker's. While another worker trains a trial of the
        study, the sampler is reseeded first (at random, as Optuna does for `n_jobs` > 1):
        workers started with one `seed` would otherwise propose the same architecture at
        once. A worker alone stays reproducible from `seed`."""
        if any(t.user_attrs.get(OWNER) != self.owner for t in running_trials(self._study)):
            self._study.sampler.reseed_rng()
        # SQLite has no row lock: two workers popping the same enqueued trial at once would
        # both get it, so they take turns (a database server needs no lock)
        with storage.one_check_at_a_time(self._study):
            trial = self._study.ask()
        trial.set_user_attr(OWNER, self.owner)  # first: a crash from here on is found
        return trial

    def surplus(self, trial: optuna.Trial) -> bool:
        """Whether the study already has `study.n_trials` without `trial`: those that count,
        and peers' running trials asked before it. Two workers that both saw one trial left
        (`left`) before either asked are ordered by when they asked (then by number): the
        later one stands down, so a study never trains more than `n_trials`."""
        stored = self._study.get_trials(deepcopy=False)
        mine = _asked(next(t for t in stored if t.number == trial.number))
        ahead = [
            t
            for t in running_trials(self._study)
            if t.user_attrs.get(OWNER) != self.owner
            and not t.user_attrs.get(INVALID)
            and _asked(t) < mine
        ]
        return sum(counted(t) for t in stored) + len(ahead) >= self._settings.study.n_trials

    def _examine(self, trial: optuna.Trial) -> Architecture | _Refused:
        """The trial's architecture if it is worth training; else the trial is failed with
        its cause (module docstring) and the reason returned."""
        if self.surplus(trial):
            trial.set_user_attr(INVALID, True)
            self._fail_now(trial, "Surplus: peers asked the study's last trials first")
            return _Refused.INVALID
        try:
            arch = self._space.sample(trial)
            if to_json(arch) not in self._seeds:  # the seeds are trained whatever the space says
                self._space.validate(arch)
        except InvalidArchitecture as error:
            trial.set_user_attr(INVALID, True)
            self._fail_now(trial, f"InvalidArchitecture: {error}")
            return _Refused.INVALID
        except Exception as error:  # the sampler (or a bug) raised while suggesting
            self._fail_now(trial, f"sampling raised {describe(error)}")
            return _Refused.SAMPLING_FAILED
        key = functional_key(arch)
        twin, verb = self._models.trained_before(key), "trained"
        if twin is None:
            twin, verb = self._models.trained_now(key, trial.number), "trains"  # a peer, now
        if twin is not None:
            trial.set_user_attr(INVALID, True)
            trial.set_user_attr(DUPLICATE_OF, twin)
            self._fail_now(trial, f"Duplicate: trial {twin} {verb} this architecture")
            return _Refused.INVALID
        trial.set_user_attr(MODEL_DIGEST, model_digest(key))  # peers see it trains
        return arch

    def _fail_now(self, trial: optuna.Trial, cause: str) -> None:
        trial.set_user_attr("fail_reason", cause)
        self._study.tell(trial, state=optuna.trial.TrialState.FAIL)
