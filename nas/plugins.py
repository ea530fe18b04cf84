"""A user's own parts, named by import path: `tracker.name=my_pkg.trackers:MyTracker`.

The built-in choices of a config group (`sampler=tpe`, `tracker=wandb`, ...) cover the
common cases; a user with their own logger or sampler names its class as
`"package.module:ClassName"` instead, and the harness builds it with the group's `options`,
the way the built-ins are built. The class must subclass the group's base (`Tracker`,
`optuna.samplers.BaseSampler`), so a typo or a wrong class fails at once, naming the key.
The stage processes import it too, so it must be importable there (installed, or on
`PYTHONPATH`).
"""

from __future__ import annotations

import importlib
from typing import TypeVar

__all__ = ["is_import_path", "load_class"]

T = TypeVar("T")


def is_import_path(name: str) -> bool:
    """Whether `name` names a class by import path ("package.module:ClassName")."""
    module, _, attribute = name.partition(":")
    return bool(module) and bool(attribute) and attribute.isidentifier()


def load_class(key: str, name: str, base: type[T]) -> type[T]:
    """The class `name` ("package.module:ClassName") for config key `key`; it must
    subclass `base`. ValueError naming the key and the value otherwise."""
    if not is_import_path(name):
        raise ValueError(f"{key}={name!r} is not an import path 'package.module:ClassName'")
    module_name, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{key}={name!r} cannot be imported: {error}") from error
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ValueError(
            f"{key}={name!r} is not a subclass of {base.__module__}.{base.__qualname__}"
        )
    return found
