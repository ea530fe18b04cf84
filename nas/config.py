"""Hydra at the edge: the schema registered in a ConfigStore, and DictConfig -> settings.

`conf/config.yaml` composes one option per group (task, search_space, pipeline, sampler,
pruner, tracker, objective) on top of the `nas_schema` registered here, which is
`nas.settings.NasSettings` itself: a key that does not exist or a value of the wrong type is
refused by OmegaConf while composing, and a value outside its valid set by the settings'
own checks, each naming the key. Nothing else in `nas` imports Hydra or OmegaConf.

`conf/` ships inside the package as `nas.conf` (pyproject.toml), so the configuration is
found wherever the package is installed: the CLI reads `CONFIG_PATH` (`pkg://nas.conf`);
`CONFIG_DIR` is the same folder on disk, for `hydra.initialize_config_dir` (tests,
benchmarks): `conf/` of the checkout under an editable install, the copy in
`site-packages/nas/conf` under a wheel.
"""

from __future__ import annotations

from importlib.resources import files

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from nas.settings import NasSettings

__all__ = ["CONFIG_DIR", "CONFIG_MODULE", "CONFIG_PATH", "register", "to_settings"]

CONFIG_MODULE = "nas.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"
CONFIG_DIR = str(files(CONFIG_MODULE))


def register() -> None:
    """Register the schema (idempotent); call before composing."""
    ConfigStore.instance().store(name="nas_schema", node=NasSettings)


def to_settings(cfg: DictConfig) -> NasSettings:
    """The typed settings of a composed config (validated on the way)."""
    settings = OmegaConf.to_object(cfg)
    if not isinstance(settings, NasSettings):
        raise TypeError(f"the composed config is a {type(settings).__name__}, not NasSettings")
    return settings
