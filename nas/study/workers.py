"""Several local workers on one study, started by the harness itself (`study.workers`).

A small candidate trains fastest on one stage process per core, so the machine trains several
candidates side by side: W workers, each its own Python process with its own stage processes
on its own cores, all asking the same Optuna storage for trials (as the README's "Many
machines" workers do, here started for the user: forked from the stage processes' server,
`pipeline.distributed.processes`, with torch imported already). The retraining after the
search is shared the same way (this module runs either; its callers, `nas.study.run` and
`nas.retrain.stage`, say what): its (model, seed) runs are claimed one by one
(`nas.retrain.claims`).

    caller (the CLI: one progress bar, one report)
      │ 1. opens the study once (seeds enqueued), so workers do not race to create it
      │ 2. writes the job (`WorkerJob`: its label, the settings with the shape chosen, the
      │    work: `run_study` or `retrain_models` as worker k) to <run>/workers/<label>.pkl
      ├─ worker 0 (job.pkl, caller pid)  cores 0..k-1   run folder <run>/worker-0
      ├─ worker 1 (job.pkl, caller pid)  cores k..2k-1  run folder <run>/worker-1
      │ 3. while they run: one bar counts the finished trials (or recorded runs) on disk
      └ 4. each worker writes its result (or its error) to <run>/workers/<label>-<k>.pkl;
           the caller merges them; the first error of a worker is raised once all ended

A worker that dies leaves its trial RUNNING: the others fail it and retry it (the heartbeat,
`nas.storage.opening`), so the study goes on and nothing recorded is lost; a run it retrained and
recorded is kept, one it claimed and left is trained by the next retraining. A caller that
dies (killed, or its machine's supervisor stopped it) takes its workers with it: each watches
its caller and ends at once when it is gone (`pipeline.distributed.processes.watch_caller`),
so a command started again never finds the last one's workers still training beside it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

from nas import job_log
from nas.progress import progress_bars
from nas.settings import NasSettings
from pipeline.distributed import processes, server

__all__ = ["WorkerJob", "run_workers"]

logger = logging.getLogger(__name__)
_POLL_S = 1.0
R = TypeVar("R")


@dataclasses.dataclass(frozen=True)
class WorkerJob(Generic[R]):
    """What every worker runs: `work(settings, k)` in worker k, with its own run folder.

    `work` is pickled into the job file (step 2): a module-level function, or a
    `functools.partial` of one, so that the worker imports it by name.
    """

    label: str  # names the job's files and its log lines: "search", "retrain"
    settings: NasSettings
    work: Callable[[NasSettings, int], R]


def run_workers(job: WorkerJob[R], bar: tuple[str, int, Callable[[], int]]) -> list[R]:
    """Steps 2-4: run `job` on its settings' `study.workers` local workers, each on the cores
    of its shape (stages x threads), showing `bar` (description, total, how many are done)
    while they run; their results in worker order, or the first worker's error once all
    ended."""
    n_workers = int(job.settings.study.workers)
    pipeline = job.settings.pipeline
    # on the stage pool (`nas.study.pooled`) the workers wait while the pool's processes
    # train: they are not held to cores of their own
    cores_each = (
        0 if pipeline.per_candidate else pipeline.stage_count * (pipeline.thread_count or 1)
    )
    folder = Path(job.settings.output_dir) / "workers"
    folder.mkdir(parents=True, exist_ok=True)
    job_path = folder / f"{job.label}.pkl"
    job_path.write_bytes(pickle.dumps(job))  # 2.
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    context, caller = server.start_context(), processes.Caller.here()
    procs = []
    for k in range(n_workers):
        (folder / f"{job.label}-{k}.pkl").unlink(missing_ok=True)  # an earlier round's
        mine = available[k * cores_each : (k + 1) * cores_each]
        cpus = mine if mine and len(mine) == cores_each else []
        procs.append(
            context.Process(
                target=_worker,
                args=(caller, job_path, k, cpus),
                name=f"{job.label}-worker-{k}",
            )
        )
        procs[-1].start()
    logger.info("%s: %d workers started", bar[0], n_workers)
    description, total, done = bar
    with progress_bars() as progress:  # 3.
        task = progress.add_task(description, total=total)
        # every worker polled each round (the server that forked them reaps one that died
        # at once, so that its peers see its trial's owner gone: a zombie answers signal 0)
        while any([p.is_alive() for p in procs]):
            _show(progress.update, task, done)
            time.sleep(_POLL_S)
        _show(progress.update, task, done)
    return _outcomes(job, folder, procs)  # 4.


def _show(update: Callable[..., None], task: object, done: Callable[[], int]) -> None:
    """The finished count on the bar; a storage that does not answer (the workers wait it
    out or stop, naming it) leaves the bar as it was."""
    try:
        update(task, completed=done())
    except Exception as error:
        logger.debug("bar not updated: %s", error)


def _outcomes(job: WorkerJob[R], folder: Path, procs: list[Any]) -> list[R]:
    results: list[R] = []
    errors: list[BaseException] = []
    for k, proc in enumerate(procs):
        path = folder / f"{job.label}-{k}.pkl"
        if not path.exists():
            errors.append(RuntimeError(f"worker {k} ended with exit code {proc.exitcode}"))
            continue
        failed, outcome = pickle.loads(path.read_bytes())
        if failed:
            errors.append(outcome)
        else:
            results.append(outcome)
    if errors:
        for error in errors[1:]:
            logger.error("%s: another worker failed too: %s", job.label, error)
        raise errors[0]
    return results


def _worker(caller: processes.Caller, job_path: Path, number: int, cpus: list[int]) -> None:
    """One worker: its own run folder, cores and stage processes; no bars (the caller's).
    Forked from the stage processes' server (`pipeline.distributed.processes`), it has torch
    and the runtime imported already, and takes the caller's environment and folder. It
    watches the caller by its pid (its parent is the server)."""
    caller.adopt()
    processes.watch_caller(caller.pid)  # the caller gone, this worker and its stage processes end
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # the stage processes inherit it
    job: WorkerJob[object] = pickle.loads(job_path.read_bytes())
    settings = dataclasses.replace(
        job.settings, output_dir=str(Path(job.settings.output_dir) / f"worker-{number}")
    )
    job_log.attach()
    outcome: tuple[bool, object]
    try:
        outcome = (False, job.work(settings, number))
    except Exception as error:  # handed to the caller, which raises it
        outcome = (True, error)
    try:
        data = pickle.dumps(outcome)
    except Exception:  # an error that does not pickle: its text
        data = pickle.dumps((True, RuntimeError(f"worker {number}: {outcome[1]}")))
    (job_path.parent / f"{job.label}-{number}.pkl").write_bytes(data)
