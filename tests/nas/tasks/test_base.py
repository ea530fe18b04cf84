"""Vocab, seeds and token statistics shared by every task."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nas.tasks import BOS, EOS, PAD, UNK, TokenStats, Vocab, get_task
from nas.tasks.base import derive_seed, masked_cross_entropy


def test_vocab_specials_then_sorted_characters() -> None:
    vocab = Vocab.from_texts(["bca", "ä b"])
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert vocab.chars == [" ", "a", "b", "c", "ä"] and len(vocab) == 9
    assert vocab.encode("ab") == [5, 6]
    assert vocab.encode("ab", bos=True, eos=True) == [BOS, 5, 6, EOS]


def test_vocab_round_trip_and_json() -> None:
    vocab = Vocab.from_texts(["Grüße, Ærø!"])
    text = "Ærø, Grüße!"
    assert vocab.decode(vocab.encode(text, bos=True, eos=True)) == text
    assert vocab.decode(torch.tensor(vocab.encode(text))) == text
    again = Vocab.from_json(vocab.to_json())
    assert again == vocab and again.encode(text) == vocab.encode(text)


def test_vocab_unknown_characters_and_decoding_rules() -> None:
    vocab = Vocab.from_texts(["ab"])
    assert vocab.encode("axb") == [4, UNK, 5]
    assert vocab.decode([BOS, 4, PAD, UNK, 5, EOS, 4]) == "a\ufffdb"  # stops at EOS
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vocab.decode([99])
    with pytest.raises(ValueError, match="serialised Vocab"):
        Vocab.from_json('{"chars": "ab"}')
    with pytest.raises(ValueError, match="single characters"):
        Vocab(["ab"])


def test_derive_seed_is_a_fixed_function_of_its_arguments() -> None:
    assert derive_seed("translation", 0, 0) == derive_seed("translation", 0, 0)
    assert derive_seed("translation", 0, 1) != derive_seed("translation", 1, 0)
    assert derive_seed(0, 1) == 8812415763665831917  # independent of PYTHONHASHSEED
    assert 0 <= derive_seed("x") < 2**63


def test_token_stats_ignore_pad_and_match_cross_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 5, generator=g)
    targets = torch.randint(4, 7, (3, 5), generator=g)
    targets[0, 3:] = PAD
    targets[2, 1:] = PAD
    stats = TokenStats().update(logits[:2], targets[:2]).update(logits[2:], targets[2:])
    assert stats.count == 15 - 2 - 4
    assert stats.loss == pytest.approx(float(masked_cross_entropy(logits, targets)), rel=1e-5)
    assert stats.loss == pytest.approx(
        float(F.cross_entropy(logits, targets, ignore_index=0)), rel=1e-5
    )
    mask = targets != PAD
    expected = ((logits.argmax(1) == targets) & mask).sum().item() / mask.sum().item()
    assert stats.accuracy == pytest.approx(expected)
    assert stats.bits_per_token == pytest.approx(stats.loss / math.log(2))


def test_token_stats_uniform_logits_and_shape_errors() -> None:
    stats = TokenStats().update(torch.zeros(2, 10, 4), torch.full((2, 4), 5))
    assert stats.loss == pytest.approx(math.log(10))
    assert math.isnan(TokenStats().loss)
    with pytest.raises(ValueError, match=r"logits \(B, V, T\)"):
        TokenStats().update(torch.zeros(2, 4, 10), torch.zeros(2, 10, dtype=torch.long)[:, :3])


def test_get_task_names_and_options() -> None:
    with pytest.raises(
        ValueError, match="valid tasks: translation, charlm, textfile, corpus, messages, or a"
    ):
        get_task("wmt14")
    with pytest.raises(TypeError, match="bad options for task 'charlm'"):
        get_task("charlm", path="x.txt")
