"""The character vocabulary: text to token ids and back, the same in training and in use.

It lives outside `nas.tasks` so that an exported model (`nas.export.pretrained`) reads its
vocabulary with the core install alone (torch), without the tasks' data sources and metrics
(pycountry, the scorers). `nas.tasks` and `nas.tasks.base` re-export every name here.

`TokenVocab` is what tasks, decoding and exported models ask of any vocabulary: this
character `Vocab` or a subword `nas.text.subwords.SubwordVocab` (the same specials and calls).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Protocol

import torch

__all__ = ["BOS", "EOS", "PAD", "SPECIALS", "UNK", "TokenVocab", "Vocab"]

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")


class TokenVocab(Protocol):
    """Text to ids and back, PAD=0, BOS=1, EOS=2, UNK=3 first: characters or subwords."""

    def __len__(self) -> int: ...

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]: ...

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str: ...

    def to_json(self) -> str: ...


class Vocab:
    """Characters to ids: PAD=0, BOS=1, EOS=2, UNK=3, then the characters by code point."""

    def __init__(self, chars: Iterable[str]) -> None:
        chars = sorted(set(chars))
        bad = [c for c in chars if len(c) != 1]
        if bad:
            raise ValueError(f"a Vocab holds single characters, got {bad[:5]!r}")
        self.chars: list[str] = chars
        self.index = {c: i + len(SPECIALS) for i, c in enumerate(chars)}

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> Vocab:
        chars: set[str] = set()
        for text in texts:
            chars.update(text)
        return cls(chars)

    def __len__(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.chars == other.chars

    def __hash__(self) -> int:
        return hash(tuple(self.chars))

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens: {len(SPECIALS)} special, {len(self.chars)} chars)"

    def encode(self, text: str, *, bos: bool = False, eos: bool = False) -> list[int]:
        """Ids of `text`; characters outside the vocabulary become UNK."""
        ids = [self.index.get(c, UNK) for c in text]
        return [BOS] * bos + ids + [EOS] * eos

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        """The text of `ids`: stops at the first EOS, skips PAD and BOS, UNK becomes U+FFFD."""
        values = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        out = []
        for i in values:
            if i == EOS:
                break
            if i in (PAD, BOS):
                continue
            if i == UNK:
                out.append("\ufffd")
            elif len(SPECIALS) <= i < len(self):
                out.append(self.chars[i - len(SPECIALS)])
            else:
                raise ValueError(f"id {i} is outside the vocabulary of {len(self)} tokens")
        return "".join(out)

    def to_json(self) -> str:
        return json.dumps(
            {"specials": list(SPECIALS), "chars": "".join(self.chars)}, ensure_ascii=False
        )

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("specials") != list(SPECIALS):
            raise ValueError(f"not a serialised Vocab with specials {list(SPECIALS)}")
        return cls(data["chars"])
