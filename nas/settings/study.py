"""`study.*`: the study itself, its storage, its workers, its objectives and its time.

Run by `nas.study.run` (trials, workers, restarts, heartbeats, time limits) on the storage
`nas.storage` opens; `fidelity` and `inherit_steps` are `nas.study.judging`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nas.search.fidelity import Fidelity
from nas.settings.checks import Settings, setting
from nas.settings.constraints import (
    AUTO,
    POSITIVE,
    Distinct,
    Each,
    Flag,
    Integer,
    Number,
    OneOf,
    OrAuto,
    OrNone,
    Text,
    Verified,
    seconds,
    shown,
)
from nas.settings.objectives import direction, objectives
from nas.storage import url as storage_url

__all__ = ["StudySettings"]

_STORAGE_URLS = (
    "use sqlite:///path.db, postgresql://user:password@host:port/database (any SQLAlchemy "
    "URL), grpc://host:port, journal:///path/to/file.log, or null (SQLite under studies_dir)"
)
_NO_LIMIT = Number(0, open_low=True, words="use seconds > 0 or null (no time limit)")


@dataclass
class StudySettings(Settings):
    section: ClassVar[str] = "study"

    name: str = setting("nas", Text())
    n_trials: int = setting(4, POSITIVE)
    # None: SQLite at outputs/studies/<name>.db (nas.storage.url)
    storage: str | None = setting(None, OrNone(Verified(storage_url.kind, _STORAGE_URLS)))
    # how long a database server's (or the gRPC proxy's) outage is waited out, retrying,
    # before the workers stop with an error naming the storage (nas.storage.retrying)
    storage_wait_s: float = setting(
        60.0, seconds("how long a storage server's outage is waited out")
    )
    # local workers training this study's trials side by side, each with its own stage
    # processes on its own cores (`nas.study.workers`); "auto": as many as the chosen shape fits
    # on this machine's cores (`nas.study.shape`)
    workers: int | str = setting(AUTO, OrAuto())
    objectives: tuple[str, ...] = setting(
        ("validation_loss",), Each(Text()), Distinct("names one twice")
    )
    enqueue_seeds: bool = setting(True, Flag())
    inherit_weights: bool = setting(False, Flag())
    # how a child of a trained evolution parent is judged (`nas.search.fidelity`,
    # `nas.study.judging`): "full" trains it from scratch to train.steps; "inherited" starts
    # it from its parent's trained weights (tensor by tensor), trains it `inherit_steps`
    # steps and scores it as the parent's fitness plus its difference from the parent
    # continued those steps on the same batches (`benchmarks/fidelity.py` measures how well
    # that ranks); children without a trained parent train from scratch; weights kept in
    # Optuna's artifact store
    fidelity: str = setting(Fidelity.FULL.value, OneOf(Fidelity.settable()))
    inherit_steps: int = setting(200, POSITIVE)
    # at inherited fidelity, the tensors a child's edit touches start afresh instead of from
    # the parent's (`benchmarks/fidelity.py`: that ranks worse than inheriting them all)
    edited_afresh: bool = setting(False, Flag())
    # at inherited fidelity, a child whose own paired difference, added to its measured
    # parent's fitness, beats the best fitness measured at the full budget, or beats the
    # differences of the `promote_window - 1` children judged before it, is trained again
    # from scratch to the full budget in the same trial, which then records that
    # measurement (its estimate kept as `estimated_<metric>`): estimates chained over
    # generations drift, so this measures the best ones (`nas.study.promotion`)
    promote: bool = setting(True, Flag())
    promote_window: int | None = setting(
        20, OrNone(Integer(2, words="use a whole number >= 2, or null (only past the best)"))
    )
    # a second training seed: a trial measured at the full budget that would lead the study
    # is measured again on it (the leader too, paired), and leads on its mean over both
    # (`nas.study.leading`); never one of `retrain.seeds`; None: one seed, `seed`
    confirm_seed: int | None = setting(None, OrNone(Integer(low=None)))
    # each run of a trial at the full budget (a seed, a promoted child, any trial at
    # fidelity full, a confirmation on `confirm_seed` and the leader's beside it) saves a
    # checkpoint every N steps under <studies_dir>/checkpoints/<name>/trial-<n>/ (n: its
    # first attempt), so that its retry after its worker died goes on from there with its
    # reports (`nas.study.checkpoints`); the folder goes when the trial is recorded; 0 or
    # null: none (a retry trains from scratch)
    checkpoint_every: int | None = setting(
        100,
        OrNone(Integer(0, words="use a step count > 0, or 0 or null for no checkpoints")),
    )
    # stage processes restarted after a death, per study run
    max_restarts: int = setting(2, Integer(0))
    # a trial whose worker died (stage processes, or a heartbeat that stopped) is tried again
    # at most this many times; then it stays failed with its cause and the study goes on
    max_retries: int = setting(2, Integer(0))
    # a trial whose rank 0 recorded no heartbeat for this many seconds (a worker that died or
    # hung, on any machine) is failed by the next worker that asks for a trial and retried;
    # RDB storages only (SQLite, PostgreSQL, MySQL: nas.storage.opening); alike on every
    # worker (each beats every sixth of its grace, 5 s at most)
    heartbeat_grace_s: int = setting(
        30,
        Integer(
            2,
            words="use whole seconds >= 2 (a trial whose heartbeat is silent this long is "
            "failed and asked again)",
        ),
    )
    # no trial starts once this run of the study has lasted `timeout_s` seconds (Optuna's
    # `timeout`: the running trial finishes); None: only `n_trials` ends it
    timeout_s: float | None = setting(None, OrNone(_NO_LIMIT))
    # no trial starts once the study has searched `time_budget_s` seconds: wall-clock time
    # with at least one trial training, over every run (a stopped study resumes with what is
    # left; workers side by side count once); None: no such budget
    time_budget_s: float | None = setting(None, OrNone(_NO_LIMIT))

    def rules(self) -> tuple[str | None, ...]:
        # the task's validation metrics are checked with the task (`NasSettings`)
        return (self._one_way_to_inherit(), self._objectives_known())

    def _one_way_to_inherit(self) -> str | None:
        if self.fidelity == Fidelity.INHERITED and self.inherit_weights:
            return (
                "study.inherit_weights=true trains a child to the full budget from its "
                "parent's weights; study.fidelity=inherited trains it study.inherit_steps "
                "steps from them and scores the difference: choose one"
            )
        return None

    def _objectives_known(self) -> str | None:
        """Objectives a study can measure, a validation metric (the fitness) first."""
        known = objectives()
        if not self.objectives:
            return "study.objectives is empty; valid objectives: " + ", ".join(known)
        for objective in self.objectives:
            if not objective.startswith("validation_") and objective not in known:
                return (
                    f"study.objectives has {shown(objective)}, which is not valid; valid "
                    f"values: {', '.join(known)}"
                )
        if not self.objectives[0].startswith("validation_"):
            return (
                f"study.objectives={shown(self.objectives)} must start with a validation metric "
                "(the fitness, measured at every evaluation); valid first objectives: "
                + ", ".join(o for o in known if o.startswith("validation_"))
            )
        return None

    @property
    def directions(self) -> list[str]:
        return [direction(o) for o in self.objectives]

    @property
    def fitness(self) -> str:
        """The first objective: what pruners, hurdles and evolution compare."""
        return self.objectives[0]
