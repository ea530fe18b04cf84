"""A study on the machine's stage pool: each candidate on the stage count its profile needs.

With `pipeline.per_candidate=true` no worker starts stage processes of its own: the caller
starts one `pipeline.StagePool` (a process per core) and serves it to the study's workers
(`pipeline.distributed.pool_service`), and each worker trains every trial it asks as one
pool job sized for that trial's candidate, while the other workers' jobs train on the
processes left. The pool's first job (`warm_up`, on every process while the workers
start) loads the imports and the task a trial's job needs. Per trial, numbered as it
happens:

    worker (holds the study: Leader)                the job's pool processes
    1. ask     leader.next_trial()
    2. size    the candidate's layers profiled (the
               cost cache first, with the layers the
               other workers timed and the errors the
               trials learned): the fewest stages
               within pipeline.memory_budget, more only
               where predicted faster per process (as
               the study's trials on as many stages
               measured against their predictions), and
               the fewer it may start on at once (the
               study's last trial, no peer's running:
               the fastest first, as no other trial
               will want the pool)
    3. submit  run(trial_job, (n, fewer...),         4. build  on the n ranks lent, from
               take=<the trial it inherits from>,                the weights it took (live,
               keep=<this trial>)                                where still resident)
               (serves the job's rank 0 meanwhile:   5. train  CandidateTrainer, as on
               nas.study.remote)                                 launched stages; rank 0 asks
                                                                 the worker for decisions
                                                     6. keep   its weights stay resident
    7. tell    leader.finish(number, outcome)                    for its children

A candidate that no pipeline of the pool fits is failed with the reason (its plan's memory
against the budget) and the study goes on. A job whose process dies ends with
`StageFailedError`: the trial is failed as interrupted and asked again (`nas.study.orphans`,
at most `study.max_retries` times per architecture), the pool starts fresh processes in the
dead ones' places, and the worker goes on, up to `study.max_restarts` such deaths. A worker
that dies leaves its job to fail at its next decision (the link is gone): the job's
processes go back to the pool, and a peer's heartbeat check asks the trial again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any

from nas import job_log
from nas.errors import LeaderError
from nas.settings import NasSettings
from nas.study import shape, training, trials
from nas.study.candidate import CandidateTrainer
from nas.study.decisions import Decisions
from nas.study.inheritance import WeightBank
from nas.study.leader import Leader, StudyEnd, TrialOrder
from nas.study.orphans import fail_running
from nas.study.remote import LeaderLink, LeaderService
from nas.study.trials import Outcome
from nas.tasks import Task, get_task
from nas.tracking import TrialEnd
from nas.tracking.pool_plot import POOL_ENDED, POOL_PROCESSES, POOL_STARTED
from pipeline import CostCache, PoolClient, PoolContext, StageFailedError
from pipeline.distributed.comm import Comm
from search_spaces.architecture import from_json

__all__ = ["max_stages", "run_worker", "trial_job", "warm_up"]

logger = logging.getLogger(__name__)


def max_stages(settings: NasSettings, pool_size: int) -> int:
    """The most stages a candidate may take: `pipeline.n_stages` when set, else the pool."""
    n_stages = settings.pipeline.n_stages
    limit = n_stages if isinstance(n_stages, int) else pool_size
    if limit > pool_size:
        raise ValueError(
            f"pipeline.n_stages={limit} with pipeline.per_candidate: a candidate takes at "
            f"most the pool's {pool_size} processes; use a value of 1 to {pool_size}, or auto"
        )
    return limit


def run_worker(
    settings: NasSettings, owner: str, deadline: float, client: PoolClient
) -> tuple[StudyEnd, int]:
    """One worker's trials on the pool until the study has enough (module doc); rank 0's
    account and the job deaths it went on after. Raises `LeaderError` when the study could
    not be opened, asked or told, and the last `StageFailedError` past `study.max_restarts`."""
    task = get_task(settings.task.name, **settings.task.options)
    costs = shape.load_cache()
    limit = max_stages(settings, client.size)
    try:
        leader = Leader(settings, owner, deadline, progress=False)  # 1.
    except Exception as error:
        raise LeaderError.of("open the study", error) from error
    worker = _Worker(settings, owner, task, costs, limit, client, leader)
    stopped: BaseException | None = None
    try:
        worker.run()
    except BaseException as error:
        stopped = error
        raise
    finally:
        end = leader.close(stopped)
    return end, worker.restarts


@dataclasses.dataclass
class _Worker:
    """The loop of `run_worker`: asks, sizes, submits and tells, one trial at a time."""

    settings: NasSettings
    owner: str
    task: Task
    costs: CostCache
    max_stages: int
    client: PoolClient
    leader: Leader
    restarts: int = 0
    last_trained: int | None = None  # this worker's last trial, when a child has no parent

    def run(self) -> None:
        with LeaderService(self.leader) as service:
            while (order := self._decide("ask for a trial", Leader.next_trial)) is not None:
                outcome = self._train(order, service)
                if outcome is not None:
                    self._decide(
                        f"record trial {order.number}", Leader.finish, order.number, outcome
                    )

    def _decide(self, what: str, method: Any, *args: Any) -> Any:
        """A decision of the worker's own (1., 7.): any error stops the study as `LeaderError`
        (its trial, if one is open, is failed and asked again)."""
        try:
            return method(self.leader, *args)
        except Exception as error:
            stopped = LeaderError.of(what, error)
            with contextlib.suppress(Exception):  # the storage may be what failed
                fail_running(
                    self.leader.study,
                    f"the study stopped: {stopped}",
                    self.owner,
                    self.settings.study.max_retries,
                )
            raise stopped from error

    def _train(self, order: TrialOrder, service: LeaderService) -> Outcome | None:
        """2.-6.: the trial's outcome, or None when its job died (it is asked again)."""
        arch = from_json(order.architecture)
        shape.refresh_costs(self.costs)  # what the other workers timed, the trials learned
        measured = trials.measured_shares(self.leader.study)  # the pool's load, per count
        try:
            options = shape.per_candidate(
                self.settings,
                arch,
                self.task,
                self.costs,
                self.max_stages,
                alone=order.last,
                measured=measured,
            )
        except training.RUN_ERRORS as error:  # no pipeline of the pool fits it: refused
            reason, detail = training.failure(error)
            return Outcome(TrialEnd.FAILED, {"fail_reason": reason, "detail": detail})
        finally:  # the layers timed here, for the other workers' candidates
            shape.learn_costs(self.costs, errors=False)
        inherits = self.settings.study.inherit_weights
        source = (
            (order.parent if order.parent is not None else self.last_trained) if inherits else None
        )
        job = functools.partial(
            trial_job,
            settings=self.settings,
            order=order,
            microbatches={o.shape.n_stages: o.shape.n_microbatches for o in options},
            link=service.link(),
            source=source,
        )
        counts = tuple(o.shape.n_stages for o in options)
        logger.info(
            "trial %d on %s stage(s): the first count free",
            order.number,
            " or ".join(map(str, counts)),
        )
        try:
            results = self.client.run(
                job,
                counts,
                take=None if source is None else _resident_name(source),
                keep=_resident_name(order.number) if inherits else None,
            )
        except StageFailedError as error:
            self._died(order, f"stage {error.stage} died: {error.detail[-2000:]}", error)
            return None
        self.last_trained = order.number
        outcome: Outcome = results[0][0]
        where = {  # where and when it ran: the report's picture of the pool
            POOL_PROCESSES: [process for _, process, _ in results],
            POOL_STARTED: min(began for _, _, (began, _) in results),
            POOL_ENDED: max(ended for _, _, (_, ended) in results),
        }
        return dataclasses.replace(outcome, attrs=outcome.attrs | where)

    def _died(self, order: TrialOrder, cause: str, error: StageFailedError) -> None:
        """A job's process died: the trial is failed as interrupted and asked again (unless
        its architecture was retried enough); past `study.max_restarts` the worker stops."""
        logger.warning("trial %d: %s", order.number, cause.strip().splitlines()[-1])
        self._decide(f"end trial {order.number}", Leader.interrupt, order.number, cause)
        retried = fail_running(
            self.leader.study, cause, self.owner, self.settings.study.max_retries
        )
        if retried:
            self.restarts += 1
            if self.restarts > self.settings.study.max_restarts:
                raise error


