"""The swappable parts of a study: its task, search space, sampler, pruner and tracker.

Each is a config group in `conf/` (`task=corpus`, `sampler=evolution`): a name, built-in or
a user's class by import path, and the options its constructor takes. The names are checked
against the registries of `nas.tasks`, `nas.search`, `nas.tracking` and `search_spaces`
(`Registered`), the options against what the chosen constructor takes (a task's through
`nas.tasks.bind_options`, which knows its option groups).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from nas.search import PRUNERS, SAMPLERS
from nas.settings.checks import Settings, setting
from nas.settings.constraints import (
    POSITIVE,
    Distinct,
    Each,
    Flag,
    Integer,
    OneOf,
    OrNone,
    Registered,
    Text,
)
from nas.tasks import TASKS, bind_options
from nas.tracking import TRACKERS
from pipeline.pure.registry import Registry, UnknownName
from search_spaces import SPACES
from search_spaces.evolved_transformer import PRIMITIVES, WINDOW_SEEDS

__all__ = [
    "PrunerSettings",
    "SamplerSettings",
    "SearchSpaceSettings",
    "TaskSettings",
    "TrackerSettings",
]

logger = logging.getLogger(__name__)


def _options_fit(
    registry: Registry[Any], name: str, options: dict[str, Any], key: str
) -> str | None:
    """The problem with `options` for the member `name` of `registry` (one it does not
    take), or None; a name the registry refuses is the name's problem, not this one."""
    try:
        registry.check_options(name, options)
    except UnknownName:
        return None
    except TypeError as error:
        return f"{key}.options: {error}"
    return None


@dataclass
class TaskSettings(Settings):
    section: ClassVar[str] = "task"

    name: str = setting("translation", Registered(TASKS), key="task")
    options: dict[str, Any] = field(default_factory=dict)

    def rules(self) -> tuple[str | None, ...]:
        return (self._options_fit_the_task(),)

    def _options_fit_the_task(self) -> str | None:
        """The options name parameters the task takes, with values its option groups
        accept (the task's data is not read here: `nas.tasks.check_task`)."""
        try:
            bind_options(self.name, self.options)
        except (TypeError, ValueError) as error:
            return f"task.options: {error}"
        return None


@dataclass
class SearchSpaceSettings(Settings):
    section: ClassVar[str] = "search_space"

    name: str = setting("evolved_transformer", Registered(SPACES))
    # None: as the task needs (translation: encoder-decoder)
    decoder_only: bool | None = setting(None, OrNone(Flag()))
    d_model: tuple[int, ...] = setting(
        (64,),
        Each(Integer(32, step=32), non_empty=True, words="widths are positive multiples of 32"),
    )
    n_heads: int = setting(4, POSITIVE)
    min_cells: int = setting(1, POSITIVE)
    max_cells: int = setting(2, POSITIVE)
    # (low, high) x the body parameters of the seed `window_reference` ("transformer": 2
    # layers per min_cells; "evolved_transformer": min_cells cells); e.g. [0.3, 1.02] of the
    # ET: up to 2% larger than it
    param_window: tuple[float, float] | None = None
    window_reference: str = setting("transformer", OneOf(WINDOW_SEEDS))
    # Primer's primitives added to the choices (search_spaces.evolved_transformer.PRIMITIVES)
    primitives: tuple[str, ...] = setting((), Each(OneOf(PRIMITIVES)))
    # the seed models a new study trains first, in order, and the retraining judges the
    # winner against: seeds the space names (`SearchSpace.named_seeds`: the Transformer, the
    # ET, with both primitives offered the ET with Primer's edits), or an architecture a
    # user exported (an export folder, its config.json, or an architecture JSON file);
    # None: the space's own seeds (`nas.study.space.seed_models`)
    seeds: tuple[str, ...] | None = setting(
        None, OrNone(Each(Text(), non_empty=True)), OrNone(Distinct("names a seed twice"))
    )

    def rules(self) -> tuple[str | None, ...]:
        return (self._cells_in_order(), self._window_in_order())

    def _window_in_order(self) -> str | None:
        window = self.param_window
        if window is None:
            return None
        if len(window) != 2 or not 0 <= window[0] < window[1]:
            return (
                f"search_space.param_window={list(window)} holds no model; valid: [low, high] "
                "with 0 <= low < high, fractions of the reference's body parameters, e.g. "
                "[0.3, 1.02]"
            )
        return None

    def _cells_in_order(self) -> str | None:
        if self.min_cells > self.max_cells:
            return (
                f"search_space cells {self.min_cells}..{self.max_cells} must "
                "satisfy 1 <= min_cells <= max_cells"
            )
        return None


@dataclass
class SamplerSettings(Settings):
    section: ClassVar[str] = "sampler"

    name: str = setting("tpe", Registered(SAMPLERS), key="sampler")
    options: dict[str, Any] = field(default_factory=dict)

    def rules(self) -> tuple[str | None, ...]:
        return (_options_fit(SAMPLERS, self.name, self.options, "sampler"),)


@dataclass
class PrunerSettings(Settings):
    section: ClassVar[str] = "pruner"

    name: str = setting("none", Registered(PRUNERS), key="pruner")
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.options and PRUNERS.accepts(self.name) and not _takes_options(self.name):
            # an experiment's options for its pruner stay when only the group is swapped
            # (`experiment=search_2h pruner=none`), and Hydra cannot remove them
            logger.warning(
                "pruner=%s takes no options: ignoring pruner.options %s (another pruner's)",
                self.name,
                sorted(self.options),
            )
            self.options = {}
        super().__post_init__()

    def rules(self) -> tuple[str | None, ...]:
        return (_options_fit(PRUNERS, self.name, self.options, "pruner"),)


def _takes_options(pruner: str) -> bool:
    try:
        return bool(PRUNERS.options_of(pruner))
    except UnknownName:  # refused with the settings
        return True


@dataclass
class TrackerSettings(Settings):
    section: ClassVar[str] = "tracker"

    name: str = setting("jsonl", Registered(TRACKERS), key="tracker")
    options: dict[str, Any] = field(default_factory=dict)

    def rules(self) -> tuple[str | None, ...]:
        return (_options_fit(TRACKERS, self.name, self.options, "tracker"),)
