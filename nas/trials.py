"""Rank 0's side of a study: the Optuna study, its trials, the tracker and the progress bars.

`nas.study` runs the same loop on every stage process; only rank 0 holds a `Leader`, which
asks Optuna for trials, samples their architectures, reports intermediate values, decides
pruning, tells results (with the cause of a failure in the trial's user attributes) and
feeds the tracker. The helpers around it (`open_study`, `remaining`, `fail_running`) also
run in the caller, between launches, on the same storage.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from nas import storage
from nas.search import ProgressiveDynamicHurdles, make_pruner, make_sampler
from nas.search.evolution import KEY_PARENT
from nas.settings import NasSettings
from nas.tasks import Task
from nas.tracking import CompositeTracker, Tracker, make_tracker
from search_spaces.architecture import InvalidArchitecture, summary, to_json
from search_spaces.evolved_transformer import (
    ParamWindow,
    evolved_transformer,
    sample,
    seed_params,
    transformer,
)

__all__ = ["Leader", "Outcome", "fail_running", "finished", "open_study", "remaining"]

_DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
         optuna.trial.TrialState.FAIL)  # fmt: skip
INTERRUPTED = "interrupted"  # user attr of a trial failed because its processes died
INVALID = "invalid"  # user attr of a trial whose sampled architecture broke a rule
OWNER = "owner"  # user attr: "<host>:<pid>" of the harness that asked the trial
MAX_INVALID_IN_A_ROW = 1000  # the sampler keeps proposing invalid architectures: stop


@dataclass(frozen=True)
class Outcome:
    """How a trial ended: "complete" (with values), "pruned" or "fail"; what to record."""

    state: str
    attrs: dict[str, Any] = field(default_factory=dict)
    values: list[float] | None = None


def open_study(settings: NasSettings) -> optuna.Study:
    """Create or load the study; a new one gets the seed architectures enqueued first."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # ask/tell keeps its own heartbeat (nas.storage.Heartbeat), which Optuna cannot see
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
    study = optuna.create_study(
        study_name=settings.study.name, storage=storage.make_storage(settings.storage_url),
        load_if_exists=True,
        directions=settings.study.directions,  # type: ignore[arg-type]
        sampler=make_sampler(settings.sampler.name, seed=settings.seed, **settings.sampler.options),
        pruner=make_pruner(settings.pruner.name, **settings.pruner.options),
    )  # fmt: skip
    if settings.study.enqueue_seeds and not study.trials:
        for params in _seed_params(settings):
            study.enqueue_trial(params, skip_if_exists=True)
    return study


def _seed_params(settings: NasSettings) -> list[dict[str, Any]]:
    space = settings.search_space
    d, heads, cells = space.d_model[0], space.n_heads, space.min_cells
    n_enc = 0 if space.decoder_only else cells
    # the smallest seeds the space holds: `transformer` counts layers (2 per cell)
    seeds = [transformer(d, n_heads=heads, n_enc=2 * n_enc, n_dec=2 * cells),
             evolved_transformer(d, n_heads=heads, n_enc=n_enc, n_dec=cells)]
    return [seed_params(arch) for arch in seeds]


def counted(trial: optuna.trial.FrozenTrial) -> bool:
    """Does the trial count toward `study.n_trials`? Not if interrupted or never trained.

    Most random points of the Evolved Transformer space break a validity rule (about 1 in
    75 encoder-decoder samples is valid), so a proposal that is invalid is recorded as a
    failed trial with its cause, and another is asked for in its place. A failed trial
    without a `fail_reason` was failed by Optuna's heartbeat check (its worker died).
    """
    attrs = trial.user_attrs
    if trial.state == optuna.trial.TrialState.FAIL and "fail_reason" not in attrs:
        return False
    return trial.state in _DONE and not attrs.get(INTERRUPTED) and not attrs.get(INVALID)


def finished(study: optuna.Study) -> int:
    return sum(counted(t) for t in study.get_trials(deepcopy=False))


def remaining(study: optuna.Study, n_trials: int) -> int:
    return max(0, n_trials - finished(study))


def fail_running(study: optuna.Study, cause: str, owner: str | None = None) -> None:
    """Fail the RUNNING trials asked by `owner` (its stage processes died), or with no
    owner given, those whose owner is gone (`nas.storage`), and enqueue them again."""
    storage.fail_stale(study)
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        asked_by = trial.user_attrs.get(OWNER)
        orphaned = asked_by == owner if owner else not storage.owner_alive(asked_by)
        if not orphaned:
            continue
        try:
            study._storage.set_trial_user_attr(trial._trial_id, "fail_reason", cause)
            study._storage.set_trial_user_attr(trial._trial_id, INTERRUPTED, True)
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:  # its worker finished it meanwhile
            continue
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})


