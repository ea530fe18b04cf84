"""`nas.search.lineage`: the edits a study measured as improvements, and evolution grafting
them onto other lineages (pure, real Optuna studies)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import IntDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState, create_trial

from nas.search import RegularizedEvolutionSampler
from nas.search.lineage import (
    KEY_GRAFT,
    KEY_MUTATED,
    KEY_MUTATION_APPLIED,
    KEY_PARENT,
    KEY_ROLE,
    improving_edits,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
DIGITS = IntDistribution(0, 9)


def value(made: FrozenTrial) -> float:
    assert made.value is not None
    return made.value


def trial(number: int, value: float, params: dict[str, int], **attrs: Any) -> Any:
    made = create_trial(
        value=value,
        params=params,
        distributions={name: DIGITS for name in params},
        system_attrs=attrs,
    )
    made.number = number
    return made


def test_improving_edits_are_the_children_that_beat_their_parents_best_first() -> None:
    child = {KEY_ROLE: "child"}
    trials = [
        trial(0, 10.0, {"a": 5, "b": 5}),
        trial(1, 7.0, {"a": 2, "b": 5}, **child, **{KEY_PARENT: 0, KEY_MUTATED: "a"}),
        trial(2, 9.0, {"a": 5, "b": 4}, **child, **{KEY_PARENT: 0, KEY_MUTATED: "b"}),
        trial(3, 11.0, {"a": 5, "b": 6}, **child, **{KEY_PARENT: 0, KEY_MUTATED: "b"}),  # worse
        trial(4, 6.0, {"a": 2, "b": 4}, **child, **{KEY_PARENT: 1, KEY_MUTATED: "b"}),  # again b=4
        trial(
            5, 1.0, {"a": 1, "b": 5}, **child, **{KEY_PARENT: 0, KEY_MUTATED: "c"}
        ),  # c never asked
        trial(
            6,
            2.0,
            {"a": 5, "b": 0},
            **child,
            **{KEY_PARENT: 0, KEY_MUTATED: "b"},
            **{KEY_MUTATION_APPLIED: False},
        ),
    ]
    edits = improving_edits(trials, StudyDirection.MINIMIZE)
    assert [(e.name, e.value, e.gain, e.source) for e in edits] == [
        ("a", 2, 3.0, 1),
        ("b", 4, 1.0, 2),  # measured twice (trials 2 and 4): its best gain, the first
    ]
    maximizing = improving_edits(trials, StudyDirection.MAXIMIZE)
    assert [(e.name, e.value, e.gain) for e in maximizing] == [("b", 6, 1.0)]


def test_grafted_children_carry_an_improving_edit_from_another_lineage() -> None:
    """Fitness is the sum of three digits (minimized): lowering one is an improvement, so
    grafts apply edits other children measured, and each child differs from its parent in
    exactly the grafted answer."""

    def objective(t: optuna.Trial) -> float:
        return float(sum(t.suggest_int(name, 0, 9) for name in ("a", "b", "c")))

    sampler = RegularizedEvolutionSampler(4, 2, seed=1, warmup="mutate", graft_rate=0.5)
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial({"a": 9, "b": 9, "c": 9})
    study.optimize(objective, n_trials=40)
    grafted = [t for t in study.trials if KEY_GRAFT in t.system_attrs]
    assert len(grafted) >= 5
    for kid in grafted:
        graft, name = kid.system_attrs[KEY_GRAFT], kid.system_attrs[KEY_MUTATED]
        source = study.trials[graft["source"]]
        source_parent = study.trials[source.system_attrs[KEY_PARENT]]
        assert source.system_attrs[KEY_MUTATED] == name and source.params[name] == graft["value"]
        assert value(source) < value(source_parent)  # an improvement where it was measured
        parent = study.trials[kid.system_attrs[KEY_PARENT]]
        assert kid.params[name] == graft["value"] != parent.params[name]
        assert {n for n in kid.params if kid.params[n] != parent.params[n]} == {name}
    best = min(value(t) for t in study.trials if t.state == TrialState.COMPLETE)
    assert best <= 9.0  # edits stacked: far below the seed's 27
