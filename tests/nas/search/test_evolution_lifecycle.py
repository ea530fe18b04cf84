"""Regularized evolution's life in a study: enqueued seeds, the warm-up, what a trial
records, pickling, proposals a check refuses, bad arguments, trials that never finish.

The objectives are deterministic functions of the choices (`tests.nas.search.common`), so
two studies with one seed compare trial by trial.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from nas.search import RegularizedEvolutionSampler, lineage
from tests.nas.search.common import children, mixed_objective, parent_of

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_enqueued_seeds_pass_through_while_breeding() -> None:
    sampler = RegularizedEvolutionSampler(population_size=5, sample_size=2, seed=7)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed_objective, n_trials=10)
    fixed = {
        "cat": None,
        "int": 2,
        "int_step": 9,
        "int_log": 7,
        "float": 0.5,
        "float_log": 0.01,
        "float_step": 0.25,
        "single": 5,
    }
    study.enqueue_trial(fixed)
    study.enqueue_trial({"cat": "y"})  # partial: the rest comes from the warm-up sampler
    study.optimize(mixed_objective, n_trials=3)
    seed, partial, child = study.trials[10:]
    assert seed.params == fixed and seed.system_attrs[lineage.KEY_ROLE] == "seed"
    assert partial.params["cat"] == "y" and partial.system_attrs[lineage.KEY_ROLE] == "seed"
    assert (
        lineage.KEY_PARENT not in seed.system_attrs
        and lineage.KEY_PARENT not in partial.system_attrs
    )
    assert child.system_attrs[lineage.KEY_ROLE] == "child"


def test_warm_up_uses_the_given_sampler() -> None:
    plain = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=11))
    plain.optimize(mixed_objective, n_trials=4)
    warmup = optuna.samplers.RandomSampler(seed=11)
    sampler = RegularizedEvolutionSampler(4, 2, seed=0, warmup_sampler=warmup)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed_objective, n_trials=6)
    assert [t.params for t in study.trials[:4]] == [t.params for t in plain.trials]
    assert [t.system_attrs[lineage.KEY_ROLE] for t in study.trials[3:]] == [
        "warmup",
        "child",
        "child",
    ]


def test_a_mutating_warm_up_grows_the_first_population_from_the_seeds() -> None:
    sampler = RegularizedEvolutionSampler(4, 3, seed=0, warmup="mutate")
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial(
        {
            "cat": "x",
            "int": 1,
            "int_step": 3,
            "int_log": 8,
            "float": 0.0,
            "float_log": 0.01,
            "float_step": 0.5,
            "single": 5,
        }
    )
    study.optimize(mixed_objective, n_trials=5)
    roles = [t.system_attrs[lineage.KEY_ROLE] for t in study.trials]
    assert roles == ["seed", "child", "child", "child", "child"]
    first = study.trials[1]  # a one-member population: the seed is the parent
    assert first.system_attrs[lineage.KEY_PARENT] == 0 and first.system_attrs[
        lineage.KEY_TOURNAMENT
    ] == [0]
    assert all(len(t.system_attrs[lineage.KEY_TOURNAMENT]) <= 3 for t in study.trials[1:])


def test_a_warm_up_mode_must_be_known() -> None:
    with pytest.raises(ValueError, match="warmup='grow' is not valid; valid: sample, mutate"):
        RegularizedEvolutionSampler(warmup="grow")


def test_a_mutated_name_the_child_never_asks_is_recorded() -> None:
    asks_b = [True]

    def objective(trial: optuna.Trial) -> float:  # not a function of its answers alone
        a = trial.suggest_int("a", 0, 9)
        b = trial.suggest_int("b", 0, 9) if asks_b[0] else 0
        return float(a + b)

    sampler = RegularizedEvolutionSampler(population_size=3, sample_size=2, seed=8)
    study = optuna.create_study(sampler=sampler)
    study.optimize(objective, n_trials=3)
    asks_b[0] = False
    study.optimize(objective, n_trials=12)
    skipped = [c for c in children(study) if c.system_attrs[lineage.KEY_MUTATED] == "b"]
    assert skipped and all(c.system_attrs[lineage.KEY_MUTATION_APPLIED] is False for c in skipped)
    for c in skipped:  # nothing mutated, so it is its parent's copy on what it asked
        assert c.params == {"a": parent_of(study, c).params["a"]}


def test_same_seed_same_study_and_the_sampler_pickles_mid_trial() -> None:
    def run() -> list[dict[str, Any]]:
        study = optuna.create_study(sampler=RegularizedEvolutionSampler(5, 2, seed=9))
        study.optimize(mixed_objective, n_trials=20)
        return [t.params for t in study.trials]

    assert run() == run()

    sampler = RegularizedEvolutionSampler(5, 2, seed=10)
    study = optuna.create_study(sampler=sampler)
    study.optimize(mixed_objective, n_trials=5)
    trial = study.ask()  # a child: its plan is made in before_trial
    trial.suggest_categorical("cat", ["x", "y", None, 3])
    # A fresh instance (another process, an unpickled copy) finishes the trial from the
    # plan stored in the trial's system attributes.
    study.sampler = RegularizedEvolutionSampler(5, 2, seed=99)
    study.tell(trial, mixed_objective(trial))
    child = study.trials[-1]
    parent, name = parent_of(study, child), child.system_attrs[lineage.KEY_MUTATED]
    assert [k for k in child.params if child.params[k] != parent.params[k]] == [name]

    copy = pickle.loads(pickle.dumps(sampler))
    copy.reseed_rng()
    study.sampler = copy
    study.optimize(mixed_objective, n_trials=2)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)


def test_a_checked_child_is_drawn_again_until_accepted_and_answers_its_proposal() -> None:
    """The check refuses every child whose `a` is odd and completes `c`, which only a child
    with `a` >= 5 asks, to 7: every child is even and answers exactly its proposal."""
    seen: list[dict[str, Any]] = []

    def check(study: optuna.Study, trial: Any, answers: Any, seed: int) -> dict[str, Any] | None:
        seen.append(dict(answers))
        if answers["a"] % 2:
            return None
        return {**{k: answers[k] for k in ("a", "b")}, **({"c": 7} if answers["a"] >= 5 else {})}

    def objective(trial: optuna.Trial) -> float:
        a, b = trial.suggest_int("a", 0, 9), trial.suggest_int("b", 0, 9)
        c = trial.suggest_int("c", 0, 9) if a >= 5 else 0
        return float(a + b + c)

    sampler = RegularizedEvolutionSampler(3, 2, seed=4, warmup="mutate", proposal_check=check)
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial({"a": 4, "b": 4})
    study.optimize(objective, n_trials=25)
    kids = children(study)
    assert len(kids) == 24 and any(answers["a"] % 2 for answers in seen)  # some refused
    for kid in kids:
        assert kid.params == kid.system_attrs[lineage.KEY_PROPOSAL] and kid.params["a"] % 2 == 0
        assert kid.params.get("c", 7) == 7


def test_a_child_no_draw_passes_is_proposed_unchecked() -> None:
    calls = []

    def refuse(study: optuna.Study, trial: Any, answers: Any, seed: int) -> None:
        calls.append(seed)

    sampler = RegularizedEvolutionSampler(1, 1, seed=0, proposal_check=refuse, max_proposals=3)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: float(t.suggest_int("a", 0, 9)), n_trials=4)
    kids = children(study)
    assert len(kids) == 3 and len(calls) == 9  # 3 draws each, then as without a check
    assert all(lineage.KEY_PROPOSAL not in kid.system_attrs for kid in kids)
    assert all(kid.params["a"] != parent_of(study, kid).params["a"] for kid in kids)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"population_size": 0}, "population_size must be a positive integer, got 0"),
        ({"max_proposals": 0}, "max_proposals must be a positive integer, got 0"),
        ({"population_size": 2.5}, "population_size must be a positive integer, got 2.5"),
        ({"sample_size": True}, "sample_size must be a positive integer, got True"),
        ({"population_size": 3, "sample_size": 4}, r"sample_size \(4\) must not exceed"),
        ({"seed": "1"}, "seed must be an integer or None, got '1'"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RegularizedEvolutionSampler(**kwargs)


def test_a_warmup_sampler_must_be_a_sampler() -> None:
    with pytest.raises(TypeError, match="warmup_sampler must be an optuna sampler, got str"):
        RegularizedEvolutionSampler(warmup_sampler="random")  # type: ignore[arg-type]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_trials_that_never_finish_leave_no_plans_behind(storage: str, tmp_path: Path) -> None:
    sampler = RegularizedEvolutionSampler(5, 2, seed=3)
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(sampler=sampler, storage=url)
    study.optimize(mixed_objective, n_trials=5)  # the first population: children from here
    assert sampler.pending_plans == 0  # a told trial forgets its plan
    keeper = study.ask()  # a child that runs throughout
    keeper.suggest_categorical("cat", ["x", "y", None, 3])
    abandoned = [study.ask() for _ in range(10)]  # asked, never told: their workers died
    assert sampler.pending_plans == 11  # running trials keep theirs
    for trial in abandoned:  # the harness fails them through the storage
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    for _ in range(30):  # and so on, each new trial failed the same way
        trial = study.ask()
        trial.suggest_int("int", 0, 4)
        assert sampler.pending_plans == 2  # the keeper's and this one's
        study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
    # The keeper still copies its parent except in the one mutated name.
    study.tell(keeper, mixed_objective(keeper))
    child = study.trials[keeper.number]
    assert child.system_attrs[lineage.KEY_ROLE] == "child"
    parent, name = parent_of(study, child), child.system_attrs[lineage.KEY_MUTATED]
    assert [k for k in child.params if child.params[k] != parent.params[k]] == [name]
    study.ask()
    assert sampler.pending_plans == 1  # only the trial just begun
