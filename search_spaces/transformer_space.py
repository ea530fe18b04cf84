"""The plain Transformer's hyper-parameters as a second `SearchSpace`.

Where the Evolved Transformer space searches the cells themselves, this one searches only
what one tunes in a Transformer (Vaswani et al. 2017): layers per side, the feed-forward
width, the attention heads and the feed-forward activation. Every architecture it holds is
`search_spaces.seeds.transformer(...)`, written in the same encoding (two layers per cell),
so compile, the pipeline and export take it unchanged. Parameter names, in the order asked:

    d_model       one choice, or a few (`d_model`)
    enc.layers    encoder layers, among `layers` (not asked for a decoder-only model)
    dec.layers    decoder layers, among `layers`
    ff            the feed-forward width / d_model, among FEED_FORWARD
    heads         every attention layer's heads, among HEADS (each divides every d_model)
    activation    the feed-forward activation, among ACTIVATIONS

Every sample is valid: the space has no parameter window, and `validate` refuses only an
architecture that is not one of its Transformers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pipeline.pure.checks import is_int
from search_spaces.architecture import HEADS, Architecture, Branch, InvalidArchitecture
from search_spaces.edited import branch_prefixes
from search_spaces.seeds import transformer
from search_spaces.space import SearchSpace, check_shared_options
from search_spaces.suggest import CategoricalChoice, Suggest, choose

__all__ = ["ACTIVATIONS", "FEED_FORWARD", "LAYERS", "PARAMETERS", "TransformerSpace"]

LAYERS = (2, 4, 6)  # per side; even: two layers per cell
FEED_FORWARD = (1.0, 2.0, 4.0)
ACTIVATIONS = ("relu", "swish", "squared_relu")
PARAMETERS = ("d_model", "enc.layers", "dec.layers", "ff", "heads", "activation")
_WHOLE = ("d_model", "enc.layers", "dec.layers")  # every shape changes, or layers come or go


def _feed_forward_hidden(branch: Branch) -> bool:
    """The feed-forward's first projection (W1, followed by the activation)."""
    return branch.layer == "conv_1x1" and branch.activation != "none"


@dataclass(frozen=True)
class TransformerSpace(SearchSpace):
    """Pre-norm Transformers. Options: `d_model` (one choice, or several); `decoder_only`;
    `n_heads`, the seed's heads; `layers`, the layer counts per side to choose from."""

    name: ClassVar[str] = "transformer"

    d_model: tuple[int, ...] = (64,)
    decoder_only: bool = False
    n_heads: int = 4
    layers: tuple[int, ...] = LAYERS

    def __post_init__(self) -> None:
        self._hold_as_tuples("d_model", "layers")
        check_shared_options(self.d_model, self.decoder_only, self.n_heads)
        if not self.layers or any(not is_int(n) or n < 2 or n % 2 for n in self.layers):
            raise ValueError(
                f"layers={list(self.layers)!r} is not valid; layers per side are even "
                "numbers >= 2 (two layers per cell)"
            )

    def sample(self, suggest: Suggest) -> Architecture:
        d_model = choose(suggest, "d_model", self.d_model)
        n_enc = 0 if self.decoder_only else choose(suggest, "enc.layers", self.layers)
        n_dec = choose(suggest, "dec.layers", self.layers)
        ff = choose(suggest, "ff", FEED_FORWARD)
        heads = choose(suggest, "heads", HEADS)
        activation = choose(suggest, "activation", ACTIVATIONS)
        return transformer(d_model, heads, n_enc, n_dec, ff=ff, activation=activation)

    def seeds(self) -> dict[str, Architecture]:
        """The smallest Transformer of the space, as the paper's: the fewest layers, a
        feed-forward of 4 d_model with ReLU, `n_heads` heads, the first d_model."""
        layers = min(self.layers)
        n_enc = 0 if self.decoder_only else layers
        return {"transformer": transformer(self.d_model[0], self.n_heads, n_enc, layers)}

    def seed_params(self, arch: Architecture) -> dict[str, CategoricalChoice]:
        """The answers read off `arch`'s branches; InvalidArchitecture when no answers
        build it (another kind of cell, or a value the space does not offer)."""
        if arch.decoder_only != self.decoder_only:
            kind = "decoder-only" if arch.decoder_only else "encoder-decoder"
            raise InvalidArchitecture(
                f"a {kind} architecture is not in a space of decoder_only={self.decoder_only}"
            )
        cells = [cell for cell in (arch.encoder, arch.decoder) if cell is not None]
        branches = [b for cell in cells for block in cell.blocks for b in block.branches]
        attention = [b.heads for b in branches if b.heads is not None]
        hidden = [b for b in branches if _feed_forward_hidden(b)]
        if not attention or not hidden:
            raise InvalidArchitecture("not a Transformer: no attention or no feed-forward layer")
        params: dict[str, CategoricalChoice] = {"d_model": arch.d_model}
        if not arch.decoder_only:
            params["enc.layers"] = 2 * arch.encoder_cells
        params |= {
            "dec.layers": 2 * arch.decoder_cells,
            "ff": hidden[0].dim,
            "heads": attention[0],
            "activation": hidden[0].activation,
        }
        try:
            rebuilt = self.replay(params)
        except ValueError as error:
            raise InvalidArchitecture(f"not a Transformer of this space: {error}") from error
        if rebuilt != arch:
            raise InvalidArchitecture(
                f"not a Transformer of this space: its cells are not those of {params}"
            )
        return params

    def validate(self, arch: Architecture) -> None:
        self.seed_params(arch)

    def limits(self) -> str:
        return "the Transformer space"

    def edited_tensors(
        self, name: str, old: CategoricalChoice, new: CategoricalChoice, child: Architecture
    ) -> list[str]:
        """Heads: every attention branch; ff: every feed-forward projection; activation:
        every feed-forward's first projection; d_model and layer counts: none (every shape
        changes, or whole layers come or go, which start afresh anyway)."""
        if name in _WHOLE:
            return []
        if name == "heads":
            return branch_prefixes(child, lambda branch: branch.heads is not None)
        if name == "ff":
            return branch_prefixes(child, lambda branch: branch.layer == "conv_1x1")
        if name == "activation":
            return branch_prefixes(child, _feed_forward_hidden)
        raise ValueError(
            f"parameter {name!r} is not one the Transformer space asks ({', '.join(PARAMETERS)})"
        )
