"""Where an architecture's choices come from: an Optuna trial, a fixed dict, or a seeded RNG.

Search spaces are written define-by-run against `Suggest`, the two methods of
`optuna.Trial` they use, so this package never imports optuna (docs/design.md, section 2). The
same `sample` function then serves three callers:

* the NAS harness passes an `optuna.Trial` (it satisfies `Suggest` structurally);
* `FixedSuggest` replays a dict of parameters, e.g. a seed architecture's `seed_params`,
  the same dict `study.enqueue_trial` takes;
* `RandomSuggest` draws uniformly with a seed, for tests and for quick random search.

`choose` wraps `suggest_categorical` so callers get back the element of their own choices,
with its type, and a clear error when a trial answers something else.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from pipeline.pure.checks import is_number

__all__ = ["CategoricalChoice", "FixedSuggest", "RandomSuggest", "Suggest", "choose"]

CategoricalChoice = None | bool | int | float | str  # what optuna accepts in a categorical
T = TypeVar("T", bound=CategoricalChoice)


@runtime_checkable
class Suggest(Protocol):
    """The subset of `optuna.Trial` a search space may call."""

    def suggest_categorical(
        self, name: str, choices: Sequence[CategoricalChoice]
    ) -> CategoricalChoice: ...

    def suggest_int(self, name: str, low: int, high: int) -> int: ...


def _match(value: object, choices: Sequence[T]) -> T | None:
    """The element of `choices` equal to `value` (bools only match bools), else None."""
    for choice in choices:
        if isinstance(value, bool) != isinstance(choice, bool):
            continue
        if type(value) is type(choice) and value == choice:
            return choice
    for choice in choices:  # 1 matches 1.0: JSON and YAML do not keep the difference
        numeric = (int, float)
        if (
            isinstance(value, numeric)
            and isinstance(choice, numeric)
            and not isinstance(value, bool)
            and not isinstance(choice, bool)
            and value == choice
        ):
            return choice
    return None


def choose(suggest: Suggest, name: str, choices: Sequence[T]) -> T:
    """`suggest.suggest_categorical(name, choices)`, typed as the element of `choices`."""
    if not choices:
        raise ValueError(f"parameter {name!r} has no choices")
    value = suggest.suggest_categorical(name, list(choices))
    match = _match(value, choices)
    if match is None:
        raise ValueError(f"parameter {name!r}: got {value!r}, not one of {list(choices)}")
    return match


class FixedSuggest:
    """Answers every question from a dict {parameter name: value}.

    Raises KeyError naming a parameter the dict lacks, and ValueError when a value is not
    among the choices (or outside [low, high]). `used` lists the names asked so far, so a
    caller can check that a dict had no stray entries (`unused()`).
    """

    def __init__(self, params: Mapping[str, CategoricalChoice]) -> None:
        self.params = dict(params)
        self.used: list[str] = []

    def _get(self, name: str) -> CategoricalChoice:
        if name not in self.params:
            known = ", ".join(sorted(self.params)) or "none"
            raise KeyError(f"no fixed value for parameter {name!r} (fixed parameters: {known})")
        if name not in self.used:
            self.used.append(name)
        return self.params[name]

    def suggest_categorical(
        self, name: str, choices: Sequence[CategoricalChoice]
    ) -> CategoricalChoice:
        value = self._get(name)
        match = _match(value, choices)
        if match is None and not (value is None and None in choices):
            raise ValueError(
                f"fixed value {value!r} of parameter {name!r} is not among its choices "
                f"{list(choices)}"
            )
        return match

    def suggest_int(self, name: str, low: int, high: int) -> int:
        value = self._get(name)
        if not is_number(value) or value != int(value):
            raise ValueError(f"fixed value {value!r} of parameter {name!r} is not an integer")
        if not low <= value <= high:
            raise ValueError(
                f"fixed value {value!r} of parameter {name!r} is outside [{low}, {high}]"
            )
        return int(value)

    def unused(self) -> list[str]:
        """The fixed parameters nobody asked for (a replay that should use all of them)."""
        return [name for name in self.params if name not in self.used]


class RandomSuggest:
    """Uniform random answers from `random.Random(seed)`; `.params` records them in order.

    Asking the same name twice returns the first answer, as an Optuna trial does.
    """

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)
        self.params: dict[str, CategoricalChoice] = {}

    def suggest_categorical(
        self, name: str, choices: Sequence[CategoricalChoice]
    ) -> CategoricalChoice:
        if name not in self.params:
            self.params[name] = self.rng.choice(list(choices))
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        if name not in self.params:
            self.params[name] = self.rng.randint(low, high)
        value = self.params[name]
        assert isinstance(value, int)
        return value