def _resident_name(number: int) -> str:
    """The name trial `number`'s weights stay resident under in the pool."""
    return f"trial-{number}"


_TASKS: dict[str, Task] = {}  # a pool process's tasks, loaded once: its jobs share them


def _task(settings: NasSettings) -> Task:
    key = f"{settings.task.name}:{sorted(settings.task.options.items())!r}"
    if key not in _TASKS:
        _TASKS[key] = get_task(settings.task.name, **settings.task.options)
    return _TASKS[key]


def warm_up(ctx: PoolContext, settings: NasSettings) -> int:
    """The pool's first job, on every process while the workers start: the imports a trial's
    job needs and the task, loaded once per process (`_task`), so the first trials do not
    wait for them. Its pool process."""
    _task(settings)
    return ctx.process


def trial_job(
    ctx: PoolContext,
    settings: NasSettings,
    order: TrialOrder,
    microbatches: Mapping[int, int],
    link: LeaderLink,
    source: int | None,
) -> tuple[Outcome | None, int, tuple[float, float]]:
    """4.-6. on each process of the job: (the trial's outcome on rank 0, else None; the
    pool process; when the job began and ended here). `microbatches` holds the
    micro-batches of each stage count the job may have been lent."""
    started = time.time()
    job_log.attach()  # the pool's processes log to the job's log too
    shaped = dataclasses.replace(
        settings,
        pipeline=dataclasses.replace(
            settings.pipeline,
            n_stages=ctx.world_size,
            n_microbatches=microbatches[ctx.world_size],
            threads_per_stage=shape.pool_threads(settings),
        ),
    )
    bank = WeightBank(keep=1)
    if ctx.resident is not None and source is not None:
        bank.put(source, ctx.resident)
    costs = shape.load_cache()
    leader = link if ctx.rank == 0 else None
    trainer = CandidateTrainer(
        shaped,
        _task(settings),
        Decisions(Comm(), leader),
        bank,
        training.rates(settings.train),
        costs,
        costs.overheads,
    )
    try:
        pipe, outcome = trainer.run(None, order, time.time() - started)  # 4., 5.
        if pipe is not None:
            if ctx.keep_as is not None and outcome.state != TrialEnd.FAILED:  # 6.
                ctx.keep(pipe.snapshot())
            if ctx.rank == 0:
                shape.learn_costs(pipe.cost_cache)
            pipe.close()
    finally:
        link.close()
    return (outcome if ctx.rank == 0 else None), ctx.process, (started, time.time())
