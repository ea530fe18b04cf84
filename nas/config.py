"""Hydra at the edge: the schema registered in a ConfigStore, and DictConfig -> settings.

`conf/config.yaml` composes one option per group (task, search_space, pipeline, sampler,
pruner, tracker, objective) on top of the `nas_schema` registered here, which is
`nas.settings.NasSettings` itself: a key that does not exist or a value of the wrong type is
refused by OmegaConf while composing, and a value outside its valid set by the settings'
own checks, each naming the key. `one_line` says any of these refusals as the CLI prints it:
one line naming the key and what the settings declare valid there. Nothing else in `nas`
imports Hydra or OmegaConf.

`conf/` ships inside the package as `nas.conf` (pyproject.toml), so the configuration is
found wherever the package is installed: the CLI reads `CONFIG_PATH` (`pkg://nas.conf`);
`CONFIG_DIR` is the same folder on disk, for `hydra.initialize_config_dir` (tests,
benchmarks): `conf/` of the checkout under an editable install, the copy in
`site-packages/nas/conf` under a wheel.
"""

from __future__ import annotations

import dataclasses
from importlib.resources import files

from hydra.core.config_store import ConfigStore
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from nas.settings import NasSettings, keys_of, shown, what_is_valid

__all__ = ["CONFIG_DIR", "CONFIG_MODULE", "CONFIG_PATH", "one_line", "register", "to_settings"]

CONFIG_MODULE = "nas.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
CONFIG_DIR = str(files(CONFIG_MODULE))


def register() -> None:
    """Register the schema (idempotent); call before composing."""
    ConfigStore.instance().store(name="nas_schema", node=NasSettings)


def to_settings(cfg: DictConfig) -> NasSettings:
    """The typed settings of a composed config (validated on the way)."""
    unknown = _unknown_keys(cfg)
    if unknown:
        key = unknown[0]
        part = key.rpartition(".")[0]
        where = f"valid keys of {part}" if part else "valid top-level keys"
        raise ValueError(
            f"{key} is not a setting; {where}: {', '.join(keys_of(NasSettings, part))}"
        )
    settings = OmegaConf.to_object(cfg)
    if not isinstance(settings, NasSettings):
        raise TypeError(f"the composed config is a {type(settings).__name__}, not NasSettings")
    return settings


def _unknown_keys(node: DictConfig, where: str = "") -> list[str]:
    """The keys of `node` (a settings part) and its parts that no settings field names: a
    key added with `+` that the settings would drop unread. Free-form mappings (a task's or
    a sampler's `options`) may hold any key."""
    kind = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(kind):
        return []
    names = {f.name for f in dataclasses.fields(kind)}
    found = []
    for key in node:
        path = f"{where}{key!s}"
        if key not in names:
            found.append(path)
            continue
        child = None if OmegaConf.is_missing(node, key) else node[key]
        if isinstance(child, DictConfig):
            found.extend(_unknown_keys(child, f"{path}."))
    return found


def one_line(error: BaseException) -> str:
    """`error`, raised while composing or converting the config, said in one line: the key
    and what is valid there where OmegaConf names a key (Hydra wraps its errors around
    OmegaConf's), the group's options for an option that does not exist, else its words."""
    cause = error.__cause__ if isinstance(error.__cause__, OmegaConfBaseException) else error
    key = getattr(cause, "full_key", None)
    if isinstance(cause, MissingMandatoryValue) and key:
        return f"{key} has no value (??? in its option file); set it: {key}=..."
    if isinstance(cause, ValidationError) and key:
        valid = what_is_valid(NasSettings, key) or _first_line(cause)
        return f"{key}={shown(getattr(cause, 'value', None))} is not valid; {valid}"
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and key:
        part, _, _ = str(key).rpartition(".")
        keys = keys_of(NasSettings, part)
        if not keys:  # inside a mapping of options (`task.options`): the option may be new
            return f"{key} is not in the composed config; to add it, write +{key}=..."
        where = f"valid keys of {part}" if part else "valid top-level keys"
        return f"{key} is not a setting; {where}: {', '.join(keys)}"
    if isinstance(error, OverrideParseException):
        return f"{error.override!r} cannot be read: {' '.join(error.message.split())}"
    if isinstance(error, MissingConfigException) and error.options:
        group, valid = str(error.missing_cfg_file).rpartition("/")[0], ", ".join(error.options)
        return f"Could not find '{error.missing_cfg_file}'; valid options of {group}: {valid}"
    return " ".join(str(error).split())


def _first_line(error: OmegaConfBaseException) -> str:
    return str(getattr(error, "msg", "") or error).strip().splitlines()[0]
