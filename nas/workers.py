"""Several local workers on one study, started by the study itself (`study.workers`).

A small candidate trains fastest on one stage process per core, so the machine trains several
candidates side by side: W workers, each its own Python process with its own stage processes
on its own cores, all asking the same Optuna storage for trials (as the README's "Many
machines" workers do, here started for the user):

    caller (the CLI: one progress bar, one report)
      │ 1. opens the study once (seeds enqueued), so workers do not race to create it
      │ 2. writes the settings (shape chosen) to <run>/workers/settings.pkl
      ├─ python -m nas.workers <settings.pkl> 0   cores 0..k-1   run folder <run>/worker-0
      ├─ python -m nas.workers <settings.pkl> 1   cores k..2k-1  run folder <run>/worker-1
      │ 3. while they run: the study bar counts finished trials from the storage
      └ 4. each worker writes its `StudyResult` (or its error) to <run>/workers/<k>.pkl;
           the caller merges them; the first error of a worker is raised once all ended

A worker that dies leaves its trial RUNNING: the others fail it and retry it (the heartbeat,
`nas.storage`), so the study goes on and nothing recorded is lost.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import optuna
from rich.progress import Progress, TaskID

from nas import job_log, trials
from nas.progress import progress_bars
from nas.settings import NasSettings
from nas.study import StudyResult, run_study

__all__ = ["run_workers"]

logger = logging.getLogger(__name__)
_POLL_S = 1.0


def run_workers(settings: NasSettings, n_workers: int, cores_each: int) -> StudyResult:
    """Run the study on `n_workers` local workers of `cores_each` cores (module doc)."""
    folder = Path(settings.output_dir) / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    study = trials.open_study(settings)  # 1.
    (folder / "settings.pkl").write_bytes(pickle.dumps(settings))  # 2.
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    procs = []
    for k in range(n_workers):
        mine = available[k * cores_each : (k + 1) * cores_each]
        command = [sys.executable, "-m", "nas.workers", str(folder / "settings.pkl"), str(k)]
        command += [",".join(map(str, mine))] if len(mine) == cores_each else []
        procs.append(subprocess.Popen(command))
    logger.info("study %s: %d workers started", settings.study.name, n_workers)
    with progress_bars() as progress:  # 3.
        bar = progress.add_task(f"study {settings.study.name}", total=settings.study.n_trials)
        while any(p.poll() is None for p in procs):
            _show(progress, bar, study)
            time.sleep(_POLL_S)
        _show(progress, bar, study)
    return _merge(settings, folder, procs)  # 4.


def _show(progress: Progress, bar: TaskID, study: optuna.Study) -> None:
    """The finished trials on the bar; a storage that does not answer (the workers wait it
    out or stop, naming it) leaves the bar as it was."""
    try:
        progress.update(bar, completed=trials.finished(study))
    except Exception as error:
        logger.debug("study bar not updated: %s", error)


def _merge(
    settings: NasSettings, folder: Path, procs: list[subprocess.Popen[bytes]]
) -> StudyResult:
    results: list[StudyResult] = []
    errors: list[BaseException] = []
    for k, proc in enumerate(procs):
        path = folder / f"{k}.pkl"
        if not path.exists():
            errors.append(RuntimeError(f"worker {k} ended with exit code {proc.returncode}"))
            continue
        outcome = pickle.loads(path.read_bytes())
        (results if isinstance(outcome, StudyResult) else errors).append(outcome)
    if errors:
        for error in errors[1:]:
            logger.error("study %s: another worker failed too: %s", settings.study.name, error)
        raise errors[0]
    return StudyResult(
        settings.study.name,
        settings.storage_url,
        max(r.finished for r in results),
        sum(r.restarts for r in results),
        tuple(d for r in results for d in r.run_dirs),
    )


def _worker(settings_path: Path, number: int, cpus: list[int]) -> None:
    """One worker: its own run folder, cores and stage processes; no bars (the caller's)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # the stage processes inherit it
    settings: NasSettings = pickle.loads(settings_path.read_bytes())
    settings = dataclasses.replace(
        settings, output_dir=str(Path(settings.output_dir) / f"worker-{number}")
    )
    job_log.attach()
    outcome: StudyResult | BaseException
    try:
        outcome = run_study(settings, progress=False, worker=number)
    except Exception as error:  # handed to the caller, which raises it
        outcome = error
    try:
        data = pickle.dumps(outcome)
    except Exception:  # an error that does not pickle: its text
        data = pickle.dumps(RuntimeError(f"worker {number}: {outcome}"))
    (settings_path.parent / f"{number}.pkl").write_bytes(data)


if __name__ == "__main__":
    _worker(
        Path(sys.argv[1]),
        int(sys.argv[2]),
        [int(c) for c in sys.argv[3].split(",")] if len(sys.argv) > 3 else [],
    )
