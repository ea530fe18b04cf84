"""What one setting may hold, declared beside its default, for `nas.settings.checks` to ask.

Each constraint says whether a value holds (`holds`) and, when it does not, what would be
valid (`advice`), so a problem is one line: the dotted key, the value and the advice
(`problem`). Choices are read from the registries they name when a value is checked (a
schedule the user registers is then valid); "auto" and null sit beside a number where a
setting may leave it to the profile or to a default.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from pipeline.pure.checks import is_int, is_number
from pipeline.pure.registry import Registry, UnknownName

__all__ = [
    "AUTO",
    "POSITIVE",
    "Constraint",
    "Distinct",
    "Each",
    "Flag",
    "Integer",
    "KnownKeys",
    "Number",
    "OneOf",
    "OrAuto",
    "OrNone",
    "Registered",
    "Subsequence",
    "Text",
    "Verified",
    "seconds",
    "shown",
]

AUTO = "auto"  # a shape value chosen from the profile (`nas.study.shape`)


def shown(value: Any) -> str:
    """`value` as a message shows it: tuples as lists, as YAML and the command line write
    them."""
    return repr(list(value) if isinstance(value, tuple) else value)


class Constraint(ABC):
    """What one setting may hold: `holds` says whether a value does, `advice` what would be
    valid (the words after "is not valid; ")."""

    @abstractmethod
    def holds(self, value: Any) -> bool: ...

    @abstractmethod
    def advice(self) -> str: ...

    def problem(self, key: str, value: Any) -> str | None:
        """What is wrong with `value` at `key`, in one line; None when it holds."""
        if self.holds(value):
            return None
        return f"{key}={shown(value)} is not valid; {self.advice()}"


@dataclass(frozen=True)
class Integer(Constraint):
    """An integer (never a bool) of at least `low` (None: any), a multiple of `step`."""

    low: int | None = 1
    step: int = 1
    words: str = ""  # the advice, where the default does not say what the number is

    def holds(self, value: Any) -> bool:
        return is_int(value) and (self.low is None or value >= self.low) and value % self.step == 0

    def advice(self) -> str:
        if self.words:
            return self.words
        if self.low is None:
            return "use an integer"
        return "it must be a positive integer" if self.low == 1 else f"use an integer >= {self.low}"


POSITIVE = Integer(low=1)


@dataclass(frozen=True)
class Number(Constraint):
    """A real number (never a bool, never NaN) from `low` to `high`; `open_low` and
    `open_high` leave the bound itself out."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    words: str = ""

    def holds(self, value: Any) -> bool:
        if not is_number(value):
            return False
        above = self.low < value if self.open_low else self.low <= value
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def advice(self) -> str:
        if self.words:
            return self.words
        if self.high == math.inf and not self.open_high:
            return f"it must be {'>' if self.open_low else '>='} {self.low:g}"
        left, right = "(" if self.open_low else "[", ")" if self.open_high else "]"
        return f"it must be in {left}{self.low:g}, {self.high:g}{right}"


def seconds(why: str) -> Number:
    """A finite, positive duration; `why`: what the seconds are for, as advice shows it."""
    return Number(0, math.inf, open_low=True, open_high=True, words=f"use seconds > 0 ({why})")


@dataclass(frozen=True)
class OneOf(Constraint):
    """One of the names in `choices`."""

    choices: Collection[str]

    def holds(self, value: Any) -> bool:
        return isinstance(value, str) and value in tuple(self.choices)

    def advice(self) -> str:
        return f"valid values: {', '.join(self.choices)}"


@dataclass(frozen=True, eq=False)  # a registry compares by identity here, never by members
class Registered(Constraint):
    """A member's name in `registry`, read when the value is checked (a member registered
    later is valid), or, where its kind takes users' classes, one by import path: imported
    and checked here, so a typo or a wrong class is refused with the settings."""

    registry: Registry[Any]

    def holds(self, value: Any) -> bool:
        return self.problem("", value) is None

    def advice(self) -> str:
        return self.registry.advice()

    def problem(self, key: str, value: Any) -> str | None:
        if not (isinstance(value, str) and self.registry.accepts(value)):
            return f"{key}={shown(value)} is not valid; {self.advice()}"
        try:
            self.registry.find(value)
        except UnknownName as error:
            return f"{key}={shown(value)} is not valid: {error}"
        return None


