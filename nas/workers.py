"""Several local workers on one study, started by the harness itself (`study.workers`).

A small candidate trains fastest on one stage process per core, so the machine trains several
candidates side by side: W workers, each its own Python process with its own stage processes
on its own cores, all asking the same Optuna storage for trials (as the README's "Many
machines" workers do, here started for the user). The retraining after the search is shared
the same way: its (model, seed) runs are claimed one by one (`nas.retrain_claims`).

    caller (the CLI: one progress bar, one report)
      │ 1. opens the study once (seeds enqueued), so workers do not race to create it
      │ 2. writes the job (its stage, the settings with the shape chosen, the models to
      │    retrain) to <run>/workers/<stage>.pkl
      ├─ python -m nas.workers <job.pkl> 0   cores 0..k-1   run folder <run>/worker-0
      ├─ python -m nas.workers <job.pkl> 1   cores k..2k-1  run folder <run>/worker-1
      │ 3. while they run: one bar counts the finished trials (or recorded runs) on disk
      └ 4. each worker writes its result (or its error) to <run>/workers/<stage>-<k>.pkl;
           the caller merges them; the first error of a worker is raised once all ended

A worker that dies leaves its trial RUNNING: the others fail it and retry it (the heartbeat,
`nas.storage`), so the study goes on and nothing recorded is lost; a run it retrained and
recorded is kept, one it claimed and left is trained by the next retraining.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from nas import job_log, retrain, trials
from nas.progress import progress_bars
from nas.retrain_results import Model, RetrainResult
from nas.settings import NasSettings
from nas.study import StudyResult, run_study

__all__ = ["Stage", "main", "retrain_on_workers", "run_workers"]

logger = logging.getLogger(__name__)
_POLL_S = 1.0
_Result = TypeVar("_Result", StudyResult, RetrainResult)


class Stage(enum.Enum):
    """What a worker runs."""

    SEARCH = "search"  # `run_study` as worker k
    RETRAIN = "retrain"  # `retrain_models` as worker k


@dataclasses.dataclass(frozen=True)
class _Job:
    stage: Stage
    settings: NasSettings
    models: tuple[Model, ...] = ()  # what to retrain


def run_workers(settings: NasSettings, n_workers: int, cores_each: int) -> StudyResult:
    """Run the study on `n_workers` local workers of `cores_each` cores (module doc)."""
    study = trials.open_study(settings)  # 1.
    results = _run(
        _Job(Stage.SEARCH, settings),
        n_workers,
        cores_each,
        (f"study {settings.study.name}", settings.study.n_trials, lambda: trials.finished(study)),
        StudyResult,
    )
    logger.debug("study %s: %d workers ended", settings.study.name, len(results))
    return StudyResult(
        settings.study.name,
        settings.storage_url,
        max(r.finished for r in results),
        sum(r.restarts for r in results),
        tuple(d for r in results for d in r.run_dirs),
    )


def retrain_on_workers(
    settings: NasSettings, models: Sequence[Model], n_workers: int, cores_each: int
) -> RetrainResult:
    """Retrain `models` on `n_workers` local workers of `cores_each` cores, each run trained
    by one of them (module doc). Every worker ends with every run; the caller returns one
    worker's result with the exports and tracked runs of all."""
    total = len(models) * len(settings.retrain.seeds)
    results = _run(
        _Job(Stage.RETRAIN, settings, tuple(models)),
        n_workers,
        cores_each,
        ("retrain", total, lambda: retrain.recorded_runs(settings, models)),
        RetrainResult,
    )
    exported = {name: folder for r in results for name, folder in r.exported.items()}
    return dataclasses.replace(
        results[0], exported=exported, run_dirs=tuple(d for r in results for d in r.run_dirs)
    )


def _run(
    job: _Job,
    n_workers: int,
    cores_each: int,
    bar: tuple[str, int, Callable[[], int]],
    result_type: type[_Result],
) -> list[_Result]:
    """Steps 2-4: start the workers, show `bar` (description, total, how many are done) while
    they run, and return their results (`result_type`) in worker order."""
    folder = Path(job.settings.output_dir) / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    job_path = folder / f"{job.stage.value}.pkl"
    job_path.write_bytes(pickle.dumps(job))  # 2.
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    procs = []
    for k in range(n_workers):
        (folder / f"{job.stage.value}-{k}.pkl").unlink(missing_ok=True)  # an earlier round's
        mine = available[k * cores_each : (k + 1) * cores_each]
        command = [sys.executable, "-m", "nas.workers", str(job_path), str(k)]
        command += [",".join(map(str, mine))] if len(mine) == cores_each else []
        procs.append(subprocess.Popen(command))
    logger.info("%s: %d workers started", bar[0], n_workers)
    description, total, done = bar
    with progress_bars() as progress:  # 3.
        task = progress.add_task(description, total=total)
        while any(p.poll() is None for p in procs):
            _show(progress.update, task, done)
            time.sleep(_POLL_S)
        _show(progress.update, task, done)
    return _outcomes(job, folder, procs, result_type)  # 4.


def _show(update: Callable[..., None], task: object, done: Callable[[], int]) -> None:
    """The finished count on the bar; a storage that does not answer (the workers wait it
    out or stop, naming it) leaves the bar as it was."""
    try:
        update(task, completed=done())
    except Exception as error:
        logger.debug("bar not updated: %s", error)


def _outcomes(
    job: _Job, folder: Path, procs: list[subprocess.Popen[bytes]], result_type: type[_Result]
) -> list[_Result]:
    results: list[_Result] = []
    errors: list[BaseException] = []
    for k, proc in enumerate(procs):
        path = folder / f"{job.stage.value}-{k}.pkl"
        if not path.exists():
            errors.append(RuntimeError(f"worker {k} ended with exit code {proc.returncode}"))
            continue
        outcome = pickle.loads(path.read_bytes())
        if isinstance(outcome, result_type):
            results.append(outcome)
        else:
            errors.append(outcome)
    if errors:
        for error in errors[1:]:
            logger.error("%s: another worker failed too: %s", job.stage.value, error)
        raise errors[0]
    return results


def _worker(job_path: Path, number: int, cpus: list[int]) -> None:
    """One worker: its own run folder, cores and stage processes; no bars (the caller's)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # the stage processes inherit it
    job: _Job = pickle.loads(job_path.read_bytes())
    settings = dataclasses.replace(
        job.settings, output_dir=str(Path(job.settings.output_dir) / f"worker-{number}")
    )
    job_log.attach()
    outcome: StudyResult | RetrainResult | BaseException
    try:
        if job.stage is Stage.SEARCH:
            outcome = run_study(settings, progress=False, worker=number)
        else:
            outcome = retrain.retrain_models(settings, job.models, progress=False, worker=number)
    except Exception as error:  # handed to the caller, which raises it
        outcome = error
    try:
        data = pickle.dumps(outcome)
    except Exception:  # an error that does not pickle: its text
        data = pickle.dumps(RuntimeError(f"worker {number}: {outcome}"))
    (job_path.parent / f"{job.stage.value}-{number}.pkl").write_bytes(data)


def main(argv: Sequence[str]) -> None:
    """`python -m nas.workers <job.pkl> <k> [<cpu>,<cpu>...]`: run worker k of the job."""
    _worker(Path(argv[0]), int(argv[1]), [int(c) for c in argv[2].split(",")] if argv[2:] else [])


if __name__ == "__main__":
    # Through the module's import name, so that the job's classes (pickled as
    # `nas.workers._Job`, `nas.workers.Stage`) are the ones the worker compares with.
    from nas import workers

    workers.main(sys.argv[1:])
