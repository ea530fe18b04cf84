"""One candidate on every stage process: built, trained, evaluated, and what it measured.

Steps 3 and 4 of a study (`nas.study.run`): every rank compiles the trial's architecture to
layers and reconfigures the one pipeline it keeps (planned from the cost cache; weights
inherited when asked), trains `train.steps` steps and evaluates every `train.eval_every`
steps, where rank 0 logs, reports the fitness and decides pruning (`Decisions`). A child
judged at inherited fidelity continues its parent instead (`nas.study.judging`). The
result is the trial's `Outcome`: its objective values and everything it measured, or the
cause of its failure, the same on every rank.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from nas.errors import LeaderError
from nas.learning_rate import LrSchedule
from nas.search.fidelity import Fidelity, fidelity_of, record
from nas.settings import NasSettings, direction, task_metrics
from nas.study import judging, promotion, training
from nas.study.checkpoints import RunCheckpoints, fingerprint
from nas.study.decisions import Decisions
from nas.study.inheritance import WeightBank, inherited_attrs
from nas.study.kept_weights import write_copy
from nas.study.leader import Leader, TrialOrder
from nas.study.leading import SEED_VALUES, mean_value
from nas.study.phases import Phase, TrialClock, timed
from nas.study.trials import Outcome
from nas.tasks import Task
from nas.tracking import TrialEnd, pipeline_metrics
from pipeline import CheckpointOptions, CostCache, ElasticPipeline, LayerSpec, WeightSnapshot
from pipeline.pure.planner import Plan
from pipeline.pure.shape import RuntimeOverheads, Shape, predicted_step_s
from search_spaces.architecture import from_json, short_name, summary

__all__ = ["CandidateTrainer"]

Trained = tuple[ElasticPipeline, dict[str, float], int, bool]  # pipe, evaluation, steps, pruned


@dataclass(frozen=True)
class CandidateTrainer:
    """What the trials of one stage process share: the settings and task, rank 0's
    `decide`, the trained weights a later candidate may start from (`bank`), the learning
    rate schedule, and the machine: its cost cache (layers profiled before, by the shape's
    choice or earlier studies) and the runtime's overheads."""

    settings: NasSettings
    task: Task
    decide: Decisions
    bank: WeightBank
    schedule: LrSchedule
    costs: CostCache
    overheads: RuntimeOverheads | None

    def run(
        self, pipe: ElasticPipeline | None, order: TrialOrder, before_s: float = 0.0
    ) -> tuple[ElasticPipeline | None, Outcome]:
        """Build and train the candidate of `order` on `pipe` (None: the first), on every
        rank; the pipeline kept and how the trial ended, with where its time went
        (`nas.study.phases`; `before_s`: the seconds since this worker's previous trial
        ended, or since it started)."""
        clock = TrialClock()
        clock.charge(Phase.BEFORE, before_s)
        with clock.running():
            pipe, outcome = self._run(pipe, order)
        return pipe, replace(outcome, attrs=outcome.attrs | clock.attrs())

    def _run(
        self, pipe: ElasticPipeline | None, order: TrialOrder
    ) -> tuple[ElasticPipeline | None, Outcome]:
        settings = self.settings
        arch = from_json(order.architecture)
        specs, parameters = training.compile_model(arch, self.task, settings.train.dropout)
        attrs: dict[str, Any] = {
            "architecture": summary(arch),
            "short_name": short_name(arch),
            "parameters": parameters,
        }
        if settings.study.fidelity == Fidelity.INHERITED:
            attrs |= record(Fidelity.FULL)  # unless judged from a trained parent
        source = self.bank.source(order.parent) if settings.study.inherit_weights else None
        if source is not None:
            attrs |= inherited_attrs(source)
        started = time.perf_counter()
        try:
            pipe, evaluation, steps, pruned = self._train_order(pipe, order, specs, source, attrs)
        except (LeaderError, *training.RUN_ERRORS) as error:  # raised on every rank
            reason, detail = training.failure(error)
            return pipe, Outcome(TrialEnd.FAILED, attrs | {"fail_reason": reason, "detail": detail})
        attrs |= evaluation | self._measured(pipe, steps, time.perf_counter() - started)
        with timed(Phase.WEIGHTS):
            if settings.study.inherit_weights:
                attrs |= _inheritance(pipe)
                self.bank.add(order.number, pipe)
            if order.weights_to is not None and not pruned:  # its children start from these
                weights = pipe.full_state_dict()  # on rank 0
                if weights:
                    attrs |= write_copy(weights, Path(order.weights_to))
        if pruned:
            return pipe, Outcome(TrialEnd.PRUNED, attrs)
        if settings.study.confirm_seed is not None and fidelity_of(attrs).measured:
            value = float(attrs[settings.study.fitness])
            pipe, confirmed = self._confirm(pipe, order, specs, value)
            attrs |= confirmed
        values = [_objective(float(attrs[name]), name) for name in settings.study.objectives]
        if SEED_VALUES in attrs:  # nas.study.leading, 2.: its standing, the mean over seeds
            values[0] = _objective(mean_value(attrs[SEED_VALUES]), settings.study.fitness)
        return pipe, Outcome(TrialEnd.COMPLETE, attrs, values)

    def _train_order(
        self,
        pipe: ElasticPipeline | None,
        order: TrialOrder,
        specs: list[LayerSpec],
        source: int | None,
        attrs: dict[str, Any],
    ) -> Trained:
        """Judged from its trained parent (`order.inherit`, its estimates added to `attrs`;
        promoted, trained again in full) or built (from `source`'s weights, if any) and
        trained in full."""
        if order.inherit is None:
            saves = self._saves(order)
            resume = saves.options() if saves is not None else None
            start = None if resume else self.bank.inherited(source, order.parent, order.edited)
            built = self._build(pipe, specs, start, resume)
            _note_resumed(built, attrs)
            return built, *self._train(built, saves=saves)
        pipe, evaluation = self._judge(pipe, order, specs, attrs)
        steps = self.settings.study.inherit_steps
        difference = attrs.get(f"difference_{self.settings.study.fitness}", math.nan)
        if not self.settings.study.promote or not self.decide(
            "decide a promotion", Leader.promotes, difference, order.inherit.parent
        ):
            return pipe, evaluation, steps, False
        # nas.study.promotion: trained again from scratch, the measurement its fitness
        attrs |= promotion.promoted(evaluation, task_metrics(self.settings.task.name))
        saves = self._saves(order)
        built = self._build(pipe, specs, None, saves.options() if saves is not None else None)
        _note_resumed(built, attrs)
        evaluation, trained, _ = self._train(built, prunable=False, saves=saves)  # never pruned
        return built, evaluation, steps + trained, False

    def _saves(
        self,
        order: TrialOrder,
        architecture: str | None = None,
        seed: int | None = None,
        run: str = "",
    ) -> RunCheckpoints | None:
        """The checkpoints of one run at the full budget in `order`'s trial (None: it keeps
        none): of `architecture` (default: the trial's) with training seed `seed` (default:
        the study's), in its subfolder `run` (default: the trial's own run)."""
        if order.checkpoints is None:
            return None
        settings = self.settings
        seed = settings.seed if seed is None else seed
        steps = settings.train.steps
        how = {"train": asdict(settings.train), "task": asdict(settings.task), "seed": seed}
        digest = fingerprint(architecture or order.architecture, steps, how)
        return RunCheckpoints(
            Path(order.checkpoints) / (run or f"seed-{seed}"),
            digest,
            settings.study.checkpoint_every,
            steps,
            label=f"trial {order.number}" + (f" ({run})" if run else ""),
        )

    def _confirm(
        self, pipe: ElasticPipeline, order: TrialOrder, specs: list[LayerSpec], value: float
    ) -> tuple[ElasticPipeline, dict[str, Any]]:
        """A trial measured at the full budget with fitness `value` on the study's seed:
        when it would lead (`nas.study.leading`), trained again from scratch on the second
        seed, and the leader on it where the leader lacks it (each checkpointed as the
        trial's own run: a retry goes on from there); what it records. The pipeline
        returned holds the trial's own weights again (what a pool keeps resident)."""
        settings = self.settings
        seed, second = settings.seed, settings.study.confirm_seed
        assert second is not None
        values = {str(seed): value}
        own: WeightSnapshot | None = None
        try:
            challenge = self.decide("decide a challenge", Leader.challenge, value)
            if challenge is None:
                return pipe, {SEED_VALUES: values}
            own = pipe.snapshot()
            saves = self._saves(order, seed=second)
            pipe, evaluation = self._measure(pipe, specs, second, saves)
            values[str(second)] = float(evaluation[settings.study.fitness])
            steps = settings.train.steps
            if challenge.architecture is not None:  # the leader, paired on the second seed
                arch = from_json(challenge.architecture)
                leader = training.compile_model(arch, self.task, settings.train.dropout)[0]
                run = f"leader-{challenge.leader}-seed-{second}"
                saves = self._saves(order, challenge.architecture, second, run)
                pipe, evaluation = self._measure(pipe, leader, second, saves)
                measured = float(evaluation[settings.study.fitness])
                self.decide(
                    "record the leader's second seed",
                    Leader.record_seed_value,
                    challenge.leader,
                    second,
                    measured,
                )
                steps *= 2
        except (LeaderError, *training.RUN_ERRORS) as error:  # raised on every rank
            reason, _ = training.failure(error)  # measured once: it stands on that seed
            confirmed: dict[str, Any] = {
                SEED_VALUES: {str(seed): value},
                "confirmation_failed": reason,
            }
        else:
            confirmed = {SEED_VALUES: values, "confirmation_steps": steps}
        return (pipe if own is None else self._build(pipe, specs, own)), confirmed

    def _measure(
        self,
        pipe: ElasticPipeline,
        specs: list[LayerSpec],
        seed: int,
        saves: RunCheckpoints | None,
    ) -> tuple[ElasticPipeline, dict[str, float]]:
        """`training.measure` on this worker's pipeline, schedule and costs."""
        return training.measure(
            self.settings, self.task, self.schedule, pipe, specs, seed, saves, self.costs
        )

    def _judge(
        self,
        pipe: ElasticPipeline | None,
        order: TrialOrder,
        specs: list[LayerSpec],
        attrs: dict[str, Any],
    ) -> tuple[ElasticPipeline, dict[str, float]]:
        """A child judged at inherited fidelity (`nas.study.judging`): the pipeline and
        its evaluation with the estimates; what else it measured added to `attrs`."""
        assert order.inherit is not None
        record_control = functools.partial(
            self.decide, "record a control", Leader.record_control, order.inherit.parent
        )
        pipe, evaluation, judged = judging.judge(
            self.settings,
            self.task,
            pipe,
            specs,
            order.inherit,
            order.edited,
            comm=self.decide.comm,
            record_control=record_control,
            cost_cache=self.costs,
        )
        attrs |= judged
        return pipe, evaluation

    def _build(
        self,
        pipe: ElasticPipeline | None,
        specs: list[LayerSpec],
        snapshot: WeightSnapshot | None,
        resume: CheckpointOptions | None = None,
    ) -> ElasticPipeline:
        """`specs` on `pipe` (planned from the cost cache) at the full budget's schedule,
        from `snapshot`'s weights where names and shapes match, the rest from scratch; or
        going on from the checkpoint `resume` names."""
        return training.build(
            self.settings,
            self.task,
            specs,
            self.schedule,
            seed=self.settings.seed,
            pipe=pipe,
            snapshot=snapshot,
            checkpoint=resume,
            cost_cache=self.costs,
        )

    def _train(
        self, pipe: ElasticPipeline, *, prunable: bool = True, saves: RunCheckpoints | None = None
    ) -> tuple[dict[str, float], int, bool]:
        """(the last evaluation's metrics, steps trained, pruned?).

        The steps between two evaluations are one `pipe.train` stream (no flush between them
        under "2bw"); the stream drains before each evaluation. Each evaluation is reported
        (pruners learn from it); only a `prunable` run stops where the pruner says. With
        `saves`, each step goes to the run's history and a checkpoint every N steps; a run
        resumed from one (`pipe.step` > 0) reports its history again first, then goes on
        from the first batch it has not trained.
        """
        train = self.settings.train
        step, history = saves.resumed(pipe) if saves is not None else (0, [])
        replayed = self._replay(history, prunable)
        if replayed is not None:
            return replayed
        source = training.batches(self.task, train.batch_size, self.settings.seed)
        source = itertools.islice(source, step, None)  # from the first batch not trained
        while True:
            end = min(step + train.eval_every - step % train.eval_every, train.steps)
            for done, loss in training.steps(pipe, source, start=step, count=end - step):
                step = done
                if step < end:  # all but the segment's last: no decision
                    self._stepped(pipe, saves, {"step": step, "loss": loss})
            if step < end:
                raise ValueError(f"task {self.settings.task.name!r} yielded no training batches")
            final = step == train.steps  # every rank evaluates
            evaluation = training.evaluate(train, self.task, pipe, final=final)
            metrics = {
                "loss": loss,
                "lr": self.schedule.rate(step - 1),
                **pipeline_metrics(pipe.stats().to_dict()),
                **evaluation,
            }
            prune = self.decide(f"report step {step}", Leader.evaluated, step, metrics)
            if saves is not None:
                saves.stepped(pipe, {"step": step, "metrics": metrics, "evaluation": evaluation})
            if final:  # trained in full: a measurement, whatever a pruner would say
                return evaluation, step, False
            if prune and prunable:
                return evaluation, step, True  # 4.

    def _stepped(
        self, pipe: ElasticPipeline, saves: RunCheckpoints | None, entry: dict[str, Any]
    ) -> None:
        """A step between evaluations: rank 0 logs it; into the run's history with `saves`."""
        self.decide.log_step(entry["step"], {"loss": entry["loss"]})
        if saves is not None:
            saves.stepped(pipe, entry)

    def _replay(
        self, history: list[dict[str, Any]], prunable: bool
    ) -> tuple[dict[str, float], int, bool] | None:
        """A resumed run's history logged and reported again, as the trial trained it;
        (its evaluation, step, pruned) where the pruner stops it there, else None."""
        for entry in history:
            step = int(entry["step"])
            if "metrics" not in entry:
                self.decide.log_step(step, {"loss": entry["loss"]})
                continue
            prune = self.decide(f"report step {step}", Leader.evaluated, step, entry["metrics"])
            if prune and prunable:
                return dict(entry["evaluation"]), step, True
        return None

    def _measured(self, pipe: ElasticPipeline, steps: int, seconds: float) -> dict[str, Any]:
        """What the trained pipeline measured, and what this worker's shape predicted."""
        stats = pipe.stats()
        return {
            "steps": steps,
            "seconds": seconds,
            "n_stages": len(pipe.sizes),
            "partition": list(pipe.sizes),
            "migrations": len(stats.migrations),
            "partition_history": [[step, list(sizes)] for step, sizes in pipe.partition_history],
            "tokens_per_s": stats.tokens_per_s or 0.0,
            "samples_per_s": stats.samples_per_s or 0.0,
            "shape": _shape_name(self.settings),
            "predicted_samples_per_s": self._predicted_samples_per_s(stats.plan),
            "peak_memory_bytes": max(s.measured_peak_bytes for s in stats.stages),
        }

    def _predicted_samples_per_s(self, plan: Plan | None) -> float | None:
        """One worker's samples/s under `plan` with the overheads (`pipeline.pure.shape`)."""
        if plan is None or self.overheads is None:
            return None
        return self.settings.train.batch_size / predicted_step_s(plan, self.overheads)


