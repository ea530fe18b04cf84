"""Compile an architecture to pipeline layers: one `LayerSpec` per cell.

A cell is the planner's unit: big enough that a layer's compute dwarfs its messages, small
enough (several per model) that stages can be balanced. Keys are stable ("embed_src",
"enc0", ..., "embed_tgt", "dec0", ..., "head"; "embed", "dec0", ..., "head" for a
decoder-only model), so weights (seeded by key) and migrations follow a cell by its place.
Factories are `functools.partial`s of the module-level classes below: picklable.

The carry (what flows between layers; each layer takes it as ONE tuple argument):

    encoder-decoder, batch x = (src_ids (B, S) int64, tgt_in_ids (B, T) int64)
      embed_src : (src, tgt)                    -> (enc (B,S,D), src, tgt)
      enc<i>    : (enc, src, tgt)               -> (enc, src, tgt)
      embed_tgt : (enc, src, tgt)               -> (memory (B,S,D), src, dec (B,T,D), tgt)
      dec<i>    : (memory, src, dec, tgt)       -> (memory, src, dec, tgt)
      head      : (memory, src, dec, tgt)       -> logits (B, vocab, T)

    decoder-only, batch x = ids (B, T) int64
      embed     : ids                           -> (h (B,T,D), ids)
      dec<i>    : (h, ids)                      -> (h, ids)
      head      : (h, ids)                      -> logits (B, vocab, T)

Every hidden state travels with the ids that define its padding mask (ids == pad_id), so
a layer on any stage can rebuild the mask; the decoder's state is always carry[-2] and its
ids carry[-1]. embed_tgt applies the encoder's final LayerNorm to the memory, the head the
decoder's (pre-norm, as tensor2tensor and `nn.Transformer(norm_first=True)`). The loss is
`F.cross_entropy(logits, tgt_out_ids, ignore_index=pad_id)`. pad_id=None means "no
padding": nothing is masked (use it when pad_id could be a real token). Target padding is
masked too, so targets may be padded on either side; give BOS its own id, not pad_id.
"""

from __future__ import annotations

import functools
from typing import ClassVar

import torch
from torch import nn

from pipeline.local.spec import LayerSpec
from search_spaces.architecture import Architecture, Cell
from search_spaces.cells import CellModule
from search_spaces.memo import Memo
from search_spaces.sequence import Context

__all__ = [
    "DecoderCell",
    "EncoderCell",
    "Head",
    "LMCell",
    "LMEmbedding",
    "SourceEmbedding",
    "TargetEmbedding",
    "TokenEmbedding",
    "compile",
    "parameter_count",
]

Tensor = torch.Tensor


def _pad_mask(ids: Tensor, pad_id: int | None) -> Tensor | None:
    return None if pad_id is None else ids == pad_id  # (B, T) bool, True at padding


class TokenEmbedding(nn.Module):
    """Token + learned position embedding, then dropout: (B, T) int64 -> (B, T, D)."""

    def __init__(self, vocab: int, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: Tensor) -> Tensor:
        length, max_len = ids.shape[1], self.positions.num_embeddings
        if length > max_len:
            raise ValueError(f"sequence length {length} exceeds max_len {max_len}")
        positions = torch.arange(length, device=ids.device)
        return self.dropout(self.tokens(ids) + self.positions(positions))


