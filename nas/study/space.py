"""The study's search space: the one `search_space.name` names, configured by the settings.

The harness never names a space: it asks `search_spaces.get_space` for the configured one
and drives it through `search_spaces.space.SearchSpace` alone. A `search_space` setting the
space has no option for (Primer's `primitives` in the Transformer space, say) is refused
here unless it keeps its default, so that no setting is silently ignored.
"""

from __future__ import annotations

import dataclasses

import optuna

from nas.settings import NasSettings
from search_spaces import SearchSpace, get_space
from search_spaces.architecture import to_json

__all__ = ["architecture_of", "configured_space"]


def configured_space(settings: NasSettings) -> SearchSpace:
    """The space `search_space.name` names, with every `search_space` value it has an
    option for; ValueError naming the space (unknown) or a setting it has no option for,
    set away from its default, or whose value it refuses."""
    chosen = settings.search_space
    space = get_space(chosen.name)
    accepted = space.option_names()
    defaults = type(chosen)()
    options = {}
    for setting in dataclasses.fields(chosen):
        key, value = setting.name, getattr(chosen, setting.name)
        if key in accepted:
            options[key] = value
        elif key != "name" and _listed(value) != _listed(getattr(defaults, key)):
            shown = _listed(value)
            raise ValueError(
                f"search_space.{key}={shown!r} is not an option of the {chosen.name!r} "
                f"space (its options: {', '.join(accepted)})"
            )
    try:
        return space.configure(**options)
    except ValueError as error:
        raise ValueError(f"search_space ({chosen.name}): {error}") from error


def _listed(value: object) -> object:
    """A sequence as a list (as YAML writes it), so tuples and lists compare equal."""
    return list(value) if isinstance(value, tuple | list) else value


def architecture_of(trial: optuna.trial.FrozenTrial, settings: NasSettings) -> str:
    """The architecture (JSON) a stored trial proposed, rebuilt from its parameters."""
    return to_json(configured_space(settings).replay(trial.params))
