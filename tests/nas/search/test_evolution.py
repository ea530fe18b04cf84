"""Regularized evolution on real Optuna studies: one mutation per child, ageing, tournaments.

The main space is the Evolved Transformer's own (`search_spaces.evolved_transformer.sample`,
decoder-only, d_model 32, about 70 conditional choices); the objective is a deterministic
function of the choices (the number of identity branches), computed even for architectures
that break a validity rule, so every trial completes and joins the population.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Literal

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from nas.search import RegularizedEvolutionSampler, lineage
from search_spaces.architecture import InvalidArchitecture
from search_spaces.evolved_transformer import sample, seed_params, transformer
from tests.nas.search.common import children, mixed_objective, parent_of

optuna.logging.set_verbosity(optuna.logging.WARNING)

D_MODEL = 32


def skips(params: dict[str, Any]) -> int:
    return sum(1 for k, v in params.items() if k.endswith(".skip") and v is True)


def et_objective(trial: optuna.Trial) -> float:
    # Every choice is asked before validation, so a rejected architecture is complete too.
    with contextlib.suppress(InvalidArchitecture):
        sample(trial, d_model=D_MODEL, decoder_only=True, cells=(1, 2), window=None)
    return float(skips(trial.params))


def value(trial: FrozenTrial) -> float:
    assert trial.value is not None
    return trial.value


def window_at_birth(study: optuna.Study, child: FrozenTrial, size: int) -> list[int]:
    """The population when `child` was born in a sequential study: the last `size`
    COMPLETE trials numbered below it."""
    done = [t.number for t in study.trials if t.state == TrialState.COMPLETE]
    return [n for n in done if n < child.number][-size:]


def test_a_child_differs_from_its_parent_in_exactly_one_choice() -> None:
    sampler = RegularizedEvolutionSampler(population_size=8, sample_size=3, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial(seed_params(transformer(D_MODEL, 4, 0, 2)))  # the paper's warm start
    study.optimize(et_objective, n_trials=50)

    branch_changes = 0
    for child in children(study):
        parent, mutated = parent_of(study, child), child.system_attrs[lineage.KEY_MUTATED]
        # The mutated name is one the parent asked, the child asked it too (it retraces its
        # parent's path up to that name), and gave it another value.
        assert mutated in parent.params and mutated in child.params
        assert child.params[mutated] != parent.params[mutated]
        assert child.system_attrs[lineage.KEY_MUTATION_APPLIED] is True
        # Among the names both asked, exactly that one differs: everything else is copied,
        # including names asked after the mutation on a path that changed.
        shared = child.params.keys() & parent.params.keys()
        assert {k for k in shared if child.params[k] != parent.params[k]} == {mutated}
        # Names asked by one side only exist when the mutation changed a branch; in this space
        # only a branch's skip or layer choice changes which names follow.
        if child.params.keys() != parent.params.keys():
            assert mutated.endswith((".skip", ".layer")), mutated
            branch_changes += 1
    assert len(children(study)) == 50 - 8
    assert 0 < branch_changes < len(children(study))  # both cases were exercised
    assert study.best_value > skips(study.trials[0].params)  # and evolution improves on it


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_every_kind_of_distribution_mutates_within_its_range(storage: str, tmp_path: Path) -> None:
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    sampler = RegularizedEvolutionSampler(population_size=5, sample_size=2, seed=1)
    study = optuna.create_study(storage=url, sampler=sampler)
    study.optimize(mixed_objective, n_trials=60 if storage == "memory" else 25)
    mutated = set()
    for child in children(study):
        parent, name = parent_of(study, child), child.system_attrs[lineage.KEY_MUTATED]
        assert child.params.keys() == parent.params.keys()  # no branches here
        assert [k for k in child.params if child.params[k] != parent.params[k]] == [name]
        mutated.add(name)
    every = {"cat", "int", "int_step", "int_log", "float", "float_log", "float_step"}
    assert mutated == every if storage == "memory" else mutated <= every  # never "single"
    for t in study.trials:  # within range, on the grid (Optuna would reject it otherwise)
        assert t.params["int_step"] % 3 == 0 and 1 <= t.params["int_log"] <= 1024
        assert t.params["float_step"] in (0.0, 0.25, 0.5, 0.75, 1.0)


def test_population_ages_and_tournaments_draw_from_it() -> None:
    size, tournament_size = 6, 3
    sampler = RegularizedEvolutionSampler(size, tournament_size, seed=2)

    def objective(trial: optuna.Trial) -> float:
        value = mixed_objective(trial)
        if trial.number % 5 == 4:  # pruned trials never join the population
            raise optuna.TrialPruned()
        return value

    expected: list[int] = []  # ageing by hand: a first-in first-out queue of size `size`

    def check(study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state == TrialState.COMPLETE:
            expected.append(trial.number)
            if len(expected) > size:
                expected.pop(0)  # the oldest leaves
        assert [t.number for t in sampler.population(study)] == expected

    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=40, callbacks=[check])
    assert [t.number for t in sampler.population(study)] == [32, 33, 35, 36, 37, 38]

    roles = [t.system_attrs[lineage.KEY_ROLE] for t in study.trials]
    assert roles[:7] == ["warmup"] * 7  # 6 complete trials take 7 (trial 4 is pruned)
    assert set(roles[7:]) == {"child"}
    for child in children(study):
        window = window_at_birth(study, child, size)
        drawn = child.system_attrs[lineage.KEY_TOURNAMENT]
        assert len(drawn) == len(set(drawn)) == tournament_size
        assert set(drawn) <= set(window)
        assert child.system_attrs[lineage.KEY_PARENT] in drawn


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_the_tournament_picks_its_best_member(direction: Literal["minimize", "maximize"]) -> None:
    sampler = RegularizedEvolutionSampler(population_size=6, sample_size=3, seed=3)
    study = optuna.create_study(direction=direction, sampler=sampler)
    study.optimize(mixed_objective, n_trials=40)
    best = min if direction == "minimize" else max
    for child in children(study):
        drawn = [study.trials[n] for n in child.system_attrs[lineage.KEY_TOURNAMENT]]
        parent = study.trials[child.system_attrs[lineage.KEY_PARENT]]  # ties: any best member
        assert parent.number in {t.number for t in drawn}
        assert value(parent) == value(best(drawn, key=value))

    # With the whole population in the tournament, the parent is the population's best.
    everyone = RegularizedEvolutionSampler(population_size=5, sample_size=5, seed=4)
    study = optuna.create_study(direction=direction, sampler=everyone)
    study.optimize(mixed_objective, n_trials=30)
    for child in children(study):
        window = [study.trials[n] for n in window_at_birth(study, child, 5)]
        parent = study.trials[child.system_attrs[lineage.KEY_PARENT]]
        assert parent.number in {t.number for t in window}
        assert value(parent) == value(best(window, key=value))


def test_a_member_the_study_passes_over_is_a_parent_only_when_every_member_is() -> None:
    """A member whose weights its children cannot start from (`lineage.passed_over_key`:
    lost or damaged for now) loses its tournaments to the next best member, unless every
    member is passed over; once its weights are back (False), it wins again."""
    sampler = RegularizedEvolutionSampler(population_size=5, sample_size=5, seed=4)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed_objective, n_trials=5)  # the first population: the tournament

    def parent_of_next() -> int:
        trial = study.ask()
        study.tell(trial, state=TrialState.FAIL)  # the population stays as it is
        return int(study.trials[trial.number].system_attrs[lineage.KEY_PARENT])

    ranked = sorted(study.trials, key=value)
    study.set_user_attr(lineage.passed_over_key(ranked[0].number), True)
    assert parent_of_next() == ranked[1].number
    for member in ranked:
        study.set_user_attr(lineage.passed_over_key(member.number), True)
    assert parent_of_next() == ranked[0].number
    for member in ranked:
        study.set_user_attr(lineage.passed_over_key(member.number), member is not ranked[0])
    assert parent_of_next() == ranked[0].number


def test_a_tournament_of_passed_over_members_is_drawn_again_among_the_others() -> None:
    """With every member but one passed over, every child descends from that one: a
    tournament without it is drawn again among the members not passed over."""
    sampler = RegularizedEvolutionSampler(population_size=6, sample_size=2, seed=7)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed_objective, n_trials=6)
    keeper = max(study.trials, key=value)  # the worst: it wins no tournament on its merits
    for member in study.trials:
        study.set_user_attr(lineage.passed_over_key(member.number), member.number != keeper.number)
    for _ in range(8):
        trial = study.ask()
        study.tell(trial, state=TrialState.FAIL)  # the population stays as it is
        assert study.trials[trial.number].system_attrs[lineage.KEY_PARENT] == keeper.number


def test_multi_objective_studies_select_on_the_first_objective() -> None:
    sampler = RegularizedEvolutionSampler(population_size=6, sample_size=4, seed=5)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
    # The objectives disagree on every pair of trials: the second prefers the smaller value.
    study.optimize(lambda t: (mixed_objective(t), mixed_objective(t)), n_trials=30)
    assert children(study)
    for child in children(study):
        drawn = [study.trials[n] for n in child.system_attrs[lineage.KEY_TOURNAMENT]]
        parent = study.trials[child.system_attrs[lineage.KEY_PARENT]]
        assert parent.values[0] == max(t.values[0] for t in drawn)


def test_feasible_trials_beat_infeasible_ones() -> None:
    sampler = RegularizedEvolutionSampler(population_size=6, sample_size=6, seed=6)

    def objective(trial: optuna.Trial) -> float:
        value = mixed_objective(trial)
        trial.set_constraint("memory", value - 17.0)  # feasible: value <= 17
        return value

    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=30)
    overruled = 0  # children whose window's best value was infeasible
    for child in children(study):
        window = [study.trials[n] for n in window_at_birth(study, child, 6)]
        feasible = [t for t in window if value(t) <= 17.0]
        if feasible:  # the best feasible trial
            expected = max(feasible, key=value)
            overruled += max(window, key=value) is not expected
        else:  # the least violation: the smallest value
            expected = min(window, key=value)
        assert child.system_attrs[lineage.KEY_PARENT] == expected.number
    assert overruled > 0