class _EmbeddingLayer(nn.Module):
    """An embedding as a pipeline layer: its `TokenEmbedding` is `self.embed`."""

    def __init__(self, vocab: int, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.embed = TokenEmbedding(vocab, d_model, max_len, dropout)


class SourceEmbedding(_EmbeddingLayer):
    """embed_src: (src, tgt) -> (enc, src, tgt)."""

    def forward(self, carry: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        src, tgt = carry
        return self.embed(src), src, tgt


class _CellLayer(nn.Module):
    """A cell as a pipeline layer: the cell module, and the pad id its masks come from."""

    causal: ClassVar[bool]

    def __init__(self, cell: Cell, d_model: int, dropout: float, pad_id: int | None) -> None:
        super().__init__()
        self.cell = CellModule(cell, d_model, causal=self.causal, dropout=dropout)
        self.pad_id = pad_id

    def pad(self, ids: Tensor) -> Tensor | None:
        return _pad_mask(ids, self.pad_id)


class EncoderCell(_CellLayer):
    """enc<i>: (enc, src, tgt) -> (enc, src, tgt); a bidirectional cell. Decoding, it
    hands back what it computed for the same sources (`search_spaces.memo`)."""

    causal = False

    def __init__(self, cell: Cell, d_model: int, dropout: float, pad_id: int | None) -> None:
        super().__init__(cell, d_model, dropout, pad_id)
        self.memo = Memo()

    def forward(self, carry: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        enc, src, tgt = carry

        def compute() -> Tensor:
            return self.cell(enc, Context(pad=self.pad(src)))

        return self.memo.output(self, (enc, src), compute), src, tgt


class TargetEmbedding(_EmbeddingLayer):
    """embed_tgt: (enc, src, tgt) -> (memory = LayerNorm(enc), src, dec, tgt)."""

    def __init__(self, vocab: int, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__(vocab, d_model, max_len, dropout)
        self.memory_norm = nn.LayerNorm(d_model)  # the encoder's final norm

    def forward(
        self, carry: tuple[Tensor, Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        enc, src, tgt = carry
        return self.memory_norm(enc), src, self.embed(tgt), tgt


class DecoderCell(_CellLayer):
    """dec<i>: (memory, src, dec, tgt) -> (memory, src, dec, tgt); causal, sees the memory."""

    causal = True

    def forward(
        self, carry: tuple[Tensor, Tensor, Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        memory, src, dec, tgt = carry
        return memory, src, self.cell(dec, Context(self.pad(tgt), memory, self.pad(src))), tgt


class LMEmbedding(_EmbeddingLayer):
    """embed (decoder-only): ids -> (h, ids)."""

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        return self.embed(ids), ids


class LMCell(_CellLayer):
    """dec<i> (decoder-only): (h, ids) -> (h, ids); causal."""

    causal = True

    def forward(self, carry: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        h, ids = carry
        return self.cell(h, Context(pad=self.pad(ids))), ids


class Head(nn.Module):
    """Final LayerNorm and projection of carry[-2]: -> logits (B, vocab, T), the layout
    `F.cross_entropy` expects."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)  # the decoder's final norm
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, carry: tuple[Tensor, ...]) -> Tensor:
        return self.proj(self.norm(carry[-2])).transpose(1, 2)  # (B, T, V) -> (B, V, T)


def _specs(
    arch: Architecture,
    vocab: int,
    max_len: int,
    dropout: float,
    pad_id: int | None,
    source_vocab: int,
) -> list[LayerSpec]:
    d, p = arch.d_model, functools.partial
    if arch.encoder is None:
        return [
            LayerSpec("embed", p(LMEmbedding, vocab, d, max_len, dropout)),
            *[
                LayerSpec(f"dec{i}", p(LMCell, arch.decoder, d, dropout, pad_id))
                for i in range(arch.decoder_cells)
            ],
            LayerSpec("head", p(Head, d, vocab)),
        ]
    return [
        LayerSpec("embed_src", p(SourceEmbedding, source_vocab, d, max_len, dropout)),
        *[
            LayerSpec(f"enc{i}", p(EncoderCell, arch.encoder, d, dropout, pad_id))
            for i in range(arch.encoder_cells)
        ],
        LayerSpec("embed_tgt", p(TargetEmbedding, vocab, d, max_len, dropout)),
        *[
            LayerSpec(f"dec{i}", p(DecoderCell, arch.decoder, d, dropout, pad_id))
            for i in range(arch.decoder_cells)
        ],
        LayerSpec("head", p(Head, d, vocab)),
    ]


def compile(  # the name docs/design.md uses; unrelated to torch.compile
    arch: Architecture,
    vocab_size: int,
    *,
    max_len: int,
    dropout: float,
    pad_id: int | None = 0,
    source_vocab_size: int | None = None,
) -> list[LayerSpec]:
    """The layer list for `pipeline.ElasticPipeline`; see the module docstring for the
    carry and the loss. Source and target have separate embeddings of `max_len` positions;
    the target's (and the head's) vocabulary has `vocab_size` tokens, the source's
    `source_vocab_size` (None: the same vocabulary, `vocab_size`)."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"expected an Architecture, got {type(arch).__name__}")
    source = vocab_size if source_vocab_size is None else source_vocab_size
    if vocab_size < 1 or source < 1 or max_len < 1:
        raise ValueError(
            f"vocab_size ({vocab_size}), source_vocab_size ({source}) and max_len ({max_len}) "
            "must be >= 1"
        )
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout {dropout} must be in [0, 1)")
    if pad_id is not None and not 0 <= pad_id < min(vocab_size, source):
        raise ValueError(
            f"pad_id {pad_id} is not a token id (vocab_size {min(vocab_size, source)})"
        )
    return _specs(arch, vocab_size, max_len, float(dropout), pad_id, source)


def _numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@functools.lru_cache(maxsize=4096)
def _cell_parameters(cell: Cell, d_model: int, causal: bool) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        return _numel(CellModule(cell, d_model, causal=causal, dropout=0.0))


def parameter_count(
    arch: Architecture,
    vocab_size: int = 0,
    *,
    max_len: int = 0,
    source_vocab_size: int | None = None,
) -> int:
    """Exactly the number of parameters of `compile(arch, vocab_size, max_len=max_len,
    source_vocab_size=source_vocab_size)`.

    With the defaults (no vocabulary, no positions) it is the vocabulary-independent body:
    cells, the final LayerNorms and the head's bias-free remainder (its norm)."""
    d = arch.d_model
    embeddings = (vocab_size + max_len) * d  # tokens + positions, per embedding layer
    head = 2 * d + d * vocab_size + vocab_size  # LayerNorm + Linear(d, vocab)
    total = arch.decoder_cells * _cell_parameters(arch.decoder, d, True) + embeddings + head
    if arch.encoder is not None:
        source = vocab_size if source_vocab_size is None else source_vocab_size
        total += arch.encoder_cells * _cell_parameters(arch.encoder, d, False)
        total += (source + max_len) * d + 2 * d  # the source embedding, the memory LayerNorm
    return total
