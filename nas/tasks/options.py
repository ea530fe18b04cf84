"""A task's options as users write them: flat keys, some of them fields of a typed group.

A task's constructor may take related options as one typed, checked group: a keyword
parameter whose default is a dataclass instance (`tokenization: TokenizerOptions =
TokenizerOptions()`). Users still write the group's fields as the task's own options
(`task.options.vocab_size=8000`, `get_task("corpus", vocab_size=8000)`): `arguments`
gathers them into the group, over the parameter's default, so the keys in YAML and on the
command line stay flat whatever the constructor groups.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["accepts_any", "arguments", "groups", "option_names"]


def accepts_any(cls: type) -> bool:
    """Whether `cls` takes any keyword (`**options`), beside those it names."""
    kinds = (p.kind for p in inspect.signature(cls).parameters.values())
    return inspect.Parameter.VAR_KEYWORD in kinds


def groups(cls: type) -> dict[str, Any]:
    """The option groups `cls` takes: parameter name -> its default, a dataclass instance."""
    return {
        name: parameter.default
        for name, parameter in inspect.signature(cls).parameters.items()
        if dataclasses.is_dataclass(parameter.default) and not isinstance(parameter.default, type)
    }


def option_names(cls: type) -> list[str]:
    """The options a user gives `cls`, flat: each group's fields in place of the group."""
    grouped = groups(cls)
    names: list[str] = []
    for name, parameter in inspect.signature(cls).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in grouped:
            names += [f.name for f in dataclasses.fields(grouped[name])]
        else:
            names.append(name)
    return names


def arguments(cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments of `cls` for the flat `options`: the fields of each group given
    are gathered into it (its default with them replaced, checked by the group itself);
    TypeError when a group is given both ways."""
    given = dict(options)
    for name, default in groups(cls).items():
        fields = {f.name for f in dataclasses.fields(default)}
        parts = {key: given.pop(key) for key in sorted(fields & set(given))}
        if not parts:
            continue
        if name in given:
            raise TypeError(f"got {name} and its fields {sorted(parts)}; give one or the other")
        given[name] = dataclasses.replace(default, **parts)
    return given
