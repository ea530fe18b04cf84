"""The Evolved Transformer space (with Primer's optional primitives) as a `SearchSpace`.

`search_spaces.evolved_transformer` holds the space itself as functions (`sample`,
`validate`, `seed_params`, the parameter window); this class binds them to one study's
options, so the harness can ask for them without knowing which space it searches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar, cast

from search_spaces.architecture import Architecture
from search_spaces.edited import edited_tensors
from search_spaces.evolved_transformer import (
    PRIMITIVES,
    WINDOW_SEEDS,
    ParamWindow,
    Primitive,
    WindowSeed,
    evolved_transformer,
    sample,
    seed_params,
    transformer,
    validate,
)
from search_spaces.primer import with_primitives
from search_spaces.space import SearchSpace, check_shared_options
from search_spaces.suggest import CategoricalChoice, Suggest

__all__ = ["PRIMER_SEED", "EvolvedTransformerSpace"]

PRIMER_SEED = "evolved_transformer_primer"  # the ET with both of Primer's edits


@dataclass(frozen=True)
class EvolvedTransformerSpace(SearchSpace):
    """The paper's space: cells of 6 (encoder) and 8 (decoder) blocks of two branches each.

    Options: `d_model` (one choice, or several); `decoder_only`; `n_heads`, the seeds'
    heads; `min_cells`..`max_cells` per side; `param_window` (low, high) x the body
    parameters of the seed `window_reference` ("transformer": 2 layers per `min_cells`;
    "evolved_transformer": `min_cells` cells), None for no window; `primitives`, Primer's
    (of `PRIMITIVES`) added to the choices."""

    name: ClassVar[str] = "evolved_transformer"

    d_model: tuple[int, ...] = (64,)
    decoder_only: bool = False
    n_heads: int = 4
    min_cells: int = 1
    max_cells: int = 2
    param_window: tuple[float, float] | None = None
    window_reference: str = "transformer"
    primitives: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self._hold_as_tuples("d_model", "param_window", "primitives")
        check_shared_options(self.d_model, self.decoder_only, self.n_heads)
        if self.window_reference not in WINDOW_SEEDS:
            raise ValueError(
                f"window_reference={self.window_reference!r} is not valid; valid: {WINDOW_SEEDS}"
            )
        unknown = [p for p in self.primitives if p not in PRIMITIVES]
        if unknown or isinstance(self.primitives, str):
            raise ValueError(f"primitives={self.primitives!r}: each must be one of {PRIMITIVES}")
        if not 1 <= self.min_cells <= self.max_cells:
            raise ValueError(
                f"cells {self.min_cells}..{self.max_cells} must satisfy 1 <= min_cells <= max_cells"
            )

    @functools.cached_property
    def offered(self) -> tuple[Primitive, ...]:
        """The optional primitives offered, in `PRIMITIVES` order."""
        return tuple(p for p in PRIMITIVES if p in self.primitives)

    @functools.cached_property
    def window(self) -> ParamWindow | None:
        """The parameter window (`param_window` x the seed `window_reference`), or None."""
        if self.param_window is None:
            return None
        low, high = self.param_window
        reference = cast(WindowSeed, self.window_reference)  # checked in __post_init__
        return ParamWindow(low, high, layers=2 * self.min_cells, seed=reference)

    def sample(self, suggest: Suggest) -> Architecture:
        return sample(
            suggest,
            d_model=self.d_model,
            decoder_only=self.decoder_only,
            cells=(self.min_cells, self.max_cells),
            window=None,
            primitives=self.offered,
        )

    def seeds(self) -> dict[str, Architecture]:
        """The smallest of each seed the space holds: the Transformer (2 layers per cell)
        and the Evolved Transformer, at `min_cells` cells and the first d_model."""
        d, heads, cells = self.d_model[0], self.n_heads, self.min_cells
        n_enc = 0 if self.decoder_only else cells
        return {
            "transformer": transformer(d, n_heads=heads, n_enc=2 * n_enc, n_dec=2 * cells),
            "evolved_transformer": evolved_transformer(d, n_heads=heads, n_enc=n_enc, n_dec=cells),
        }

    def named_seeds(self) -> dict[str, Architecture]:
        """`seeds()`, and with both of Primer's primitives offered, the Evolved Transformer
        with both in place (`PRIMER_SEED`: squared ReLU and multi-DConv-head attention,
        `search_spaces.primer`), the best known hand edit of it."""
        seeds = self.seeds()
        if set(PRIMITIVES) <= set(self.offered):
            seeds[PRIMER_SEED] = with_primitives(seeds["evolved_transformer"], PRIMITIVES)
        return seeds

    def seed_params(self, arch: Architecture) -> dict[str, CategoricalChoice]:
        return seed_params(arch, primitives=self.offered)

    def validate(self, arch: Architecture) -> None:
        validate(arch, window=self.window)

    def limits(self) -> str:
        if self.param_window is None:
            return "the space's rules"
        return f"the parameter window {self.param_window} (x the {self.window_reference}'s size)"

    def edited_tensors(
        self, name: str, old: CategoricalChoice, new: CategoricalChoice, child: Architecture
    ) -> list[str]:
        return edited_tensors(name, old, new, child)
