"""How a translation task reads its text: characters or subword pieces, one vocabulary or two.

`TokenizerOptions` is the one typed, checked group of these options: `Translation`, `Corpus`
and `Messages` take it (`tokenization=`) and hand it to `ParallelCorpus`. Users still write
its fields as the task's own options (`task.options.tokenizer=bpe task.options.vocab_size=
8000`): `nas.tasks.bind_options` gathers them into the group, over the task's default.
`build_vocab` learns one vocabulary by them.

* "chars": the characters of every split (`nas.text.vocab.Vocab`); `vocab_size` is ignored.
* "bpe" or "unigram": `vocab_size` subword pieces (`nas.text.subwords.SubwordVocab`) trained
  on the training split only, seeded by the task's seed. `vocab_size` must leave a piece for
  every character of the texts it learns from (the unigram trainer refuses less; BPE would
  silently take more): that is checked against the data (`build_vocab`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from nas.tasks.base import SPECIALS, TaskInputError, TokenVocab, Vocab, check_positive
from nas.text.subwords import SubwordKind, SubwordVocab
from pipeline.pure.checks import is_int

__all__ = [
    "CHARACTERS",
    "SUBWORDS",
    "TOKENIZERS",
    "Side",
    "TokenizerName",
    "TokenizerOptions",
    "build_vocab",
]

TokenizerName = Literal["chars", "bpe", "unigram"]
TOKENIZERS: tuple[str, ...] = get_args(TokenizerName)
Side = Literal["source", "target", "both"]
_SIDES: dict[Side, tuple[int, ...]] = {"source": (0,), "target": (1,), "both": (0, 1)}


@dataclass(frozen=True)
class TokenizerOptions:
    """What a translation task's vocabulary is made of (module doc); `TaskInputError`
    naming a value it cannot take."""

    tokenizer: TokenizerName = "chars"
    # subword pieces per vocabulary, the specials included; ignored for characters
    vocab_size: int | None = None
    # subwords: pairs with a side longer than this many pieces are dropped (and counted)
    max_tokens: int | None = None
    # one vocabulary for both sides; False: one per side, each of `vocab_size` pieces
    shared_vocab: bool = True

    def __post_init__(self) -> None:
        if self.tokenizer not in TOKENIZERS:
            raise TaskInputError(
                f"tokenizer={self.tokenizer!r} is not valid; valid tokenizers: "
                + ", ".join(TOKENIZERS)
            )
        if self.vocab_size is not None and not is_int(self.vocab_size):
            raise TaskInputError(
                f"vocab_size={self.vocab_size!r} is not valid; valid: an integer (subword "
                "pieces, the specials included) or null"
            )
        if not isinstance(self.shared_vocab, bool):
            raise TaskInputError(
                f"shared_vocab={self.shared_vocab!r} is not valid; valid: true (one vocabulary "
                "for both sides) or false (one per side)"
            )
        if self.max_tokens is not None and self.tokenizer == "chars":
            raise TaskInputError(
                f"max_tokens={self.max_tokens!r} is not valid for tokenizer='chars'; valid: "
                "null (characters are limited by max_chars), or a subword tokenizer (bpe, "
                "unigram)"
            )
        if self.max_tokens is not None:
            check_positive("max_tokens", self.max_tokens)

    @property
    def subwords(self) -> bool:
        """Whether the task reads subword pieces rather than characters."""
        return self.tokenizer != "chars"


# What the name task reads by default (`translation`): characters.
CHARACTERS = TokenizerOptions()
# What the tasks on sentences read by default (`corpus`, `messages`): 8,000 BPE pieces.
SUBWORDS = TokenizerOptions("bpe", vocab_size=8000)


def build_vocab(
    options: TokenizerOptions,
    splits: Mapping[str, Sequence[tuple[str, str]]],
    seed: int,
    side: Side = "both",
) -> TokenVocab:
    """The vocabulary of `side` of `splits` (module doc): characters of every split, or
    subword pieces learned from the training split; `TaskInputError` naming a vocabulary
    size too small for the data."""
    sides = _SIDES[side]
    if not options.subwords:
        return Vocab.from_texts(
            pair[i] for pairs in splits.values() for pair in pairs for i in sides
        )
    texts = [pair[i] for pair in splits["train"] for i in sides]
    need = max(17, len(SPECIALS) + len(set("".join(texts))))
    size = options.vocab_size
    if size is None or size < need:
        whose = "" if side == "both" else f"'s {side}s"
        raise TaskInputError(
            f"vocab_size={size!r} is not valid for tokenizer={options.tokenizer!r}: the "
            f"training split{whose} has {need - len(SPECIALS)} distinct characters, each needs "
            f"a piece besides the {len(SPECIALS)} specials; use an integer >= {need}"
        )
    kind: SubwordKind = "bpe" if options.tokenizer == "bpe" else "unigram"
    return SubwordVocab.train(texts, kind, size, seed=seed)
