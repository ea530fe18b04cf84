"""A study at inherited fidelity: children judged from their parents' weights, across runs."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from nas.study.inherited import WEIGHTS_ARTIFACT
from nas.study.run import run_study
from tests.nas.harness.common import tiny_settings

pytestmark = pytest.mark.multiprocess
STEPS = 2  # study.inherit_steps


def test_children_are_judged_from_their_parents_weights_kept_in_the_artifact_store(
    tmp_path: Path,
) -> None:
    overrides = (
        "study.name=inh",
        "sampler=evolution",
        "study.fidelity=inherited",
        "study.edited_afresh=true",  # the edited branch afresh, the rest from the parent
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
    scratch = [t for t in done if t.user_attrs["fidelity"] == "full"]
    children = [t for t in done if t.user_attrs["fidelity"] == "inherited"]
    assert [t.number for t in scratch[:2]] == [0, 1]  # the seeds have no parent
    assert all(t.user_attrs["steps"] == first.train.steps for t in scratch)
    assert children, [t.user_attrs["fidelity"] for t in done]
    assert any(t.number >= 4 and t.user_attrs["inherited_from"] < 4 for t in children)
    controls: dict[int, set[float]] = {}
    for t in children:
        parent = trials[t.user_attrs["inherited_from"]]
        assert parent.number == t.system_attrs["evolution:parent"]
        assert t.user_attrs["steps"] == STEPS
        assert t.user_attrs["inherited_fresh_tensors"] >= 0
        measured, control = (
            t.user_attrs["measured_validation_loss"],
            t.user_attrs["control_validation_loss"],
        )
        assert t.values[0] == pytest.approx(parent.values[0] + measured - control, abs=1e-12)
        assert t.user_attrs["validation_loss"] == t.values[0]
        # the control: measured once per parent, shared by its children (any run)
        kept = study.user_attrs[f"inherited_control:{parent.number}:{STEPS}"]
        assert kept["validation_loss"] == control
        controls.setdefault(parent.number, set()).add(control)
    assert all(len(values) == 1 for values in controls.values())
