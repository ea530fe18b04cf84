"""The study's search space and seed models, as the settings configure them.

The harness never names a space: it asks `search_spaces.get_space` for the configured one
and drives it through `search_spaces.space.SearchSpace` alone. A `search_space` setting the
space has no option for (Primer's `primitives` in the Transformer space, say) is refused
here unless it keeps its default, so that no setting is silently ignored.

The seed models (`seed_models`) are what a new study trains first and what the retraining
judges its winner against: the space's own seeds, or those `search_space.seeds` lists, each
a seed the space names (`SearchSpace.named_seeds`) or an architecture a user exported (an
export folder, its `config.json`, or a JSON file of the architecture alone), named after
its folder or file. A listed architecture the space cannot replay, a file that cannot be
read, or an unknown name is a `SeedError` naming the entry and what is valid.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna

from nas.settings import NasSettings
from search_spaces import SearchSpace, get_space
from search_spaces.architecture import Architecture, from_json, to_json

__all__ = ["SeedError", "architecture_of", "configured_space", "seed_models"]

_HARNESS_KEYS = ("name", "seeds")  # `search_space` settings the harness reads, not the space


class SeedError(ValueError):
    """A `search_space.seeds` entry that names no seed model the study can train."""


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
        elif key not in _HARNESS_KEYS and _listed(value) != _listed(getattr(defaults, key)):
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


def seed_models(settings: NasSettings, space: SearchSpace | None = None) -> dict[str, Architecture]:
    """The study's seed models by name, in order (module docstring); `space`: the
    configured space, where the caller holds it."""
    space = configured_space(settings) if space is None else space
    listed = settings.search_space.seeds
    if listed is None:
        return space.seeds()
    named = space.named_seeds()
    models: dict[str, Architecture] = {}
    for entry in listed:
        name, arch = (entry, named[entry]) if entry in named else _exported(entry, space, named)
        if name in models:
            raise SeedError(f"search_space.seeds names the seed model {name!r} twice ({entry!r})")
        models[name] = arch
    return models


def _loads_whole(entry: str, folder: Path) -> None:
    """`SeedError` naming the file unless the exported model in `folder` loads whole: a
    folder whose weights or tokenizer are damaged or another model's is no seed to start
    from (its config.json alone may be given for the architecture)."""
    from nas.export.pretrained import ModelFolderError, load_model

    try:
        load_model(folder)
    except ModelFolderError as error:
        raise SeedError(f"search_space.seeds has {entry!r}: {error}") from None


def _exported(
    entry: str, space: SearchSpace, named: dict[str, Architecture]
) -> tuple[str, Architecture]:
    """The architecture a user exported, at path `entry`, and its name; `SeedError` unless
    the configured space replays it."""
    path = Path(entry).expanduser()
    if not path.exists():
        raise SeedError(
            f"search_space.seeds has {entry!r}: neither a seed of the {space.name!r} space "
            f"({', '.join(named)}) nor an existing file or folder (an exported model's folder, "
            "its config.json, or a JSON file of an architecture)"
        )
    file = path / "config.json" if path.is_dir() else path
    if path.is_dir() and (path / "model.safetensors").exists():  # weights too: all of it
        _loads_whole(entry, path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        written = data.get("architecture", data) if isinstance(data, dict) else data
        arch = from_json(json.dumps(written))
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SeedError(
            f"search_space.seeds has {entry!r}: {file} holds no architecture ({error}); valid: "
            "an exported model's folder, its config.json, or a JSON file of an architecture"
        ) from error
    try:
        replayed = space.replay(space.seed_params(arch))
    except (ValueError, KeyError) as error:
        raise SeedError(
            f"search_space.seeds has {entry!r}: its architecture is not in the configured "
            f"{space.name!r} space ({error})"
        ) from error
    if to_json(replayed) != to_json(arch):
        raise SeedError(
            f"search_space.seeds has {entry!r}: the configured {space.name!r} space builds "
            "another architecture from its answers"
        )
    return (file.parent.name if file.name == "config.json" else file.stem), arch
