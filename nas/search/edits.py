"""One-edit mutants of an architecture, drawn at the level of its parameters (its answers).

Regularized evolution (`nas.search.evolution`) makes a child by changing exactly one answer
of its parent and drawing at random whatever the child asks that its parent never did. The
same edit, outside an Optuna study, is what a fidelity benchmark needs (the ET's one-edit
neighbours, trained and ranked) and what composing edits builds on:

    1. replay the parent's answers through the space, recording every question asked and
       its choices (`questions`);
    2. draw one asked name that has another choice, and another value for it;
    3. replay again with that one answer changed; a question only the child asks is
       answered at random (seeded);
    4. keep the child if it is a different network from the parent and from every child
       kept so far (`functional_key`) and the space accepts it (`SearchSpace.validate`:
       inside its parameter window, say).

The space is any configured `search_spaces.SearchSpace` (the harness's is
`nas.study.space.configured_space(settings)`): edits are made on its answers, which every
space asks through `Suggest`, so they need nothing more of it; this module knows no
settings. Pure apart from the space's own code: no Optuna, no processes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from search_spaces import SearchSpace
from search_spaces.architecture import Architecture, InvalidArchitecture, functional_key
from search_spaces.suggest import CategoricalChoice

__all__ = ["Answers", "Edit", "Mutant", "complete", "inside", "mutants", "questions"]


@dataclass(frozen=True)
class Edit:
    """One answer changed: the parameter, its value in the parent and in the child."""

    name: str
    old: CategoricalChoice
    new: CategoricalChoice

    def __str__(self) -> str:
        return f"{self.name}: {self.old!r} -> {self.new!r}"


@dataclass(frozen=True)
class Mutant:
    """A child one edit away from its parent: the edit, its answers and its network."""

    edit: Edit
    params: dict[str, CategoricalChoice]  # every answer the child's replay asked
    architecture: Architecture


class Answers:
    """A `Suggest` that answers from `params`, `changed` first, and at random (`rng`) what
    neither holds, recording every question's choices and every answer given."""

    def __init__(
        self,
        params: Mapping[str, CategoricalChoice],
        rng: random.Random | None = None,
        changed: Mapping[str, CategoricalChoice] | None = None,
    ) -> None:
        self._params, self._rng, self._changed = params, rng, dict(changed or {})
        self.choices: dict[str, list[CategoricalChoice]] = {}
        self.answers: dict[str, CategoricalChoice] = {}

    def suggest_categorical(
        self, name: str, choices: Sequence[CategoricalChoice]
    ) -> CategoricalChoice:
        return self._answer(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int) -> int:
        value = self._answer(name, list(range(low, high + 1)))
        assert isinstance(value, int)
        return value

    def _answer(self, name: str, choices: list[CategoricalChoice]) -> CategoricalChoice:
        if name in self.answers:
            return self.answers[name]
        if name in self._changed:
            value = self._changed[name]
        elif name in self._params and self._params[name] in choices:
            value = self._params[name]
        elif self._rng is not None:
            value = self._rng.choice(choices)
        else:
            raise KeyError(f"no answer for parameter {name!r} and no random source")
        self.choices[name], self.answers[name] = choices, value
        return value


def complete(
    answers: Mapping[str, CategoricalChoice], space: SearchSpace, seed: int
) -> tuple[dict[str, CategoricalChoice], Architecture]:
    """`answers` replayed through `space`, what they lack drawn at random from `seed`: the
    answers the architecture asked (only those) and the architecture."""
    recorder = Answers(answers, random.Random(seed))
    architecture = space.sample(recorder)
    return recorder.answers, architecture


def questions(
    params: Mapping[str, CategoricalChoice], space: SearchSpace
) -> dict[str, list[CategoricalChoice]]:
    """Step 1: every question replaying `params` through `space` asks, with its choices,
    in the order asked."""
    recorder = Answers(params)
    space.sample(recorder)
    return recorder.choices


def mutants(
    params: Mapping[str, CategoricalChoice],
    space: SearchSpace,
    count: int,
    *,
    names: Callable[[str], bool] | None = None,
    seed: int = 0,
    max_draws: int = 2000,
) -> list[Mutant]:
    """Up to `count` distinct one-edit mutants of the architecture `params` answers in
    `space`, each accepted by it (`inside`), in the order drawn (module doc, steps 2-4); fewer when
    `max_draws` edits did not yield `count`. `names`: which parameters may be edited (for
    example only activations), default every one with another choice."""
    if count < 1:
        raise ValueError(f"count={count} is not valid; ask for at least one mutant")
    rng = random.Random(seed)
    asked = questions(params, space)
    parent = {name: params[name] for name in asked}
    editable = [
        name
        for name, choices in asked.items()
        if len(choices) > 1 and (names is None or names(name))
    ]
    if not editable:
        raise ValueError(
            f"the architecture has no answer to edit (of {len(asked)} asked) with another "
            "choice among the names allowed"
        )
    seen = {functional_key(space.sample(Answers(parent)))}
    found: list[Mutant] = []
    for _ in range(max_draws):
        name = rng.choice(editable)
        new = rng.choice([c for c in asked[name] if c != parent[name]])
        recorder = Answers(parent, rng, {name: new})
        child = space.sample(recorder)
        key = functional_key(child)
        if key in seen or not inside(child, space):
            continue
        seen.add(key)
        found.append(Mutant(Edit(name, parent[name], new), recorder.answers, child))
        if len(found) == count:
            break
    return found


def inside(arch: Architecture, space: SearchSpace) -> bool:
    """Whether `space` accepts `arch` (`SearchSpace.validate`: its parameter window, say)."""
    try:
        space.validate(arch)
    except InvalidArchitecture:
        return False
    return True
