"""One NAS study on long-lived stage processes, top to bottom: the lifecycle in one place.

`run_study(settings)` starts the stage processes once (`pipeline.launch`) and keeps them for
the whole study; each candidate is a `reconfigure` of the same `ElasticPipeline`, never a
restart. Every stage process runs `_stage_main`; rank 0 alone holds the study
(`nas.study.leader.Leader`) and makes the decisions, numbered as they happen:

    1. open    rank 0 opens the study (seeds enqueued), the tracker and the progress bars;
    2. ask     rank 0 asks Optuna for a trial and samples its architecture from the space
               `search_space.name` names (`nas.study.asking`, `search_spaces.SearchSpace`);
    3. build   every rank compiles the architecture to layers and reconfigures (planned
               from the cost cache; weights inherited when asked);
    4. train   every rank trains `train.steps` steps; every `train.eval_every` steps every
               rank evaluates (loss, accuracy, the decoded metrics of greedy decoding, or
               bits per character), and rank 0 logs, reports the fitness and decides pruning;
    5. tell    rank 0 records the outcome: the objective values, or the cause of a failure;
    6. close   rank 0 ends the tracker's runs and says how the study went.

Rank 0's decisions (1, 2, 4's report, 5) go through `nas.study.decisions.Decisions`: every
rank waits in the same broadcast and receives the decision, or, if rank 0 raised while
making it (storage locked or gone, a tracker or sampler error), the same `LeaderError`.
Steps 3 and 4 are `nas.study.candidate`'s. Failures, by where they happen:

* in the runtime while a trial builds or trains (a layer error, a NaN loss, a memory plan
  that cannot fit): raised on every rank by the runtime; the trial fails with its cause;
* in rank 0's decision during training (4): the trial fails with that cause, the study
  goes on;
* in rank 0's decision at 1, 2 or 5: the study stops on every rank, the processes end
  cleanly, and `run_study` raises the `LeaderError`;
* a stage process dies: `launch` raises; the trial left RUNNING is failed with the cause and
  asked again (at most `study.max_retries` times per architecture: then it stays failed and
  the study goes on), and the processes are started again, up to `study.max_restarts` times
  for deaths whose trial is retried.

Re-running with the same study name resumes toward `study.n_trials` finished trials. With
`pipeline.per_candidate=true` there is no shape per study: one pool of stage processes
serves every worker, and each trial takes the stages its candidate needs
(`nas.study.pooled`, the same steps with the leader in the worker).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import sys
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import optuna

import pipeline
from nas import job_log, storage
from nas.errors import LeaderError
from nas.settings import AUTO, NasSettings
from nas.study import pooled, shape, training, trials, workers
from nas.study.candidate import CandidateTrainer
from nas.study.decisions import Decisions
from nas.study.inheritance import WeightBank
from nas.study.leader import Leader, StudyEnd
from nas.study.opening import open_study
from nas.study.orphans import fail_running
from nas.study.strategies import no_pruning
from nas.tasks import get_task
from pipeline import ElasticPipeline, PoolClient, PoolService, StageContext
from pipeline.distributed.comm import Comm
from pipeline.pure.shape import RuntimeOverheads

__all__ = ["StudyResult", "run_study"]

_KEEP = 32  # trained trials whose weights a later candidate may start from (at least)
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StudyResult:
    """What a finished `run_study` hands back: where the study lives and its trials."""

    study_name: str
    storage: str
    finished: int
    restarts: int
    run_dirs: tuple[str, ...]  # tracker run folders (W&B offline runs to sync)


def run_study(
    settings: NasSettings, *, progress: bool = True, worker: int | None = None
) -> StudyResult:
    """Run (or resume) the study described by `settings`; returns when it has enough trials.

    Shape values left "auto" are chosen first (`nas.study.shape`); several workers run as local
    processes (`nas.study.workers`), each running this function as `worker` k (its shape chosen:
    it starts its stage processes and trains). `progress`: show the study's and trials'
    bars (a worker leaves them to its caller).

    Raises `LeaderError` (on every process) when rank 0 could not open the study, ask for a
    trial or record one. Under torchrun every process calls this: each is one stage, rank 0
    alone opens the study, and a death is torchrun's to handle (restart the job: it resumes).
    """
    started = time.time()  # its first trial's `Phase.BEFORE` counts from here
    _make_folder(settings.studies_dir, "studies_dir")
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    if (unpruned := no_pruning(settings)) and worker is None and pipeline.lead_process():
        logger.warning("study %s: %s", settings.study.name, unpruned)
    if settings.pipeline.per_candidate:  # each worker keeps its own owner and deadline
        return _on_pool(settings, open_study(settings))
    owner = storage.this_owner()  # the trials this harness asks carry it (nas.storage.opening)
    deadline = _deadline(settings)
    if pipeline.under_torchrun():
        settings, choice = shape.resolve_one(settings)
        overheads = choice.overheads if choice is not None else None
        end = _launch(settings, owner, deadline, overheads, progress, started)
        return StudyResult(settings.study.name, settings.storage_url, end.finished, 0, end.run_dirs)
    study = open_study(settings)
    settings, choice = shape.resolve(
        settings, max_workers=max(1, trials.remaining(study, settings.study.n_trials))
    )
    overheads = choice.overheads if choice is not None else shape.load_cache().overheads
    if int(settings.study.workers) > 1 and worker is None:
        return _on_workers(settings, study)
    restarts, retries = 0, settings.study.max_retries
    run_dirs: list[str] = []
    while (
        trials.remaining(study, settings.study.n_trials) > 0
        and time.time() < deadline
        and trials.time_left(study, settings)
    ):
        try:
            launched = _launch(settings, owner, deadline, overheads, progress, started)
            run_dirs.extend(launched.run_dirs)
        except LeaderError as error:  # the study stopped on every rank: its trial is retried
            with contextlib.suppress(Exception):  # the storage may be what failed
                fail_running(study, f"the study stopped: {error}", owner, retries)
            raise
        except pipeline.StageFailedError as error:
            started = time.time()  # the next launch's first trial counts from here
            cause = f"stage {error.stage} died: {error.detail[-2000:]}"
            logger.warning("study %s: %s", settings.study.name, cause.strip().splitlines()[-1])
            if not fail_running(study, cause, owner, retries):
                continue  # its trial ended failed (retried enough): the study goes on
            restarts += 1
            if restarts > settings.study.max_restarts:
                raise
        else:  # rank 0 asked for no more trials: none left (or a peer trains the last)
            break
    return StudyResult(
        settings.study.name, settings.storage_url, trials.finished(study), restarts, tuple(run_dirs)
    )


def _deadline(settings: NasSettings) -> float:
    """When this run of the study stops starting trials (`study.timeout_s` from now)."""
    timeout = settings.study.timeout_s
    return math.inf if timeout is None else time.time() + timeout


def _on_pool(settings: NasSettings, study: optuna.Study) -> StudyResult:
    """The study on one stage pool shared by its workers (`nas.study.pooled`): as many
    workers as the pool has processes unless `study.workers` says, each asking trials and
    training each on the stage count its candidate needs."""
    if pipeline.under_torchrun():
        raise ValueError(
            "pipeline.per_candidate=true starts a pool of local stage processes; under "
            "torchrun the stages are torchrun's: use pipeline.per_candidate=false there"
        )
    size = max(1, shape.cores() // shape.pool_threads(settings))
    pooled.max_stages(settings, size)  # a bad n_stages is refused before anything starts
    workers_set = settings.study.workers
    lanes = min(
        size if workers_set == AUTO else int(workers_set),
        trials.remaining(study, settings.study.n_trials),
    )
    settings = dataclasses.replace(
        settings, study=dataclasses.replace(settings.study, workers=max(1, lanes))
    )
    shape.machine_costs()  # the overheads measured once, before the workers read them
    p = settings.pipeline
    with (
        pipeline.StagePool(
            size,
            threads_per_process=shape.pool_threads(settings),
            timeout_s=p.timeout_s,
            keep_resident=_weights_kept(settings),
        ) as pool,
        PoolService(pool) as service,
    ):
        warming = pool.submit(functools.partial(pooled.warm_up, settings=settings), size)
        warming.add_done_callback(_warmed)
        work = functools.partial(_as_pooled_worker, client=service.client())
        return _merged(settings, study, workers.WorkerJob("search", settings, work))


def _warmed(warming: Future[list[int]]) -> None:
    """A warm-up that failed costs its processes (the pool starts others), not the study."""
    if (error := warming.exception()) is not None:
        logger.warning("the stage pool's warm-up failed (trials load for themselves): %s", error)


def _as_pooled_worker(settings: NasSettings, number: int, client: PoolClient) -> StudyResult:
    """What pooled worker `number` runs (module-level: pickled by name)."""
    end, restarts = pooled.run_worker(settings, storage.this_owner(), _deadline(settings), client)
    return StudyResult(
        settings.study.name, settings.storage_url, end.finished, restarts, end.run_dirs
    )


def _launch(
    settings: NasSettings,
    owner: str,
    deadline: float,
    overheads: RuntimeOverheads | None,
    progress: bool,
    started: float,
) -> StudyEnd:
    """Start the stage processes (or join torchrun's) and run trials until none are left;
    rank 0's account of the run. A study stopped by an error raises it here. `started`:
    when this launch began (`time.time()`), what its first trial's fixed costs count from."""
    main = functools.partial(
        _stage_main,
        settings=settings,
        owner=owner,
        deadline=deadline,
        overheads=overheads,
        progress=progress,
        started=started,
    )
    results = pipeline.launch(
        main,
        settings.pipeline.stage_count,
        threads_per_stage=settings.pipeline.thread_count,
        timeout_s=settings.pipeline.timeout_s,
    )
    end, error = results[0]
    if error is not None:
        raise error
    assert end is not None
    return end


# -- inside every stage process -------------------------------------------------------------
def _stage_main(
    ctx: StageContext,
    settings: NasSettings,
    owner: str,
    deadline: float,
    overheads: RuntimeOverheads | None,
    progress: bool,
    started: float,
) -> tuple[StudyEnd | None, BaseException | None]:
    """The study loop on one rank; rank 0 returns (its account, the error that stopped it)."""
    job_log.attach()  # this process logs to the CLI's job log too
    comm = Comm()
    try:  # bad task options (a missing text file) fail the same way on every rank
        task = comm.together(lambda: get_task(settings.task.name, **settings.task.options))
    except (ValueError, TypeError, OSError) as error:
        return None, error if ctx.rank == 0 else None
    leader: Leader | None = None
    pipe: ElasticPipeline | None = None
    stopped: BaseException | None = None
    end: StudyEnd | None = None
    try:
        leader = _open(comm, settings, owner, deadline, progress)  # 1.
        decide = Decisions(comm, leader)
        trainer = CandidateTrainer(
            settings,
            task,
            decide,
            WeightBank(keep=_weights_kept(settings)),
            training.rates(settings.train),  # one schedule: the pipeline keeps it
            shape.load_cache(),
            overheads,
        )
        ended = started  # this worker's previous trial ended (its first: when it started)
        while (order := decide("ask for a trial", Leader.next_trial)) is not None:  # 2.
            pipe, outcome = trainer.run(pipe, order, time.time() - ended)  # 3., 4.
            ended = time.time()
            decide(f"record trial {order.number}", Leader.finish, order.number, outcome)  # 5.
    except LeaderError as error:  # agreed on every rank: the study stops here, cleanly
        stopped = error
    finally:
        if pipe is not None:
            pipe.close()
            if ctx.rank == 0:  # what the trials measured, for the next study's plans
                shape.learn_costs(pipe.cost_cache)
        if leader is not None:  # 6. (also when this rank crashes: the runs still finish)
            end = leader.close(stopped or sys.exc_info()[1])
    return end, stopped


def _open(
    comm: Comm, settings: NasSettings, owner: str, deadline: float, progress: bool
) -> Leader | None:
    """Rank 0 opens the study (1.); every rank learns whether it could (else LeaderError)."""
    opened: list[Leader] = []

    def make() -> None:
        try:
            opened.append(Leader(settings, owner, deadline, progress=progress))
        except Exception as error:
            raise LeaderError.of("open the study", error) from error

    comm.agree(make)
    return opened[0] if opened else None


def _as_worker(settings: NasSettings, number: int) -> StudyResult:
    """What worker `number` of `_on_workers` runs (module-level: pickled by name)."""
    return run_study(settings, progress=False, worker=number)


def _make_folder(folder: str, key: str) -> None:
    """`folder` made where missing; `StorageError` naming `key` when it cannot be."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise storage.StorageError(
            f"{key}={folder} cannot be made ({error.strerror}); valid: a folder this user "
            "can create and write"
        ) from None


def _on_workers(settings: NasSettings, study: optuna.Study) -> StudyResult:
    """The study on its `study.workers` local workers (`nas.study.workers`), merged."""
    return _merged(settings, study, workers.WorkerJob("search", settings, _as_worker))


def _merged(
    settings: NasSettings, study: optuna.Study, job: workers.WorkerJob[StudyResult]
) -> StudyResult:
    """`job` on its local workers, their results merged."""
    name = settings.study.name
    results = workers.run_workers(
        job, (f"study {name}", settings.study.n_trials, lambda: trials.finished(study))
    )
    logger.debug("study %s: %d workers ended", name, len(results))
    return StudyResult(
        name,
        settings.storage_url,
        max(r.finished for r in results),
        sum(r.restarts for r in results),
        tuple(d for r in results for d in r.run_dirs),
    )


def _weights_kept(settings: NasSettings) -> int:
    """How many trained trials' weights a worker keeps for later children: its sampler's
    population, where it has one, at least `_KEEP`."""
    return max(_KEEP, int(settings.sampler.options.get("population_size", 0)))
