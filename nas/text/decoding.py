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
    is the argmax at the last position. Rows that have emitted EOS are fed PAD afterwards.
    """
    if src_ids.dim() != 2:
        raise ValueError(f"src_ids must be (batch, seq), got shape {tuple(src_ids.shape)}")
    rows = src_ids.shape[0]
    tgt = torch.full((rows, 1), BOS, dtype=torch.long, device=src_ids.device)
    done = torch.zeros(rows, dtype=torch.bool, device=src_ids.device)
    for _ in range(max_len):
        logits = step_fn(src_ids, tgt)
        if logits.dim() != 3 or logits.shape[0] != rows or logits.shape[2] != tgt.shape[1]:
            raise ValueError(
                f"step_fn must return logits (B, V, T) = ({rows}, V, "
                f"{tgt.shape[1]}), got {tuple(logits.shape)}"
            )
        token = logits[:, :, -1].argmax(1).masked_fill(done, PAD)
        tgt = torch.cat([tgt, token[:, None]], dim=1)
        done |= token == EOS
        if bool(done.all()):
            break
    out = []
    for row in tgt[:, 1:].tolist():
        ids = row[: row.index(EOS)] if EOS in row else row
        out.append([i for i in ids if i != PAD])
    return out


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