@dataclass(frozen=True)
class OrAuto(Constraint):
    """A positive integer, or "auto": chosen from the profile of the study's candidates."""

    def holds(self, value: Any) -> bool:
        return value == AUTO or POSITIVE.holds(value)

    def advice(self) -> str:
        return (
            "use a positive integer or 'auto' (chosen from the profile of the study's candidates)"
        )


@dataclass(frozen=True)
class OrNone(Constraint):
    """Null (`None`), or what `inner` accepts, refused in `inner`'s words."""

    inner: Constraint

    def holds(self, value: Any) -> bool:
        return value is None or self.inner.holds(value)

    def advice(self) -> str:
        inner = self.inner.advice()
        return inner if "null" in inner else f"{inner}, or null"

    def problem(self, key: str, value: Any) -> str | None:
        return None if value is None else self.inner.problem(key, value)


@dataclass(frozen=True)
class Flag(Constraint):
    """true or false."""

    def holds(self, value: Any) -> bool:
        return isinstance(value, bool)

    def advice(self) -> str:
        return "use true or false"


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string."""

    def holds(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value)

    def advice(self) -> str:
        return "use a non-empty string"


@dataclass(frozen=True)
class Each(Constraint):
    """A list whose every item `item` accepts; `non_empty`: at least one item. `words`: the
    advice for the whole list (else the first bad item is named, in `item`'s words)."""

    item: Constraint
    non_empty: bool = False
    words: str = ""

    def holds(self, value: Any) -> bool:
        return (
            isinstance(value, tuple | list)
            and (bool(value) or not self.non_empty)
            and all(self.item.holds(v) for v in value)
        )

    def advice(self) -> str:
        many = "a non-empty list" if self.non_empty else "a list"
        return self.words or f"use {many}, each item: {self.item.advice()}"

    def problem(self, key: str, value: Any) -> str | None:
        if self.holds(value):
            return None
        items = value if isinstance(value, tuple | list) else ()
        bad = [v for v in items if not self.item.holds(v)]
        if self.words or not bad:
            return f"{key}={shown(value)} is not valid; {self.advice()}"
        return f"{key}={shown(value)} has {shown(bad[0])}, which is not valid; {self.item.advice()}"


@dataclass(frozen=True)
class Distinct(Constraint):
    """A list naming no item twice; `words` follow the key and value in the message."""

    words: str = "names an item twice"

    def holds(self, value: Any) -> bool:
        return len(set(value)) == len(value)

    def advice(self) -> str:
        return "name no item twice"

    def problem(self, key: str, value: Any) -> str | None:
        return None if self.holds(value) else f"{key}={shown(value)} {self.words}"


@dataclass(frozen=True)
class Subsequence(Constraint):
    """Some of `order`'s names, each once, in `order`'s order; `words`: the valid lists."""

    order: tuple[str, ...]
    words: str

    def holds(self, value: Any) -> bool:
        if not isinstance(value, tuple | list) or not value:
            return False
        if any(not isinstance(v, str) or v not in self.order for v in value):
            return False
        return list(value) == sorted(set(value), key=self.order.index)

    def advice(self) -> str:
        return self.words


@dataclass(frozen=True)
class KnownKeys(Constraint):
    """A mapping whose keys are among `valid` (e.g. a runtime config's fields)."""

    valid: Collection[str]

    def holds(self, value: Any) -> bool:
        return isinstance(value, dict) and set(value) <= set(self.valid)

    def advice(self) -> str:
        return f"use a mapping of options among {', '.join(self.valid)}"

    def problem(self, key: str, value: Any) -> str | None:
        if not isinstance(value, dict):
            return f"{key}={shown(value)} is not valid; {self.advice()}"
        unknown = sorted(set(value) - set(self.valid))
        if not unknown:
            return None
        return f"{key} has unknown options {unknown}; valid: {', '.join(self.valid)}"


@dataclass(frozen=True)
class Verified(Constraint):
    """Whatever `verify` accepts: it raises ValueError saying what is wrong (its message is
    the problem, the key prefixed where it does not name it). `words`: what is valid."""

    verify: Callable[[Any], object]
    words: str

    def holds(self, value: Any) -> bool:
        return self.problem("", value) is None

    def advice(self) -> str:
        return self.words

    def problem(self, key: str, value: Any) -> str | None:
        try:
            self.verify(value)
        except ValueError as error:
            said = " ".join(str(error).split())
            return said if said.startswith(key) else f"{key}={shown(value)} is not valid: {said}"
        return None
