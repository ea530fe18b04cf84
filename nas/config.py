"""Hydra at the edge: the schema registered in a ConfigStore, and DictConfig -> settings.

`conf/config.yaml` composes one option per group (task, search_space, pipeline, sampler,
pruner, tracker, objective) on top of the `nas_schema` registered here, which is
`nas.settings.NasSettings` itself: a key that does not exist or a value of the wrong type is
refused by OmegaConf while composing, and a value outside its valid set by the settings'
own checks, each naming the key. Nothing else in `nas` imports Hydra or OmegaConf.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from nas.settings import NasSettings

__all__ = ["CONFIG_DIR", "register", "to_settings"]

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "conf")


def register() -> None:
    """Register the schema (idempotent); call before composing."""
    ConfigStore.instance().store(name="nas_schema", node=NasSettings)


def to_settings(cfg: DictConfig) -> NasSettings:
    """The typed settings of a composed config (validated on the way)."""
    settings = OmegaConf.to_object(cfg)
    if not isinstance(settings, NasSettings):
        raise TypeError(f"the composed config is a {type(settings).__name__}, not NasSettings")
    return settings
