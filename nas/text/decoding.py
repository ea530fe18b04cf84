"""Greedy decoding of an encoder-decoder, shared by the evaluation and the exported model.

`Translation.evaluate` scores greedy translations, and an exported `TranslationModel`
translates with the same functions, so a model translates a source the same way in both.
It lives outside `nas.tasks` so that an exported model decodes with the core install alone;
`nas.tasks.translation` (and `nas.tasks` for `greedy_decode`) re-export these names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from nas.text.vocab import BOS, EOS, PAD, TokenVocab

__all__ = ["StepFn", "check_batch_size", "greedy_decode", "translate_ids"]

# step_fn(src_ids (B, S), tgt_in_ids (B, T)) -> logits (B, V, T)
StepFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")


@torch.no_grad()
def greedy_decode(step_fn: StepFn, src_ids: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy generation: ids per row, without BOS and EOS, at most `max_len` tokens.

    `step_fn(src_ids, tgt_in_ids)` returns logits (B, V, T) for tgt_in (B, T); the next token
    is the argmax at the last position. It is called on the rows still translating: once
    half the rows it was fed have emitted EOS, the next call feeds half as many (every row
    still translating, the rest rows that have ended, whose tokens are ignored), so a
    batch whose rows end at different steps costs what its long rows need, in batches of
    the same sizes every time (`_narrowed`). A `step_fn` must therefore treat each row on
    its own, as a model does.
    """
    if src_ids.dim() != 2:
        raise ValueError(f"src_ids must be (batch, seq), got shape {tuple(src_ids.shape)}")
    rows = src_ids.shape[0]
    tgt = torch.full((rows, max_len + 1), PAD, dtype=torch.long, device=src_ids.device)
    tgt[:, 0] = BOS
    done = torch.zeros(rows, dtype=torch.bool, device=src_ids.device)
    fed, src = torch.arange(rows, device=src_ids.device), src_ids
    for length in range(1, max_len + 1):
        logits = step_fn(src, tgt[fed, :length])
        if logits.dim() != 3 or logits.shape[0] != len(fed) or logits.shape[2] != length:
            raise ValueError(
                f"step_fn must return logits (B, V, T) = ({len(fed)}, V, {length}), got "
                f"{tuple(logits.shape)}"
            )
        token = logits[:, :, -1].argmax(1).masked_fill(done[fed], PAD)
        tgt[fed, length] = token
        done[fed] |= token == EOS
        if bool(done.all()):
            break
        narrowed = _narrowed(fed, done)
        if len(narrowed) < len(fed):
            fed, src = narrowed, src_ids[narrowed]
    out = []
    for row in tgt[:, 1:].tolist():
        ids = row[: row.index(EOS)] if EOS in row else row
        out.append([i for i in ids if i != PAD])
    return out


def _narrowed(fed: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """The rows to feed next: `fed` halved (again) while the rows of it still translating
    fit in half, those rows first, then as many ended rows as make up the size."""
    ended = done[fed]
    still = fed[~ended]
    size = len(fed)
    while size > 1 and len(still) <= size // 2:
        size //= 2
    if size == len(fed):
        return fed
    return torch.cat([still, fed[ended][: size - len(still)]])


def translate_ids(
    step_fn: StepFn,
    vocab: TokenVocab,
    sources: Sequence[Sequence[int]],
    *,
    batch_size: int,
    max_len: int,
    width: int | None = None,
    device: torch.device | None = None,
) -> list[str]:
    """Greedy translations of encoded `sources`, decoded to text (in the order given), in
    batches as evaluation makes them: sources of like length together (shortest first, so
    a batch pads little and its rows end their translations at about the same step), each
    batch padded to its longest source (or to `width`) and filled up to `batch_size` rows
    with copies of its first source, so a model translates a source the same way here as
    in `Translation.evaluate`. `device`: where the batches go (default: the CPU)."""
    check_batch_size(batch_size)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        rows = [sources[i] for i in chosen]
        src = torch.full((batch_size, width or max(len(r) for r in rows)), PAD, dtype=torch.long)
        for i in range(batch_size):
            row = rows[i] if i < len(rows) else rows[0]
            src[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        ids = greedy_decode(step_fn, src.to(device), max_len)[: len(rows)]
        for index, row_ids in zip(chosen, ids, strict=True):
            out[index] = vocab.decode(row_ids)
    return out
