"""Inherited fidelity's pure parts: estimates and settings (no processes)."""

from __future__ import annotations

import pytest

from nas.study.judging import estimate
from tests.nas.harness.common import composed


def test_an_estimate_is_the_parents_metric_moved_by_the_childs_paired_difference() -> None:
    parent = {"validation_loss": 0.70, "validation_accuracy": 0.80}
    child = {"validation_loss": 0.65, "validation_accuracy": 0.85, "validation_s": 3.0}
    control = {"validation_loss": 0.66, "validation_accuracy": 0.83}
    assert estimate(parent, child, control) == pytest.approx(
        {"validation_loss": 0.69, "validation_accuracy": 0.82}
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ("study.fidelity=rungs",),
            "study.fidelity='rungs' is not valid; valid values: full, inherited",
        ),
        (("study.inherit_steps=0",), "study.inherit_steps=0 is not valid"),
        (("study.fidelity=inherited", "study.inherit_weights=true"), "choose one"),
        (("study.promote=maybe",), "override study.promote=maybe"),
        (("study.promote_window=1",), "study.promote_window=1 is not valid"),
    ],
)
def test_inherited_fidelity_settings_are_checked(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception, match=message.replace("(", r"\(")):
        composed(*overrides)
