"""The candidates of `fidelity.py`: mutants of seed models, one or two edits away.

Why it exists: `fidelity.py` is the entry point (the truth, the rungs, the agreement); which
candidates it measures, and how they are drawn, is their own concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nas.retrain.stage import Model
from nas.search.edits import Edit, Mutant, mutants
from nas.settings import NasSettings
from nas.study.space import configured_space
from search_spaces.architecture import to_json

KEEPS_SHAPES = ("activation", "input", "combiner")  # the edits drawn as "keeping shapes"


@dataclass(frozen=True)
class Drawn:
    """A candidate: its model, the seed model it was drawn from (every difference is from
    it), and its one or two edits of that parent."""

    model: Model
    parent: str
    edits: tuple[Edit, ...]

    @property
    def kind(self) -> str:
        if len(self.edits) > 1:
            return "two edits"
        keeps = self.edits[0].name.rsplit(".", 1)[-1] in KEEPS_SHAPES
        return "keeps shapes" if keeps else "changes shapes"


def draw(
    settings: NasSettings, count: int, seed: int, parents: list[str], two_edit_share: float
) -> tuple[dict[str, Model], list[Drawn]]:
    """The parents (seed models by name) and `count` distinct mutants shared out among
    them: of each parent's, `two_edit_share` two edits away, the rest one edit away, half of
    those keeping shapes (an activation, an input, a combiner), half changing them."""
    space = configured_space(settings)
    offered = space.named_seeds()
    unknown = [name for name in parents if name not in offered]
    if unknown:
        raise SystemExit(f"--parents {unknown}: not seeds of the space ({', '.join(offered)})")
    models = {
        name: Model(name, None, space.seed_params(offered[name]), to_json(offered[name]))
        for name in parents
    }
    seen = {to_json(offered[name]) for name in parents}
    drawn: list[Drawn] = []
    for i, name in enumerate(parents):
        share = count // len(parents) + (1 if i < count % len(parents) else 0)
        two = round(share * two_edit_share)
        for mutant, edits in _mutants_of(space, models[name].params, share - two, two, seed):
            text = to_json(mutant.architecture)
            if text not in seen:
                seen.add(text)
                label = f"m{len(drawn):02d} {name}: " + "; ".join(str(e) for e in edits)
                drawn.append(Drawn(Model(label, None, dict(mutant.params), text), name, edits))
    return models, drawn


def _mutants_of(
    space: Any, params: dict[str, Any], one: int, two: int, seed: int
) -> list[tuple[Mutant, tuple[Edit, ...]]]:
    """`one` one-edit mutants of the answers `params` (half of each kind) and `two`
    two-edit ones (a one-edit mutant edited once more), with their edits."""

    def kind(keeps: bool) -> Any:
        return lambda name: (name.rsplit(".", 1)[-1] in KEEPS_SHAPES) == keeps

    found: list[tuple[Mutant, tuple[Edit, ...]]] = []
    if one:
        half = one // 2
        singles = mutants(params, space, max(1, half), names=kind(True), seed=seed)[:half]
        singles += mutants(params, space, one - half, names=kind(False), seed=seed)
        found += [(m, (m.edit,)) for m in singles]
    if two:
        firsts = mutants(params, space, two, seed=seed + 1)
        for i, first in enumerate(firsts):
            second = mutants(first.params, space, 1, seed=seed + 2 + i)[0]
            found.append((second, (first.edit, second.edit)))
    return found
