"""Weights & Biases tracking for a NAS study: one run per trial, one run for the study.

optuna-integration's W&B callback is deprecated and logs final values only; the harness
wants each trial's curves (loss, validation, tokens/s, per-stage memory, migrations) and a
study-level view (every trial, the Pareto front). This tracker makes one W&B run per trial
(`reinit="create_new"`, grouped by study, `job_type="trial"`) and one run per study
(`job_type="study"`) that ends with a table of the trials, a table of the Pareto front and,
when the study names two objectives, a picture of the front. The retrain stage's runs join
the group as `job_type="retrain"` (their `start_trial` config says so); a retrain run that
exported its model logs the model's folder as an artifact of type "model" (`log_model`).

Each run says how its metrics summarise (`define_metric`): a trial's history rows carry
`step`, the step metric of every metric (the study run's `trials/*` step by
`trials/ended`); a metric with a direction (`metric_summary`: the directions the caller
declares, a task's metrics as `validation_<metric>`, else the name: losses go down,
accuracy goes up) summarises as its best and its last value, {"min"|"max", "last"}; the
end-of-trial figure of such a metric is written as its "last".

Offline by default: W&B writes each run to `<directory>/wandb/offline-run-*/` and nothing
leaves the machine (W&B's own error reporting is turned off too, unless
WANDB_ERROR_REPORTING is set); `wandb sync <run folders>` uploads later (`sync_command`).
`mode="online"` logs live and needs credentials already configured (WANDB_API_KEY or
`wandb login`): the tracker never prompts for a key, it raises instead. W&B's console
capture and informational messages are off; its warnings and errors still print.

W&B writes through its service process (`wandb-core`), which can die under the study (killed,
out of memory). A call that finds it gone (`_service_lost_errors`) does not end the study:
the tracker warns, tears W&B down (`_lose_service`), and the next run it starts starts a new
service (the study run again too, its counts kept); the runs that were open end incomplete,
and the study's record stays Optuna's storage and the JSON-lines mirror.

wandb is imported when a tracker is created, never when this module is imported, so the
harness imports and runs (`tracker=none`, `tracker=jsonl`) without wandb installed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Concatenate, ParamSpec, get_args

from nas.tracking.base import Metrics, Rows, Summary, TrialEnd, clean_metrics, json_safe
from nas.tracking.lifecycle import LifecycleTracker
from nas.tracking.plots import save_pareto_plot
from nas.tracking.pool_plot import save_pool_plot
from nas.tracking.wandb.values import (
    STEP_METRIC,
    Direction,
    cell,
    columns,
    metric_summary,
    set_last,
    sync_command,
)

__all__ = [
    "MODES",
    "QUIET_SETTINGS",
    "STEP_METRIC",
    "WandbTracker",
    "metric_summary",
    "sync_command",
]

logger = logging.getLogger(__name__)
MODES = ("offline", "online", "disabled")

# W&B settings the tracker applies unless `settings=` overrides them: no console capture,
# no informational output (warnings and errors still print), no system-metrics sampler
# process, no pip freeze or code upload per run.
QUIET_SETTINGS: dict[str, Any] = {
    "console": "off",
    "quiet": True,
    "show_info": False,
    "x_disable_stats": True,
    "x_save_requirements": False,
    "save_code": False,
}


def _service_lost_errors() -> tuple[type[BaseException], ...]:
    """What W&B raises when its service process is gone: the socket's ConnectionError, or
    its mailbox closed (a request made after the loss)."""
    try:
        from wandb.sdk.mailbox import MailboxClosedError
    except ImportError:  # a W&B without it: the socket's error alone
        return (ConnectionError,)
    return (ConnectionError, MailboxClosedError)


_P = ParamSpec("_P")
_Hook = Callable[Concatenate["WandbTracker", _P], None]


def _survives_service_loss(*, retry: bool = False) -> Callable[[_Hook[_P]], _Hook[_P]]:
    """A hook that, when it finds W&B's service gone, loses the service (`_lose_service`)
    instead of raising; with `retry`, it is tried once more, on a new service."""

    def wrap(hook: _Hook[_P]) -> _Hook[_P]:
        @functools.wraps(hook)
        def guarded(self: WandbTracker, *args: _P.args, **kwargs: _P.kwargs) -> None:
            try:
                hook(self, *args, **kwargs)
            except self._service_lost as error:
                self._lose_service(hook.__name__, error)
                if retry:
                    hook(self, *args, **kwargs)

        return guarded

    return wrap


class WandbTracker(LifecycleTracker):
    """Logs a study to W&B: a run per trial and a run for the study (module doc).

    Args:
        project: the W&B project.
        mode: "offline" (default), "online" (needs configured credentials) or "disabled".
        directory: where W&B writes its run folders (`<directory>/wandb/...`).
        entity: the W&B entity (user or team); None = the default one.
        tags: tags for every run (each trial run also gets its end state as a tag).
        study_run: whether to make the study-level run.
        settings: W&B settings overriding `QUIET_SETTINGS` (e.g. {"x_disable_stats": False}).
        teardown: whether `close` also shuts down W&B's service process.
        directions: metric name -> "minimize" / "maximize" (the task's declared directions,
            as `validation_<metric>`), which decide the metrics' summaries (`metric_summary`).

    After a run starts, its folder is in `trial_directories[trial]` / `study_directory`
    and in `run_directories` (all, in order); `sync_command()` uploads them. `run_id` is
    the open trial's W&B run id.
    """

    mirrored: ClassVar[bool] = True  # the harness writes a JSON-lines mirror beside it
    # wandb, and what `wandb.init` imports in every process (its launch inputs: 1.3 s of
    # CPU; the package 1 s more)
    preload: ClassVar[tuple[str, ...]] = ("wandb", "wandb.sdk.launch.inputs.internal")

    def __init__(
        self,
        project: str = "elastic-nas",
        mode: str = "offline",
        directory: str | Path = "outputs",
        entity: str | None = None,
        tags: Sequence[str] = (),
        *,
        study_run: bool = True,
        settings: Mapping[str, Any] | None = None,
        teardown: bool = True,
        directions: Mapping[str, Direction] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown W&B mode {mode!r}; valid modes: {', '.join(MODES)}")
        if isinstance(tags, str):
            raise TypeError("tags must be a sequence of strings, not one string")
        if settings and "mode" in settings:
            raise ValueError("pass the W&B mode as mode=..., not in settings")
        for metric, way in (directions or {}).items():
            if way not in get_args(Direction):
                raise ValueError(
                    f"metric {metric!r} has direction {way!r}; valid: "
                    f"{', '.join(get_args(Direction))}"
                )
        try:
            import wandb
        except ImportError as error:
            raise ImportError(
                "the W&B tracker needs wandb (pip install 'elastic-nas[nas]'); "
                "use tracker=jsonl or tracker=none without it"
            ) from error
        self._wandb: Any = wandb
        self.project = project
        self.mode = mode
        self.directory = Path(directory)
        self.entity = entity
        self.tags = tuple(str(t) for t in tags)
        self.make_study_run = study_run
        self.settings: dict[str, Any] = {**QUIET_SETTINGS, **(settings or {})}
        self.teardown = teardown
        self.directions: dict[str, Direction] = dict(directions or {})
        self.run_directories: list[Path] = []
        self.trial_directories: dict[int, Path] = {}
        self.study_directory: Path | None = None
        self._study_run: Any = None
        self._trial_run: Any = None
        self._events: list[dict[str, Any]] = []
        self._summarised: set[str] = set()  # the open trial's metrics with a defined summary
        self._seen: set[str] = set()  # the open trial's metrics logged so far
        self._ended: dict[str, int] = {"complete": 0, "pruned": 0, "failed": 0}
        self._set_up = False
        self._service = False
        self._service_lost = _service_lost_errors()
        self._study_config: Mapping[str, Any] = {}
        self._study_run_lost = False

    # -- W&B plumbing -------------------------------------------------------------------------
    def _setup(self) -> None:
        """Configure W&B once: quiet output, offline privacy, credentials without a prompt."""
        if self._set_up:
            return
        wandb = self._wandb
        if self.mode == "offline":
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        # The process-wide settings decide what W&B prints (not the per-run ones).
        wandb.setup(settings=wandb.Settings(**{**self.settings, "mode": self.mode}))
        self._service = True  # from here on, close() tears W&B down
        if self.mode == "online" and not wandb.login(prompt=False):
            raise RuntimeError(
                "W&B online mode needs credentials: set WANDB_API_KEY or run `wandb login` "
                "(or use mode='offline' and `wandb sync` later)"
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        self._set_up = True

    def _init(
        self, *, name: str, group: str, job_type: str, config: Mapping[str, Any]
    ) -> tuple[Any, Path | None]:
        self._setup()
        run = self._wandb.init(
            project=self.project,
            entity=self.entity,
            dir=str(self.directory),
            name=name,
            group=group,
            job_type=job_type,
            tags=list(self.tags),
            config=json_safe(config),
            mode=self.mode,
            reinit="create_new",
            settings=self._wandb.Settings(**self.settings),
        )
        sync_dir = getattr(run.settings, "sync_dir", None) if self.mode != "disabled" else None
        directory = Path(sync_dir) if sync_dir else None
        if directory is not None:
            self.run_directories.append(directory)
        return run, directory

    def _lose_service(self, where: str, error: BaseException) -> None:
        """W&B's service process is gone (module doc): the open runs are dropped, W&B torn
        down, so that the next run starts a new service."""
        logger.warning(
            "W&B's service process is gone (%s in %s: %s): the open runs end incomplete, "
            "the next run starts a new service",
            type(error).__name__,
            where,
            error,
        )
        self._study_run_lost = self._study_run_lost or self._study_run is not None
        self._trial_run = self._study_run = None
        with contextlib.suppress(Exception):  # it raises the same loss, having reset W&B
            self._wandb.teardown()
        self._set_up = self._service = False

    def _start_study_run(self, study_name: str) -> None:
        self._study_run, self.study_directory = self._init(
            name=f"{study_name}-study",
            group=study_name,
            job_type="study",
            config=self._study_config,
        )
        self._study_run.define_metric("trials/ended", hidden=True)
        self._study_run.define_metric("trials/*", step_metric="trials/ended")

    def _table(self, rows: Sequence[Mapping[str, Any]]) -> Any:
        names = columns(rows)
        data = [[cell(row.get(c)) for c in names] for row in rows]
        return self._wandb.Table(columns=names, data=data, allow_mixed_types=True)

    # -- the lifecycle (checked by LifecycleTracker) ---------------------------------------------
    def _on_start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        self._study_config, self._study_run_lost = config, False
        if self.make_study_run:
            self._start_study_run(study_name)
        else:
            self._setup()
        self._ended = dict.fromkeys(self._ended, 0)

    @_survives_service_loss(retry=True)
    def _on_start_trial(
        self, number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        if self._study_run_lost and self._study_run is None:  # again, on a new service
            self._start_study_run(str(self._study))
        run_config = {**config, "study": self._study, "trial": number, "params": dict(params)}
        job_type = str(config.get("job_type", "trial"))
        name = str(config.get("run_name", f"trial-{number}"))
        run, directory = self._init(
            name=f"{self._study}-{name}",
            group=str(self._study),
            job_type=job_type,
            config=run_config,
        )
        run.define_metric(STEP_METRIC, hidden=True)
        run.define_metric("*", step_metric=STEP_METRIC)
        self._trial_run = run
        self._events, self._summarised, self._seen = [], set(), set()
        if directory is not None:
            self.trial_directories[number] = directory

    @property
    def run_id(self) -> str | None:
        """The open trial's W&B run id; None outside a trial."""
        return None if self._trial_run is None else str(self._trial_run.id)

    @_survives_service_loss()
    def _on_step(self, step: int, metrics: Metrics) -> None:
        """One history row with `step` in it, flushed at once (so the end-of-trial summary
        comes after every row); a metric seen first gets its summary defined."""
        if self._trial_run is None:  # its service was lost
            return
        row = clean_metrics(metrics)
        for key in row.keys() - self._seen:
            self._seen.add(key)
            summary = metric_summary(key, self.directions)
            if summary is not None and key != STEP_METRIC:
                self._trial_run.define_metric(key, step_metric=STEP_METRIC, summary=summary)
                self._summarised.add(key)
        self._trial_run.log({**row, STEP_METRIC: step}, step=step, commit=True)

    @_survives_service_loss()
    def _on_model(self, name: str, folder: Path, metadata: Mapping[str, Any]) -> None:
        """The folder as an artifact of type "model" of the open run (offline: staged
        beside W&B's data and uploaded by `wandb sync`)."""
        if self._trial_run is None:  # its service was lost
            return
        artifact = self._wandb.Artifact(name, type="model", metadata=json_safe(dict(metadata)))
        artifact.add_dir(str(folder))
        self._trial_run.log_artifact(artifact)

    def _on_event(self, step: int, event: Mapping[str, Any]) -> None:
        """Kept and written at the end of the trial as the table `events` (in the summary,
        so the step history holds step metrics only)."""
        self._events.append({"step": step, **json_safe(dict(event))})

    @_survives_service_loss()
    def _on_end_trial(self, state: TrialEnd, summary: Summary, error: str | None) -> None:
        self._ended[state.value] += 1
        run = self._trial_run
        if run is not None:
            self._finish_trial_run(run, state, summary, error)
        self._events, self._summarised, self._seen = [], set(), set()
        if self._study_run is not None:
            ended = sum(self._ended.values())
            self._study_run.log(
                {f"trials/{k}": v for k, v in self._ended.items()} | {"trials/ended": ended},
                step=ended,
            )

    def _finish_trial_run(
        self, run: Any, state: TrialEnd, summary: Summary, error: str | None
    ) -> None:
        try:
            text = state.value  # W&B writes an enum by its name
            final: dict[str, Any] = {**json_safe(dict(summary)), "state": text, "error": error}
            if self._events:
                final["events"] = self._table(self._events)
                final["event_count"] = len(self._events)
            summarised = {k: final.pop(k) for k in self._summarised & final.keys()}
            run.summary.update(final)
            for key, value in summarised.items():
                set_last(run, key, value)
            run.tags = (*tuple(run.tags or ()), text)
        finally:
            self._trial_run = None
            run.finish(exit_code=1 if state == TrialEnd.FAILED else 0)

    @_survives_service_loss()
    def _on_end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
        run, self._study_run = self._study_run, None
        if run is None:
            return
        try:
            final: dict[str, Any] = {
                **json_safe(dict(summary)),
                "trials": self._table(trials_table),
                "pareto_front": self._table(pareto_front),
            }
            objectives = summary.get("objectives")
            if (
                isinstance(objectives, Sequence)
                and not isinstance(objectives, str)
                and len(objectives) >= 2
                and self.study_directory is not None
            ):
                x, y = str(objectives[0]), str(objectives[1])
                picture = save_pareto_plot(
                    trials_table, pareto_front, x, y, self.study_directory / "pareto_front.png"
                )
                if picture is not None:
                    final["pareto_plot"] = self._wandb.Image(str(picture))
            if self.study_directory is not None:  # a study on the stage pool: who ran where
                pool = save_pool_plot(trials_table, self.study_directory / "stage_pool.png")
                if pool is not None:
                    final["pool_plot"] = self._wandb.Image(str(pool))
            run.summary.update(final)
        finally:
            run.finish(exit_code=0)

    @_survives_service_loss()
    def _on_close(self) -> None:
        """Finish an unfinished study run (exit code 1) and shut down W&B's service process
        (`teardown=True`)."""
        study_run, self._study_run = self._study_run, None
        try:
            if study_run is not None:
                study_run.finish(exit_code=1)
        finally:
            if self.teardown and self._service:
                self._wandb.teardown()

    def sync_command(self) -> str:
        """`wandb sync` with every run folder this tracker made."""
        return sync_command(self.run_directories)