class Leader:
    """Rank 0: asks, reports, prunes, tells and tracks (module docstring)."""

    def __init__(self, settings: NasSettings, task: Task, owner: str) -> None:
        self.settings, self.task, self.owner = settings, task, owner
        self.study = open_study(settings)
        fail_running(self.study, "left running by an earlier run that stopped")
        self.multi = len(settings.study.objectives) > 1
        self.heartbeat: storage.Heartbeat | None = None
        self.tracker = _tracker(settings)
        self.tracker.start_study(settings.study.name, _plain(settings))
        self.trial: optuna.Trial | None = None
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
        self.progress.start()
        n = settings.study.n_trials
        self.bar_study = self.progress.add_task(f"study {settings.study.name}", total=n,
                                                completed=finished(self.study))  # fmt: skip
        self.bar_trial = self.progress.add_task("trial", total=settings.train.steps)

    def next_trial(self) -> tuple[int, str, int | None] | None:
        """Ask until a valid architecture comes out: (trial number, architecture JSON,
        evolution parent or None); None when the study has enough trials."""
        invalid = 0
        while remaining(self.study, self.settings.study.n_trials) > 0:
            if invalid == MAX_INVALID_IN_A_ROW:
                raise RuntimeError(f"the {self.settings.sampler.name} sampler proposed "
                                   f"{invalid} invalid architectures in a row")  # fmt: skip
            trial = self.study.ask()
            trial.set_user_attr(OWNER, self.owner)  # first: a crash from here on is found
            space = self.settings.search_space
            try:
                arch = sample(trial, d_model=space.d_model, decoder_only=bool(space.decoder_only),
                              cells=(space.min_cells, space.max_cells),
                              window=ParamWindow(*space.param_window) if space.param_window
                              else None)  # fmt: skip
            except InvalidArchitecture as error:
                trial.set_user_attr("fail_reason", f"InvalidArchitecture: {error}")
                trial.set_user_attr(INVALID, True)
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
                invalid += 1
                continue
            self.trial = trial
            self.heartbeat = storage.Heartbeat(self.study, trial)
            self.heartbeat.start()
            self.progress.reset(self.bar_trial, total=self.settings.train.steps,
                                description=f"trial {trial.number}: {summary(arch)[:60]}")
            self.tracker.start_trial(trial.number, dict(trial.params),
                                     {"architecture": to_json(arch), "summary": summary(arch)})
            parent = self.study._storage.get_trial_system_attrs(trial._trial_id).get(KEY_PARENT)
            return trial.number, to_json(arch), parent
        return None

    def step(self, step: int, metrics: dict[str, Any]) -> bool:
        """Log one step; at an evaluation, report and say whether to prune."""
        self.progress.update(self.bar_trial, completed=step)
        self.tracker.log_step(step, metrics)
        value, trial = metrics.get("validation_loss"), self.trial
        if value is None or trial is None:
            return False
        if not self.multi:
            trial.report(value, step)
            return bool(trial.should_prune())
        # Optuna 5 refuses report/should_prune with several objectives: the hurdles are
        # applied to the validation loss itself and the trial ends as pruned
        pruner = self.study.pruner
        if not isinstance(pruner, ProgressiveDynamicHurdles) or step not in pruner.budgets:
            return False
        pruner.record(trial, step, value)
        return not pruner.passes(self.study, step, value, trial=trial.number)

    def finish(self, number: int, outcome: Outcome) -> None:
        trial = self.trial
        assert trial is not None and trial.number == number
        if self.heartbeat is not None:
            self.heartbeat.stop()
        for key, value in outcome.attrs.items():
            trial.set_user_attr(key, value)
        budget = self.settings.pipeline.memory_budget
        if budget is not None and "peak_memory_bytes" in outcome.attrs:
            # feasible when <= 0: the samplers (TPE, NSGA-II, GP) prefer feasible trials
            trial.set_constraint("memory", outcome.attrs["peak_memory_bytes"] - budget)
        state = {"complete": optuna.trial.TrialState.COMPLETE,
                 "pruned": optuna.trial.TrialState.PRUNED,
                 "fail": optuna.trial.TrialState.FAIL}[outcome.state]  # fmt: skip
        self.study.tell(trial, outcome.values if outcome.state == "complete" else None,
                        state=state)  # fmt: skip
        state_name = "failed" if outcome.state == "fail" else outcome.state
        self.tracker.end_trial(state_name, outcome.attrs, outcome.attrs.get("fail_reason"))
        self.progress.advance(self.bar_study)
        self.trial = None

    def close(self) -> tuple[int, list[str]]:
        """End the study run: (finished trials, the tracker's run folders)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        self.progress.stop()
        table = [{"number": t.number, "state": t.state.name, "values": t.values,
                  **t.user_attrs} for t in self.study.get_trials(deepcopy=False)]  # fmt: skip
        front = [row for row in table if row["number"] in
                 {t.number for t in self.study.best_trials}] if finished(self.study) else []
        self.tracker.end_study(table, front, {"finished": finished(self.study)})
        dirs = [str(d) for t in getattr(self.tracker, "trackers", [self.tracker])
                for d in getattr(t, "run_directories", [])]  # fmt: skip
        self.tracker.close()
        return finished(self.study), dirs


def _tracker(settings: NasSettings) -> Tracker:
    """The configured tracker; W&B comes with its JSONL mirror in the run folder."""
    name, options = settings.tracker.name, dict(settings.tracker.options)
    if name == "none":
        return make_tracker("none")
    directory = str(Path(settings.output_dir) / "tracking")
    options.setdefault("directory", directory)
    if name == "jsonl":
        return make_tracker("jsonl", **options)
    return CompositeTracker([make_tracker("jsonl", directory=directory),
                             make_tracker("wandb", **options)])


def _plain(settings: NasSettings) -> dict[str, Any]:
    return dataclasses.asdict(settings)
