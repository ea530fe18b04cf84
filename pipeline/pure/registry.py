"""One way to find a part by name, for every kind of part a user chooses or adds.

Schedules, planners, search spaces, samplers, pruners, tasks and trackers are each chosen by
name (`schedule="zbv"`, `sampler=evolution`) and each open to a user's own. One `Registry`
per kind holds its members under their names, in the order they were registered:

    SCHEDULES = Registry("schedule", {"gpipe": gpipe, "1f1b": one_f_one_b, ...})
    SCHEDULES["zbv"]                 # a member by name (`UnknownName` naming the valid ones)
    SCHEDULES.register("mine", spec) # a user's, found by name from then on
    TRACKERS.find("my_pkg.log:Mine") # by name, or a user's class by import path (with a base)
    PRUNERS.build("median", n_warmup_steps=2)  # built, its options checked against its signature
    SAMPLERS.takes("evolution", "proposal_check")  # what a member takes, asked, not assumed

A member may be registered as an import path itself ("nas.tracking.wandb:WandbTracker"),
imported when first asked: a kind's module need not import what only one member needs. A
user's class named by import path must subclass the kind's `base`; it is then known by that
path (`known`), as the built-ins are by name. Every error names the kind, the value and
what would be valid.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownName", "is_import_path"]

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no member of a registry answers to (the message lists the valid ones)."""


def is_import_path(name: object) -> bool:
    """Whether `name` names an attribute by import path ("package.module:Attribute")."""
    if not isinstance(name, str):
        return False
    module, _, attribute = name.partition(":")
    return bool(module) and bool(attribute) and attribute.isidentifier()


class Registry(Mapping[str, T], Generic[T]):
    """The members of one kind of part, by name (module docstring). A read-only mapping of
    the registered names to their members; `register` adds one."""

    def __init__(
        self,
        kind: str,
        members: Mapping[str, T | str] | None = None,
        *,
        base: type | None = None,
    ) -> None:
        """`kind`: what a member is, as errors name it ("sampler"); `members`: name ->
        member, or its import path (imported when first asked); `base`: the class a user's
        class named by import path must subclass (None: members by name only)."""
        self.kind, self.base = kind, base
        self._members: dict[str, T | str] = {}
        self._loaded: dict[str, T] = {}  # users' classes named by import path
        for name, member in (members or {}).items():
            self.register(name, member)

    # -- the mapping of registered names ---------------------------------------------------
    def __getitem__(self, name: str) -> T:
        if name not in self._members:
            raise UnknownName(self._unknown(name))
        member = self._members[name]
        if isinstance(member, str):  # registered by import path: imported now, once
            loaded = self._import(name, member)
            self._members[name] = loaded
            return loaded
        return member

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self._members)})"

    # -- finding, adding, building ---------------------------------------------------------
    def register(self, name: str, member: T | str, *, replace: bool = False) -> None:
        """Add `member` (or its import path) as `name`; a taken name needs `replace=True`."""
        if not isinstance(name, str) or not name or is_import_path(name):
            raise ValueError(f"a {self.kind} needs a plain name to register under, got {name!r}")
        if name in self._members and not replace:
            raise ValueError(f"a {self.kind} named {name!r} is registered; pass replace=True")
        self._members[name] = member

    def unregister(self, name: str) -> None:
        """Remove the member called `name` (a test's own member, once it is done)."""
        if name not in self._members:
            raise UnknownName(self._unknown(name))
        del self._members[name]

    def find(self, name: str) -> T:
        """The member called `name`, or a user's class by import path (module docstring);
        `UnknownName` naming the valid ones otherwise."""
        if name in self._members or not (self.base is not None and is_import_path(name)):
            return self[name]
        if name not in self._loaded:
            self._loaded[name] = self._import(name, name)
        return self._loaded[name]

    def accepts(self, name: object) -> bool:
        """Whether `find(name)` may find a member: a registered name, or, where the kind
        takes users' classes, anything written as an import path (checked when found)."""
        return name in self._members or (self.base is not None and is_import_path(name))

    def known(self) -> dict[str, T]:
        """Every member: the registered ones, then users' classes loaded by import path."""
        return {**{name: self[name] for name in self._members}, **self._loaded}

    def options_of(self, name: str) -> tuple[str, ...]:
        """The keyword options the member called `name` is built with, as its signature
        names them (none for a member without one)."""
        named = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        return tuple(p.name for p in _parameters(self.find(name)).values() if p.kind in named)

    def takes(self, name: str, option: str) -> bool:
        """Whether the member called `name` names `option` among its options (a strategy
        that takes a proposal check, a pruner that takes its top rung: asked, not assumed;
        a catch-all `**options` does not count)."""
        return option in self.options_of(name)

    def check_options(
        self, name: str, options: Mapping[str, Any], *, complete: bool = False
    ) -> None:
        """`TypeError` naming what is wrong when the member called `name` cannot take
        `options` (an unknown one; with `complete`, a required one missing too) and the
        valid ones; nothing is built."""
        member = self.find(name)
        try:
            signature = inspect.signature(member)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # no signature to read (a builtin): building says
            return
        try:
            (signature.bind if complete else signature.bind_partial)(**options)
        except TypeError as error:
            valid = ", ".join(self.options_of(name)) or "none"
            raise TypeError(
                f"bad options for {self.kind} {name!r}: {error}; valid options: {valid}"
            ) from None

    def build(self, name: str, /, **options: Any) -> Any:
        """The member called `name` called with `options`, checked first (`check_options`)."""
        member = self.find(name)
        if not callable(member):
            raise TypeError(f"{self.kind} {name!r} is not built: it is {member!r}")
        self.check_options(name, options, complete=True)
        return member(**options)

    def advice(self) -> str:
        """What a valid name is, as an error message ends."""
        names = ", ".join(self._members) or "none registered"
        plug_in = ", or a class as 'package.module:ClassName'" if self.base is not None else ""
        return f"valid {self.kind}s: {names}{plug_in}"

    # -- helpers ---------------------------------------------------------------------------
    def _unknown(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; {self.advice()}"

    def _import(self, name: str, path: str) -> T:
        """The attribute `path` names, checked against `base` (for a user's class)."""
        if not is_import_path(path):
            raise UnknownName(self._unknown(name))
        module_name, _, attribute = path.partition(":")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise UnknownName(f"{self.kind} {path!r} cannot be imported: {error}") from error
        of_the_kind = self.base is None or (
            isinstance(found, type) and issubclass(found, self.base)
        )
        if name == path and not of_the_kind:  # a user's class: it must be one of the kind
            assert self.base is not None
            raise UnknownName(
                f"{self.kind} {path!r} is not a subclass of "
                f"{self.base.__module__}.{self.base.__qualname__}"
            )
        found_member: T = found
        return found_member


def _parameters(member: Callable[..., Any] | object) -> Mapping[str, inspect.Parameter]:
    """The parameters `member` is called with (none when it has no signature)."""
    try:
        return inspect.signature(member).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return {}
