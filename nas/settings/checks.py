"""One validator checks every setting: the constraints declared on the fields, and the rules.

A settings dataclass (`Settings`) declares what each field may hold beside its default,
`setting(60, POSITIVE)` (the constraints: `nas.settings.constraints`). `check` walks a
settings object and every settings object it holds, asks each field's constraints, then the
object's cross-field `rules` (short named methods, for what a field alone cannot say), and
raises one `SettingsError` listing every problem, each one line naming the dotted key the
user writes (`study.n_trials`), the bad value and what would be valid. The same declarations
tell the CLI what a key takes when OmegaConf refuses a value's type while composing
(`what_is_valid`) and which keys a part has (`keys_of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import Field, field, fields, is_dataclass
from typing import Any, ClassVar, get_type_hints

from nas.settings.constraints import Constraint

__all__ = [
    "Settings",
    "SettingsError",
    "check",
    "declared",
    "keys_of",
    "problems",
    "setting",
    "what_is_valid",
]

CHECKS = "checks"  # the field metadata holding its constraints
KEY = "key"  # the field metadata holding the key users write, when not the dotted name


class SettingsError(ValueError):
    """Settings that cannot run: `problems` holds one line per problem, each naming its key,
    the bad value and what would be valid."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


def declared(*checks: Constraint, key: str | None = None) -> dict[str, Any]:
    """The field metadata declaring `checks`, checked in order (the first that fails is the
    field's problem); `key`: the key users write, where it is not the dotted name (`sampler`
    for `sampler.name`). For a field made by a factory: `field(default_factory=dict,
    metadata=declared(...))`."""
    return {CHECKS: checks, KEY: key}


def setting(default: Any, *checks: Constraint, key: str | None = None) -> Any:
    """A settings field with its `default` and the constraints its value must meet
    (`declared`)."""
    return field(default=default, metadata=declared(*checks, key=key))


class Settings:
    """A settings dataclass: checked whole when made, `dataclasses.replace` included.

    `section` is the dotted key of its part ("study"; "" for the whole run). `rules` are its
    cross-field checks, run once every field holds."""

    section: ClassVar[str] = ""
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # every subclass is a dataclass

    def __post_init__(self) -> None:
        check(self)

    def rules(self) -> Iterable[str | None]:
        """The cross-field rules: each a problem (one line) or None."""
        return ()


def _key(settings: Settings, spec: Field[Any]) -> str:
    named = spec.metadata.get(KEY)
    if named:
        return str(named)
    return f"{settings.section}.{spec.name}" if settings.section else spec.name


def problems(settings: Settings) -> list[str]:
    """Every problem of `settings` and of the settings it holds: per field, the first of its
    constraints that fails; then, if every field holds, its cross-field rules."""
    found: list[str] = []
    for spec in fields(settings):
        value = getattr(settings, spec.name)
        if isinstance(value, Settings):
            found += problems(value)
            continue
        for constraint in spec.metadata.get(CHECKS, ()):
            problem = constraint.problem(_key(settings, spec), value)
            if problem:
                found.append(problem)
                break
    if not found:
        found = [problem for problem in settings.rules() if problem]
    return found


def check(settings: Settings) -> None:
    """`SettingsError` listing every problem of `settings` (`problems`), if any."""
    found = problems(settings)
    if found:
        raise SettingsError(found)


def _part_at(root: type, dotted: str) -> type | None:
    """The settings class of the part at `dotted` under the settings class `root` (""
    for `root`); None where `dotted` names no part (a leaf, a mapping such as
    `task.options`, nothing)."""
    cls: Any = root
    for part in filter(None, dotted.split(".")):
        if not is_dataclass(cls):
            return None
        cls = get_type_hints(cls).get(part)
    return cls if is_dataclass(cls) and isinstance(cls, type) else None


def what_is_valid(root: type, dotted: str) -> str | None:
    """What the setting at `dotted` under `root` takes, in its constraints' words; None when
    it declares none (or is no setting)."""
    part, _, name = dotted.rpartition(".")
    cls = _part_at(root, part)
    spec = next((f for f in fields(cls) if f.name == name), None) if cls else None
    checks = spec.metadata.get(CHECKS, ()) if spec is not None else ()
    return "; ".join(c.advice() for c in checks) or None


def keys_of(root: type, dotted: str) -> tuple[str, ...]:
    """The keys of the settings part at `dotted` under `root` ("" for `root` itself); ()
    where `dotted` names no settings part."""
    cls = _part_at(root, dotted)
    return tuple(f.name for f in fields(cls)) if cls else ()
