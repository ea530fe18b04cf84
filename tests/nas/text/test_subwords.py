"""`nas.text.subwords`: BPE and unigram vocabularies trained on real text, deterministic for a
seed, answering as the character `Vocab` does."""

from __future__ import annotations

from pydoc_data.topics import topics

import pytest

from nas.text.subwords import SubwordVocab
from nas.text.vocab import BOS, EOS, PAD, UNK

TEXTS = [line.strip() for text in topics.values() for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_vocabulary_is_deterministic_and_round_trips_text(kind: str) -> None:
    first = SubwordVocab.train(TEXTS[:3000], kind, 600, seed=1)  # type: ignore[arg-type]
    again = SubwordVocab.train(TEXTS[:3000], kind, 600, seed=1)  # type: ignore[arg-type]
    assert first == again and first.kind == kind
    assert 100 < len(first) <= 600
    sentence = "The %s object's  __init__() returns None."
    ids = first.encode(sentence, bos=True, eos=True)
    assert ids[0] == BOS and ids[-1] == EOS and UNK not in ids
    assert first.decode(ids) == sentence  # back exactly, its double space too
    assert len(ids) - 2 < len(sentence) / 2  # pieces, not characters (BOS, EOS aside)
    assert SubwordVocab.from_json(first.to_json()) == first
    assert first.decode([PAD, *first.encode("for loop"), EOS, *first.encode("never")]) == (
        "for loop"
    )


def test_an_unseen_character_is_unknown_and_bad_settings_are_named() -> None:
    vocab = SubwordVocab.train(TEXTS[:2000], "bpe", 300)
    ids = vocab.encode("x \u4e2d")  # a character the text never had
    assert UNK in ids and "\ufffd" in vocab.decode(ids)
    with pytest.raises(ValueError, match="subword kind 'wordpiece' is not valid"):
        SubwordVocab.train(TEXTS[:10], "wordpiece", 300)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="vocab_size=8 is not valid"):
        SubwordVocab.train(TEXTS[:10], "bpe", 8)
    with pytest.raises(ValueError, match="id 999999 is outside the vocabulary"):
        vocab.decode([999999])
