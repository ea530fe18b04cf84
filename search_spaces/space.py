"""What the NAS harness asks of a search space: the `SearchSpace` interface and its lifecycle.

The harness (`nas.study`) never names a space: it builds the one `search_space.name` names
(`search_spaces.get_space`) with the settings' options and drives it through this interface
alone, so a second space plugs in beside the Evolved Transformer's without a change there.
Every space compiles to the same `Architecture`, so compile, the pipeline and export work
on any of them unchanged. A space asks its choices through `Suggest`, so any Optuna
sampler drives it (an Optuna trial is a `Suggest`), and this module imports no Optuna.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from search_spaces.architecture import D_MODEL_MULTIPLE, HEADS, Architecture
from search_spaces.suggest import CategoricalChoice, FixedSuggest, Suggest

__all__ = ["SearchSpace", "check_shared_options"]


class SearchSpace(ABC):
    """A family of architectures, sampled define-by-run, configured by its options.

    A space is a frozen dataclass whose fields are its options (`option_names`), with its
    registry name in `name`. Its methods are pure functions of their arguments and the
    options, so every process of a study (every rank, every worker, every run resumed)
    agrees on every architecture. The harness drives it in this order (the lifecycle, in
    the manner of Optuna's `BaseSampler`):

    1. Configure: `get_space(name).configure(**options)`, once per process, with the
       settings' `search_space` values the space has as options. A setting the space has
       no option for is refused by the harness when it is not at its default; an unknown
       option or a bad value is refused here (ValueError naming it and what is valid).
    2. Seed: a new study enqueues `seed_params(arch)` for each of `seeds()` (or of those it
       names among `named_seeds()`, or architectures of its own that the space holds), in
       order, so its first trials train the seeds (the baselines, trained whatever
       `validate` says).
    3. Ask: a trial's architecture is `sample(trial)`: every choice asked through the
       `Suggest` under a stable name, whose choices never change within a configured space
       (Optuna requires it). Then `validate(arch)`: an `InvalidArchitecture` (outside the
       parameter window, say) is recorded as an invalid trial, not trained, and another is
       asked (`limits` says what a sample may fall outside of, for the message).
    4. Replay: a stored trial's architecture is `replay(trial.params)`, the same network
       `sample` gave (in another process, another run): `sample` is deterministic in the
       answers.
    5. Edit: an edit-based sampler (regularized evolution, `nas.search.evolution`) changes
       one answer of a trained trial and replays the rest (4), drawing what the child asks
       that its parent never did; this needs nothing more of a space, so it works on every
       space. A child that inherits its parent's weights starts afresh the tensors the edit
       touches: `edited_tensors`.
    """

    name: ClassVar[str]  # in `search_spaces.SPACES`

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        """The keyword options the space is configured with (its dataclass fields)."""
        assert dataclasses.is_dataclass(cls), f"{cls.__name__} must be a dataclass"
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def configure(cls, **options: Any) -> Self:
        """The space with `options` (step 1), the others at their defaults; ValueError
        naming an option it does not have, or a value it refuses."""
        unknown = [key for key in options if key not in cls.option_names()]
        if unknown:
            raise ValueError(
                f"the {cls.name!r} space has no option {unknown[0]!r}; its options: "
                f"{', '.join(cls.option_names())}"
            )
        return cls(**options)

    @abstractmethod
    def sample(self, suggest: Suggest) -> Architecture:
        """The architecture `suggest`'s answers build (step 3). Never applies `validate`'s
        limits, so that every answered trial can be replayed (step 4)."""

    @abstractmethod
    def seeds(self) -> dict[str, Architecture]:
        """The seed architectures by name, in the order a new study trains them (step 2)."""

    def named_seeds(self) -> dict[str, Architecture]:
        """Every seed the configured space offers by name: `seeds()`, and any others a
        study may name instead (the harness's `search_space.seeds`); each replays through
        `seed_params` (step 2). By default the same as `seeds()`."""
        return self.seeds()

    @abstractmethod
    def seed_params(self, arch: Architecture) -> dict[str, CategoricalChoice]:
        """The answers that `replay` (or `study.enqueue_trial`) turns back into `arch`;
        ValueError, saying why, for an architecture no answers give."""

    @abstractmethod
    def validate(self, arch: Architecture) -> None:
        """Raise `InvalidArchitecture`, saying which rule and where, if `arch` breaks a rule
        of the configured space (its parameter window included)."""

    @abstractmethod
    def limits(self) -> str:
        """What a sample may fall outside of (`validate`), in words for a message."""

    @abstractmethod
    def edited_tensors(
        self, name: str, old: CategoricalChoice, new: CategoricalChoice, child: Architecture
    ) -> list[str]:
        """The qualified tensor prefixes (`<layer key>.<tensor name prefix>`) of `child`,
        compiled, that the edit of parameter `name` from `old` to `new` touches (step 5);
        ValueError for a name the space never asks."""

    def _hold_as_tuples(self, *names: str) -> None:
        """Keep the options `names` as tuples (YAML and JSON give lists), so the space is
        hashable and compares equal however it was configured (for `__post_init__`)."""
        for option in names:
            value = getattr(self, option)
            if isinstance(value, list):
                object.__setattr__(self, option, tuple(value))

    def replay(self, params: Mapping[str, CategoricalChoice]) -> Architecture:
        """The architecture stored answers build (step 4): KeyError naming a parameter the
        answers lack, ValueError naming one whose value is not among its choices."""
        return self.sample(FixedSuggest(params))


def check_shared_options(d_model: tuple[int, ...], decoder_only: object, n_heads: int) -> None:
    """ValueError naming the option, for the options every space has: `d_model` (widths to
    choose from), `decoder_only` (a bool: the task says which) and `n_heads` (the seeds')."""
    if not d_model or any(d < D_MODEL_MULTIPLE or d % D_MODEL_MULTIPLE for d in d_model):
        raise ValueError(
            f"d_model={list(d_model)!r} is not valid; widths are positive multiples of "
            f"{D_MODEL_MULTIPLE}"
        )
    if not isinstance(decoder_only, bool):
        raise ValueError(f"decoder_only={decoder_only!r} is not valid; valid: true, false")
    if n_heads not in HEADS:
        raise ValueError(f"n_heads={n_heads!r} is not valid; valid: {', '.join(map(str, HEADS))}")
