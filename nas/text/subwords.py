"""Subword vocabularies: BPE or unigram pieces trained with Hugging Face `tokenizers`.

Characters make long sequences of a small vocabulary; the Evolved Transformer and every
translation toolkit read subword pieces. `SubwordVocab` trains a `tokenizers.Tokenizer` (BPE
or unigram, `vocab_size` pieces) on a task's training split only and answers as the
character `Vocab` does (`nas.text.vocab`: PAD=0, BOS=1, EOS=2, UNK=3, `encode`, `decode`,
`to_json`), so tasks, decoding and exports use either. The pieces follow SentencePiece's
convention (a `▁` marks a word's start, `Metaspace`), so decoding gives the text back with
its spaces; text is NFC-normalised first.

Training is deterministic: `tokenizers` is told not to run in parallel while it trains
(`TOKENIZERS_PARALLELISM=false`), `seed` fixes the order the texts are given in, and a
unigram vocabulary is put in one order (its trainer's scores vary in their last bits from
run to run, which would reorder near-equal pieces). The vocabulary is saved as
`tokenizer.json` (`to_json`), which `tokenizers.Tokenizer.from_file` and the core install
(`nas.load_model`) read back.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from nas.text.vocab import BOS, EOS, PAD, SPECIALS, UNK
from pipeline.pure.checks import is_int

__all__ = ["KINDS", "SubwordKind", "SubwordVocab"]

SubwordKind = Literal["bpe", "unigram"]
KINDS: tuple[SubwordKind, ...] = ("bpe", "unigram")


class SubwordVocab:
    """Subword pieces to ids and back, the specials first (module doc)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"expected a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        ids = [tokenizer.token_to_id(token) for token in SPECIALS]
        if ids != [PAD, BOS, EOS, UNK]:
            raise ValueError(
                f"a subword vocabulary needs the specials {list(SPECIALS)} at ids 0-3, got {ids}"
            )
        self.tokenizer = tokenizer

    @classmethod
    def train(
        cls, texts: Sequence[str], kind: SubwordKind, vocab_size: int, *, seed: int = 0
    ) -> SubwordVocab:
        """`vocab_size` pieces (specials included) of `kind` learned from `texts`."""
        if kind not in KINDS:
            raise ValueError(f"subword kind {kind!r} is not valid; valid: {', '.join(KINDS)}")
        if not is_int(vocab_size) or vocab_size <= 16:
            raise ValueError(f"vocab_size={vocab_size!r} is not valid; use an integer > 16")
        if kind == "bpe":
            tokenizer = Tokenizer(models.BPE(unk_token=SPECIALS[UNK]))
            trainer: trainers.Trainer = trainers.BpeTrainer(
                vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False
            )
        else:
            tokenizer = Tokenizer(models.Unigram())
            trainer = trainers.UnigramTrainer(
                vocab_size=vocab_size,
                special_tokens=list(SPECIALS),
                unk_token=SPECIALS[UNK],
                show_progress=False,
            )
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        order = list(texts)
        random.Random(seed).shuffle(order)
        with _sequential():
            tokenizer.train_from_iterator(order, trainer)
        return cls(_canonical(tokenizer) if kind == "unigram" else tokenizer)

    def __len__(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordVocab) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"SubwordVocab({len(self)} tokens: {self.kind})"

    @property
    def kind(self) -> str:
        """ "bpe" or "unigram"."""
        return str(json.loads(self.to_json())["model"]["type"]).lower()

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of `text`'s pieces; a piece outside the vocabulary becomes UNK."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        return [BOS] * bos + list(ids) + [EOS] * eos

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of `ids`: stops at the first EOS, skips PAD and BOS, UNK becomes U+FFFD."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        kept: list[int] = []
        for i in values:
            if i == EOS:
                break
            if not 0 <= i < len(self):
                raise ValueError(f"id {i} is outside the vocabulary of {len(self)} tokens")
            if i not in (PAD, BOS):
                kept.append(i)
        return "".join(self._pieces(kept))

    def _pieces(self, ids: list[int]) -> Iterator[str]:
        """The decoded text, UNK as U+FFFD (the tokenizer would drop it as a special)."""
        run: list[int] = []
        for i in [*ids, None]:
            if i is None or i == UNK:
                if run:
                    yield self.tokenizer.decode(run, skip_special_tokens=True)
                    run = []
                if i == UNK:
                    yield "\ufffd"
            else:
                run.append(i)

    def to_json(self) -> str:
        """The tokenizer as `tokenizer.json` holds it."""
        return str(self.tokenizer.to_str())

    @classmethod
    def from_json(cls, text: str) -> SubwordVocab:
        return cls(Tokenizer.from_str(text))


def _canonical(tokenizer: Tokenizer) -> Tokenizer:
    """A unigram vocabulary the same whatever the run. Its trainer's scores differ in their
    last bits from run to run (its sums are not ordered), and it appends the characters it
    must keep in a set's order, at scores below every trained piece's: scores are rounded to
    9 decimals, that tail is sorted by character (its scores kept in place), and the pieces
    after the specials are sorted by score, then text."""
    data = json.loads(tokenizer.to_str())
    pieces = data["model"]["vocab"]
    specials = pieces[: len(SPECIALS)]
    rest = sorted(([p, round(s, 9)] for p, s in pieces[len(SPECIALS) :]), key=lambda e: -e[1])
    floor = min((score for p, score in rest if len(p) > 1), default=0.0)
    start = next((i for i, (p, score) in enumerate(rest) if score < floor), len(rest))
    tail = sorted(p for p, _ in rest[start:])  # below every trained piece: the kept chars
    rest[start:] = [[p, score] for p, (_, score) in zip(tail, rest[start:], strict=True)]
    data["model"]["vocab"] = specials + sorted(rest, key=lambda e: (-e[1], e[0]))
    return Tokenizer.from_str(json.dumps(data))


@contextlib.contextmanager
def _sequential() -> Iterator[None]:
    """`tokenizers` without its thread pool for the block (the environment restored)."""
    old = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = old
