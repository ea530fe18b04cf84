"""Every documented option composes into valid settings (Hydra's compose API, no processes).

The options are found by listing `conf/<group>/*.yaml` when the tests are collected, so an
option added later is covered without touching this file; each composed config goes through
`nas.config.to_settings` (the typed settings validate) and must carry every value its option
file sets (a `# @package _global_` file at the top level, any other under its group), and
those of the options its own defaults list picks.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

from nas.config import CONFIG_DIR, one_line
from nas.settings import NasSettings
from tests.nas.harness.common import composed as settings
from tests.nas.harness.common import write_text

CONF = Path(CONFIG_DIR)
# Folders holding options (not hydra/, whose groups are Hydra's, nor __pycache__/).
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and any(p.glob("*.yaml")))
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]
EXPERIMENTS = [o for g, o in OPTIONS if g == "experiment"]
SAMPLERS = [o for g, o in OPTIONS if g == "sampler"]

# What an option needs beside itself to be valid settings: another group's option.
NEEDS: dict[str, tuple[str, ...]] = {
    "search_space=evolved_transformer_decoder": ("task=charlm",),  # decoder-only: an LM task
}
# Mandatory values (`???`) and how a test fills them: key -> value made under tmp_path.
FILLS: dict[str, Callable[[Path], str]] = {
    "task.options.path": lambda tmp_path: str(write_text(tmp_path / "corpus.txt")),
}


def option_file(group: str, option: str) -> tuple[str, DictConfig]:
    """The package an option file fills ("" for the top level) and its content."""
    path = CONF / group / f"{option}.yaml"
    header = [
        line.split("@package", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.startswith("#") and "@package" in line
    ]
    package = header[0] if header else group
    content = OmegaConf.load(path)
    assert isinstance(content, DictConfig), f"{path} is not a mapping"
    return ("" if package == "_global_" else package), content


def leaves(node: Any, prefix: str) -> dict[str, Any]:
    """Dotted key -> value of every leaf under `node` (a list or an empty mapping is a
    leaf; a mandatory `???` value is kept as "???")."""
    if isinstance(node, DictConfig) and len(node):
        found: dict[str, Any] = {}
        for key in node:
            key = str(key)
            dotted = f"{prefix}.{key}" if prefix else key
            found.update(
                leaves("???", dotted)
                if OmegaConf.is_missing(node, key)
                else leaves(node[key], dotted)
            )
        return found
    if isinstance(node, DictConfig | ListConfig):
        return {prefix: OmegaConf.to_container(node)}
    return {prefix: node}


def expected(group: str, option: str, chosen: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The values an option sets: those of the options its defaults list picks (or the one
    `chosen` on the command line for a group, which wins), then its own on top."""
    package, content = option_file(group, option)
    picks = {
        str(key).removeprefix("override").strip().lstrip("/"): str(picked)
        for entry in content.get("defaults", [])
        if isinstance(entry, DictConfig)
        for key, picked in entry.items()
    }
    picks.update(chosen or {})
    values: dict[str, Any] = {}
    for other, picked in picks.items():
        values.update(expected(other, picked))
    own = OmegaConf.masked_copy(content, [str(k) for k in content if k != "defaults"])
    values.update(leaves(own, package))
    return values


def value_at(settings: NasSettings, dotted: str) -> Any:
    """The settings' value at a dotted key, tuples as lists (as in YAML)."""
    node: Any = settings
    for part in dotted.split("."):
        node = node[part] if isinstance(node, Mapping) else getattr(node, part)
    return _as_yaml(node)


