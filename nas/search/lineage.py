"""The lineage evolution records in a study, and the edits in it that improved a model.

Every trial of regularized evolution (`nas.search.evolution`) records its role, its parent,
the parameter it mutated and more as system attributes (the `KEY_*` names below), visible in
the storage, dashboards and trackers. Regularized evolution changes one answer of a parent
per child, so two good edits found in different lineages never meet in one model. Each
complete child of a complete parent is a measurement of one edit: trained with the study's
seed (the same initialisation seed and data order as its parent), its fitness minus its
parent's is that edit's paired effect on that parent. `improving_edits` lists the edits that
helped, best first; evolution grafts one onto another lineage's parent
(`RegularizedEvolutionSampler(graft_rate=...)`), so a search can stack edits it measured
apart. Pure: trials in, edits out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

__all__ = [
    "KEY_GRAFT",
    "KEY_MUTATED",
    "KEY_MUTATION_APPLIED",
    "KEY_PARENT",
    "KEY_PROPOSAL",
    "KEY_ROLE",
    "KEY_TOURNAMENT",
    "Graft",
    "improving_edits",
    "passed_over",
    "passed_over_key",
]

# Trial system attributes the evolution sampler writes.
KEY_ROLE = "evolution:role"  # "seed" (enqueued), "warmup" or "child"
KEY_PARENT = "evolution:parent"  # the parent's trial number (children only)
KEY_MUTATED = "evolution:mutated"  # the name of the mutated parameter (None: nothing mutable)
KEY_TOURNAMENT = "evolution:tournament"  # trial numbers of the tournament, in draw order
KEY_MUTATION_APPLIED = "evolution:mutation_applied"  # whether the child asked the mutated name
KEY_PROPOSAL = "evolution:proposal"  # a checked child's every answer (`ProposalCheck`)
KEY_GRAFT = "evolution:graft"  # a grafted edit's {"source": trial, "value": its value}


def passed_over_key(number: int) -> str:
    """The study's user attribute that, True, asks evolution to pass over trial `number` as
    a parent while another member of its tournament can be one: whoever trains its children
    cannot start them from its weights for now (lost, or refused as damaged), so a child of
    it would train from scratch at the full budget; False once they can again."""
    return f"evolution:passed_over:{number}"


def passed_over(study_attrs: dict[str, Any], number: int) -> bool:
    """Whether the study's attributes `study_attrs` pass over trial `number` as a parent."""
    return bool(study_attrs.get(passed_over_key(number)))


@dataclass(frozen=True)
class Graft:
    """One measured edit: the parameter, the value it took, how much it improved the first
    objective over the parent (> 0, in the study's direction) and the child that measured it."""

    name: str
    value: Any
    gain: float
    source: int


def improving_edits(trials: Sequence[FrozenTrial], direction: StudyDirection) -> list[Graft]:
    """The edits of complete children that beat their complete parents, best gain first;
    an edit measured several times (the same name and value) keeps its best gain."""
    complete = {t.number: t for t in trials if t.state == TrialState.COMPLETE and t.values}
    sign = 1.0 if direction == StudyDirection.MINIMIZE else -1.0
    best: dict[tuple[str, str], Graft] = {}
    for child in complete.values():
        attrs = child.system_attrs
        parent = complete.get(attrs.get(KEY_PARENT, -1))
        name = attrs.get(KEY_MUTATED)
        if attrs.get(KEY_ROLE) != "child" or parent is None or name not in child.params:
            continue
        if attrs.get(KEY_MUTATION_APPLIED) is False:
            continue
        gain = sign * (parent.values[0] - child.values[0])
        if not math.isfinite(gain) or gain <= 0:
            continue
        edit = Graft(name, child.params[name], gain, child.number)
        key = (name, repr(edit.value))
        if key not in best or gain > best[key].gain:
            best[key] = edit
    return sorted(best.values(), key=lambda g: (-g.gain, g.source))
