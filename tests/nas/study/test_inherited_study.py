"""A study at inherited fidelity: children judged from their parents' weights, across runs."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from nas.search.fidelity import Fidelity, fidelity_of
from nas.study.inheritance import INHERITED_FROM
from nas.study.kept_weights import WEIGHTS_ARTIFACT
from nas.study.run import run_study
from tests.nas.harness.common import tiny_settings

pytestmark = pytest.mark.multiprocess
STEPS = 2  # study.inherit_steps


def test_children_are_judged_from_their_parents_weights_and_the_best_trained_in_full(
    tmp_path: Path,
) -> None:
    overrides = (
        "study.name=inh",
        "sampler=evolution",
        "study.fidelity=inherited",
        "seed=1",  # a seed where children beat the seeds: some are promoted
    )
    first = tiny_settings(tmp_path, *overrides, f"study.inherit_steps={STEPS}", "study.n_trials=4")
    run_study(first)
    # a second run on fresh processes: its children's parents were trained by the first
    run_study(
        tiny_settings(tmp_path, *overrides, f"study.inherit_steps={STEPS}", "study.n_trials=7")
    )
    study = optuna.load_study(study_name="inh", storage=first.storage_url)
    trials = study.trials
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 7
    store = tmp_path / "studies" / "artifacts"
    for t in done:  # every complete trial keeps its weights for its children
        assert (store / t.user_attrs[WEIGHTS_ARTIFACT]).is_file()
    scratch = [t for t in done if fidelity_of(t) is Fidelity.FULL]
    children = [t for t in done if fidelity_of(t) is not Fidelity.FULL]
    promoted = [t for t in children if fidelity_of(t) is Fidelity.PROMOTED]
    assert [t.number for t in scratch[:2]] == [0, 1]  # the seeds have no parent
    assert all(t.user_attrs["steps"] == first.train.steps for t in scratch)
    assert children, [fidelity_of(t) for t in done]
    assert any(t.number >= 4 and t.user_attrs[INHERITED_FROM] < 4 for t in children)
    controls: dict[int, set[float]] = {}
    for t in children:
        parent = trials[t.user_attrs[INHERITED_FROM]]
        assert parent.number == t.system_attrs["evolution:parent"]
        assert t.user_attrs["steps"] == STEPS + (first.train.steps if t in promoted else 0)
        assert t.user_attrs["inherited_fresh_tensors"] == 0  # study.edited_afresh=false
        measured, control = (
            t.user_attrs["measured_validation_loss"],
            t.user_attrs["control_validation_loss"],
        )
        difference = t.user_attrs["difference_validation_loss"]
        assert difference == pytest.approx(measured - control, abs=1e-12)
        estimated = t.user_attrs.get("estimated_validation_loss", t.values[0])
        assert estimated == pytest.approx(parent.values[0] + measured - control, abs=1e-12)
        assert t.user_attrs["validation_loss"] == t.values[0]
        # the control: measured once per parent, shared by its children (any run)
        kept = study.user_attrs[f"inherited_control:{parent.number}:{STEPS}"]
        assert kept["validation_loss"] == control
        controls.setdefault(parent.number, set()).add(control)
    assert all(len(values) == 1 for values in controls.values())
    _promotions_by_their_own_difference(study, first.train.steps)
    assert {fidelity_of(t) for t in done} == set(Fidelity)


def _promotions_by_their_own_difference(study: optuna.Study, full_steps: int) -> None:
    """A child is trained again in full exactly when its parent was measured and that
    measurement plus the child's paired difference beats the best fitness measured before
    it (`study.promote_window`, 20, is past these few trials), and that measurement is its
    fitness (one worker: the trials end in number order)."""
    best = math.inf
    promoted = 0
    for t in study.trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        fidelity = fidelity_of(t)
        if fidelity is not Fidelity.FULL:  # a child judged from its parent
            parent = study.trials[t.user_attrs[INHERITED_FROM]]
            difference = t.user_attrs["difference_validation_loss"]
            anchored = fidelity_of(parent).measured and parent.values[0] + difference < best
            assert (fidelity is Fidelity.PROMOTED) == anchored, (t.number, difference, best)
        if fidelity is Fidelity.PROMOTED:
            promoted += 1
            assert t.values[0] == t.user_attrs["validation_loss"]
            assert full_steps in t.intermediate_values  # reported, never pruned
        if fidelity.measured:
            best = min(best, t.values[0])
    assert promoted >= 1, "the seed was chosen so that some child is promoted"