def _as_yaml(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_as_yaml(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _as_yaml(v) for k, v in value.items()}
    return value


def fill_mandatory(values: dict[str, Any], tmp_path: Path) -> list[str]:
    """Overrides for the mandatory values among `values` (each filled, in place)."""
    missing = [key for key, value in values.items() if value == "???"]
    unknown = [key for key in missing if key not in FILLS]
    assert not unknown, f"mandatory {unknown}: add how to fill them to FILLS"
    for key in missing:
        values[key] = FILLS[key](tmp_path)
    return [f"{key}={values[key]}" for key in missing]


def assert_carries(settings: NasSettings, values: Mapping[str, Any]) -> None:
    wrong = {
        key: (value_at(settings, key), want)
        for key, want in values.items()
        if value_at(settings, key) != want
    }
    assert not wrong, f"composed (got, option file) differ: {wrong}"


def test_the_listing_finds_every_group_the_config_picks() -> None:
    config = OmegaConf.load(CONF / "config.yaml")
    assert isinstance(config, DictConfig)
    picked = {
        str(k)
        for entry in config.defaults
        if isinstance(entry, DictConfig)
        for k in entry
        if not str(k).startswith("override ")  # a Hydra group: hydra/help
    }
    assert picked <= set(GROUPS), f"groups without a folder: {picked - set(GROUPS)}"
    assert {"task", "sampler", "pruner", "tracker", "experiment"} <= set(GROUPS)
    assert all(any(g == group for g, _ in OPTIONS) for group in GROUPS)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_into_valid_settings(tmp_path: Path, group: str, option: str) -> None:
    values = expected(group, option)
    fills = fill_mandatory(values, tmp_path)
    composed = settings(f"{group}={option}", *NEEDS.get(f"{group}={option}", ()), *fills)
    assert_carries(composed, values)
    if group in ("task", "search_space", "sampler", "pruner", "tracker"):
        assert getattr(composed, group).name == values[f"{group}.name"]


PAIRS = list(itertools.product(EXPERIMENTS, SAMPLERS))


@pytest.mark.parametrize(("experiment", "sampler"), PAIRS, ids=[f"{e}+{s}" for e, s in PAIRS])
def test_every_experiment_composes_with_every_sampler(
    tmp_path: Path, experiment: str, sampler: str
) -> None:
    values = expected("experiment", experiment, chosen={"sampler": sampler})
    fills = fill_mandatory(values, tmp_path)
    composed = settings(f"experiment={experiment}", f"sampler={sampler}", *fills)
    assert composed.sampler.name == values["sampler.name"]  # evolution_large: "evolution"
    assert_carries(composed, values)


def test_a_missing_mandatory_value_names_its_key() -> None:
    with pytest.raises(MissingMandatoryValue, match=r"task\.options\.path"):
        settings("task=textfile")


def test_swapping_an_experiments_pruner_for_none_drops_its_options(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`experiment=search_2h pruner=none`: the experiment's PDH options follow the pruner
    group, and Hydra cannot remove them; the settings drop them, saying so."""
    with caplog.at_level(logging.WARNING, logger="nas.settings"):
        composed = settings("experiment=search_2h", "pruner=none")
    assert composed.pruner.name == "none" and composed.pruner.options == {}
    assert "ignoring pruner.options ['budgets', 'hurdle', 'min_trials']" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (["train.steps=abc"], "train.steps='abc' is not valid; it must be a positive integer"),
        (["train.steps=-5"], "train.steps=-5 is not valid; it must be a positive integer"),
        (["pipeline.n_stages=1.5"], "pipeline.n_stages=1.5 is not valid; use a positive integer"),
        (["train.stepz=4"], "train.stepz is not a setting; valid keys of train: steps, batch_size"),
        (["sampler=annealing"], "Could not find 'sampler/annealing'; valid options of sampler: "),
        (["sampler.name=annealing"], "sampler='annealing' is not valid; valid samplers: tpe, "),
        (["task.options.sed=1"], "task.options.sed is not in the composed config; to add it, "),
        (["+task.options.sed=1"], "task.options: bad options for task 'translation': unknown"),
        (["task=corpus"], "task.options.path has no value (??? in its option file); set it"),
        (["train.steps=[1"], "'train.steps=[1' cannot be read: "),
    ],
)
def test_a_config_that_cannot_run_is_said_in_one_line_naming_the_key(
    overrides: list[str], said: str
) -> None:
    """What the CLI prints for each (`nas.cli.main`): Hydra's refusals while composing,
    OmegaConf's and the settings' own."""
    with pytest.raises((HydraException, OmegaConfBaseException, ValueError)) as raised:
        settings(*overrides)
    line = one_line(raised.value)
    assert line.startswith(said) and "\n" not in line, line
