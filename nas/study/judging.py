"""Inherited fidelity (`study.fidelity=inherited`): a child judged from its parent's weights.

Training every candidate from scratch to the full budget judges a few dozen an hour on two
cores, and a from-scratch rung cannot see the small differences between one-edit neighbours
(`benchmarks/fidelity.py`). A child of a trained evolution parent is judged instead on a
short continuation of its parent, paired with the parent's own:

    estimate(metric) = parent(metric) + child_k(metric) - control_k(metric)

1. **The parent's weights.** Every complete trial of such a study keeps its final weights
   in Optuna's artifact store, where any worker on the study's storage finds them, after a
   restart too (`nas.study.kept_weights.TrialWeights`).
2. **The control.** The parent continued `k = study.inherit_steps` steps from those
   weights, at a k-step schedule, on the batches of the continuation seed (the study's
   seed and the parent's number), scored on `train.eval_batches` batches. It is measured
   once per parent and kept in the study's user attributes for every later child.
3. **The child.** Its layers take the parent's weights tensor by tensor where keys, names
   and shapes match (with `study.edited_afresh`, less the tensors its edit touches, which
   start as from scratch: `search_spaces.edited`); it trains the same k steps on the same
   batches and is scored the same way. Its metrics are the estimates; the measured ones
   are kept beside them (`measured_<metric>`).
4. **Promotion** (`study.promote`): a child whose own paired difference says it may be
   among the best is trained again from scratch to the full budget in the same trial, that
   measurement its fitness (`nas.study.promotion`).

Children without a trained parent (the seeds, the first population, a child of a pruned or
failed trial) train from scratch to the full budget as in `study.fidelity=full`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from nas.search.fidelity import Fidelity, record
from nas.settings import NasSettings, task_metrics
from nas.study import training
from nas.study.inheritance import inherited_attrs, load_snapshot
from nas.study.kept_weights import TrialWeights, late_weights_key
from nas.study.promotion import difference_attrs
from nas.study.space import architecture_of
from nas.tasks import Task
from pipeline import CostCache, ElasticPipeline, LayerSpec, WeightSnapshot
from pipeline.distributed.comm import Comm
from search_spaces.architecture import from_json

__all__ = [
    "InheritFrom",
    "continuation_seed",
    "estimate",
    "judge",
    "parent_of",
    "record_control",
    "scored",
]

_CONTROL = "inherited_control"  # study user attribute prefix: `<prefix>:<parent>:<k>`


@dataclass(frozen=True)
class InheritFrom:
    """What a child trained at inherited fidelity needs of its parent (`parent_of`)."""

    parent: int
    architecture: str  # the parent's, JSON: the control trains it
    weights: str  # a local file of the parent's weights (`save_weights`)
    metrics: dict[str, float]  # the parent's recorded metrics the child's estimates add to
    control: dict[str, float] | None  # the parent continued k steps, if measured already


def continuation_seed(seed: int, parent: int) -> int:
    """The data order of a parent's continuation: shared by its control and every child,
    different from every from-scratch run's (`seed`)."""
    return (seed + 1) * 1_000_003 + parent


def parent_of(
    study: optuna.Study, parent: int, settings: NasSettings, weights: TrialWeights
) -> InheritFrom | None:
    """Trial `parent`'s weights (downloaded by `weights`), metrics and control, or None when
    it did not complete or kept no weights: its child trains from scratch
    (`nas.study.kept_weights.WeightsError` when its kept weights cannot be used)."""
    stored, attrs = study.get_trials(deepcopy=False)[parent], study.user_attrs
    if stored.state != TrialState.COMPLETE:
        return None
    path = weights.download(stored, attrs.get(late_weights_key(parent)))
    if path is None:
        return None
    control = attrs.get(_control_key(parent, settings.study.inherit_steps))
    return InheritFrom(
        parent,
        architecture_of(stored, settings),
        str(path),
        scored(stored.user_attrs, task_metrics(settings.task.name)),
        None if control is None else {k: float(v) for k, v in control.items()},
    )


def record_control(
    study: optuna.Study, parent: int, steps: int, metrics: Mapping[str, float]
) -> None:
    """Keep the control of `parent` (its continuation of `steps` steps) for its later
    children, on every worker of the study."""
    study.set_user_attr(_control_key(parent, steps), dict(metrics))


def estimate(
    parent: Mapping[str, float], child: Mapping[str, float], control: Mapping[str, float]
) -> dict[str, float]:
    """`parent + child - control` for every metric the three share (module doc)."""
    return {
        name: parent[name] + child[name] - control[name]
        for name in parent
        if name in child and name in control
    }


def scored(evaluation: Mapping[str, float], names: Iterable[str]) -> dict[str, float]:
    """The finite metrics `names` of an evaluation (those an estimate adds up)."""
    return {
        name: float(evaluation[name])
        for name in names
        if name in evaluation and math.isfinite(float(evaluation[name]))
    }


def _control_key(parent: int, steps: int) -> str:
    return f"{_CONTROL}:{parent}:{steps}"


def judge(
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline | None,
    child: list[LayerSpec],
    source: InheritFrom,
    edited: tuple[str, ...],
    *,
    comm: Comm,
    record_control: Callable[[dict[str, float]], None],
    cost_cache: CostCache,
) -> tuple[ElasticPipeline, dict[str, float], dict[str, Any]]:
    """(On every rank) a child judged from its parent (module doc, 2. and 3.): the pipeline,
    its evaluation with the estimates in place of the measured metrics, and what to record
    beside them (the measured metrics, the control, the parent)."""
    names = task_metrics(settings.task.name)
    parent = load_snapshot(source.weights, comm.rank, comm.world_size)
    control = source.control
    if control is None:  # 2., once per parent
        arch = from_json(source.architecture)
        specs = training.compile_model(arch, task, settings.train.dropout)[0]
        pipe, evaluation = _continued(settings, task, pipe, specs, parent, source, cost_cache)
        control = scored(evaluation, names)
        record_control(control)
    afresh = edited if settings.study.edited_afresh else ()
    start = parent.without(afresh) if afresh else parent
    pipe, evaluation = _continued(settings, task, pipe, child, start, source, cost_cache)
    measured = scored(evaluation, names)
    attrs = {
        **record(Fidelity.INHERITED),
        **inherited_attrs(source.parent, len(afresh)),
        **{f"measured_{name}": value for name, value in measured.items()},
        **{f"control_{name}": value for name, value in control.items()},
        **difference_attrs(measured, control),
    }
    return pipe, evaluation | estimate(source.metrics, measured, control), attrs


def _continued(
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline | None,
    specs: list[LayerSpec],
    weights: WeightSnapshot,
    source: InheritFrom,
    cost_cache: CostCache,
) -> tuple[ElasticPipeline, dict[str, float]]:
    """`specs` from `weights`, `study.inherit_steps` steps at a schedule of that length on
    the parent's continuation batches, then scored on `train.eval_batches` batches."""
    steps = settings.study.inherit_steps
    schedule = training.rates(settings.train, steps)
    pipe = training.build(
        settings,
        task,
        specs,
        schedule,
        seed=settings.seed,
        pipe=pipe,
        snapshot=weights,
        cost_cache=cost_cache,
    )
    seed = continuation_seed(settings.seed, source.parent)
    batches = training.batches(task, settings.train.batch_size, seed)
    for _ in training.steps(pipe, batches, start=0, count=steps):
        pass
    return pipe, training.evaluate(settings.train, task, pipe, final=False)