def _shape_name(settings: NasSettings) -> str:
    """This worker's shape as the trial records it (`pipeline.pure.shape.Shape`)."""
    p = settings.pipeline
    return str(
        Shape(int(settings.study.workers), p.stage_count, p.thread_count or 0, p.microbatch_count)
    )


def _objective(value: float, name: str) -> float:
    """The value of objective `name` as told; NaN (nothing to measure) counts as worst."""
    if math.isfinite(value):
        return value
    return math.inf if direction(name) == "minimize" else -math.inf


def _note_resumed(pipe: ElasticPipeline, attrs: dict[str, Any]) -> None:
    """A run built from its checkpoint (`study.checkpoint_every`) records the step it went
    on from."""
    if pipe.step:
        attrs["resumed_at_step"] = pipe.step


def _inheritance(pipe: ElasticPipeline) -> dict[str, int]:
    """What this model took from the trial it came from (`inherit_weights`): layers and
    bytes inherited, and how many of them moved to another stage."""
    found = [
        e.details for e in pipe.events if e.kind == "inherit" and e.generation == pipe.generation
    ]
    record = found[-1] if found else {"layers": 0, "bytes": 0, "moved": 0, "moved_bytes": 0}
    return {f"inherited_{k}": int(v) for k, v in record.items()}
