"""chrF against hand-computed values and sacreBLEU's published examples; exact match."""

from __future__ import annotations

import pytest

from nas.tasks import chrf, decode_metrics, exact_match, sentence_chrf
from nas.tasks.metrics import chrf_statistics


def test_chrf_hand_computed() -> None:
    # "ab" vs "abc": n=1 P=2/2 R=2/3; n=2 P=1/1 R=1/2; n>=3 the hypothesis has no n-grams.
    # P=1, R=7/12 over the 2 effective orders; F2 = 5 P R / (4 P + R) = 7/11.
    assert sentence_chrf("ab", "abc") == pytest.approx(100 * 7 / 11)
    # "cat" vs "act": unigrams all match (P=R=1); no bigram or trigram does. P=R=1/3.
    assert sentence_chrf("cat", "act") == pytest.approx(100 / 3)
    # beta=1 on "ab"/"abc": F1 = 2 P R / (P + R) = 2 (7/12) / (19/12) = 14/19.
    assert sentence_chrf("ab", "abc", beta=1) == pytest.approx(100 * 14 / 19)
    assert chrf_statistics("ab", "abc", order=3) == [2, 3, 2, 1, 2, 1, 0, 1, 0]


def test_chrf_identity_disjoint_whitespace_and_empty() -> None:
    assert sentence_chrf("Deutschland", "Deutschland") == pytest.approx(100)
    assert sentence_chrf("Neu Seeland", "NeuSeeland") == pytest.approx(100)  # spaces removed
    assert sentence_chrf("xyz", "abc") == 0.0
    assert sentence_chrf("", "abc") == 0.0
    assert sentence_chrf("abc", "") == 0.0
    assert sentence_chrf("", "") == 0.0  # no n-grams at all: 0, as in sacreBLEU
    assert chrf([], []) == 0.0


def test_chrf_matches_sacrebleu_examples() -> None:
    # Values printed by sacreBLEU 2's CHRF() (the Hugging Face chrF metric card).
    hyp = "The relationship between Obama and Netanyahu is not exactly friendly."
    ref = "The ties between Obama and Netanyahu are not particularly friendly."
    assert sentence_chrf(hyp, ref) == pytest.approx(61.576379378113785)
    hyps = [
        "The relationship between cats and dogs is not exactly friendly.",
        "a good bookshop is just a genteel black hole that knows how to read.",
    ]
    refs = [
        "The relationship between dogs and cats is not exactly friendly.",
        "A good bookshop is just a genteel Black Hole that knows how to read.",
    ]
    assert chrf(hyps, refs) == pytest.approx(84.64214891738334)


def test_corpus_chrf_sums_statistics() -> None:
    corpus = chrf(["ab", "cat"], ["abc", "act"])
    assert corpus != pytest.approx((100 * 7 / 11 + 100 / 3) / 2)
    assert chrf(["ab"], ["abc"]) == pytest.approx(sentence_chrf("ab", "abc"))


def test_exact_match_and_decode_metrics() -> None:
    assert exact_match(["a", "b", "c", ""], ["a", "x", "c", ""]) == 0.75
    assert exact_match([], []) == 0.0
    metrics = decode_metrics(["Deutschland", "Frankreich"], ["Deutschland", "Frankreich"])
    assert metrics == {"exact_match": 1.0, "chrf": pytest.approx(100.0), "n": 2.0}
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        decode_metrics(["a", "b"], ["a"])
    with pytest.raises(TypeError, match="lists of strings"):
        chrf("abc", "abc")
