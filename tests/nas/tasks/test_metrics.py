"""chrF (sacreBLEU's CHRF) against hand-computed values and published examples; BLEU against
sacreBLEU's own function; exact match."""

from __future__ import annotations

import pytest
import sacrebleu

from nas.tasks import bleu, bleu_signature, chrf, decode_metrics, exact_match, sentence_chrf


def test_chrf_hand_computed() -> None:
    # Per order n: P_n = matched / hypothesis n-grams, R_n = matched / reference n-grams
    # (matches clipped: multiset intersection), over the orders where both sides have an
    # n-gram (the effective order); P, R their means; F2 = 5 P R / (4 P + R), times 100.
    #
    # "ab" vs "abc": n=1 {a,b} vs {a,b,c}: P=2/2 R=2/3; n=2 {ab} vs {ab,bc}: P=1/1 R=1/2;
    # n=3 the hypothesis has no trigram (not effective). Effective order 2:
    # P = 1, R = (2/3 + 1/2) / 2 = 7/12; F2 = (35/12) / (4 + 7/12) = 35/55 = 7/11.
    assert sentence_chrf("ab", "abc") == pytest.approx(100 * 7 / 11)  # 63.64
    # "cat" vs "act": n=1 all three match (P=R=1); n=2 {ca,at} vs {ac,ct} and n=3 {cat} vs
    # {act} match nothing. Effective order 3: P = R = 1/3, so F2 = 1/3.
    assert sentence_chrf("cat", "act") == pytest.approx(100 / 3)
    # "aaa" vs "aa" (clipping): n=1 3 vs 2 a's, 2 match: P=2/3 R=1; n=2 {aa,aa} vs {aa}, 1
    # match: P=1/2 R=1; n=3 the reference has no trigram. P = (2/3 + 1/2) / 2 = 7/12, R = 1;
    # F2 = (35/12) / (28/12 + 1) = 35/40 = 7/8.
    assert sentence_chrf("aaa", "aa") == pytest.approx(87.5)
    # beta=1 on "ab"/"abc": F1 = 2 P R / (P + R) = 2 (7/12) / (19/12) = 14/19.
    assert sentence_chrf("ab", "abc", beta=1) == pytest.approx(100 * 14 / 19)
    # order=1 on "cat"/"act": unigrams only, all matched.
    assert sentence_chrf("cat", "act", order=1) == pytest.approx(100)


def test_corpus_chrf_sums_statistics_not_sentence_scores() -> None:
    # ["ab", "cat"] vs ["abc", "act"], the counts (hyp, ref, match) summed per order:
    # n=1 (2+3, 3+3, 2+3) = (5, 6, 5); n=2 (1+2, 2+2, 1+0) = (3, 4, 1);
    # n=3 (0+1, 1+1, 0+0) = (1, 2, 0); effective order 3.
    # P = (5/5 + 1/3 + 0) / 3 = 4/9; R = (5/6 + 1/4 + 0) / 3 = 13/36;
    # F2 = 5 (4/9)(13/36) / (16/9 + 13/36) = (260/324) / (77/36) = 260/693.
    corpus = chrf(["ab", "cat"], ["abc", "act"])
    assert corpus == pytest.approx(100 * 260 / 693)  # 37.52
    mean = (sentence_chrf("ab", "abc") + sentence_chrf("cat", "act")) / 2  # 48.48
    assert corpus != pytest.approx(mean)
    assert chrf(["ab"], ["abc"]) == pytest.approx(sentence_chrf("ab", "abc"))


def test_chrf_identity_disjoint_whitespace_and_empty() -> None:
    assert sentence_chrf("Deutschland", "Deutschland") == pytest.approx(100)
    both = ["Deutschland", "Neu Seeland"]
    assert chrf(both, both) == pytest.approx(100)
    assert sentence_chrf("Neu Seeland", "NeuSeeland") == pytest.approx(100)  # spaces removed
    assert sentence_chrf("xyz", "abc") == 0.0
    assert chrf(["xyz", "uvw"], ["abc", "def"]) == 0.0
    assert sentence_chrf("", "abc") == 0.0
    assert sentence_chrf("abc", "") == 0.0
    assert sentence_chrf("", "") == 0.0  # no n-grams at all: 0, as in sacreBLEU
    assert chrf([], []) == 0.0  # no pairs: 0 (sacreBLEU itself raises an IndexError)


def test_chrf_matches_sacrebleu_examples() -> None:
    # Values printed by sacreBLEU 2's CHRF() (the Hugging Face chrF metric card): the
    # defaults are sacreBLEU's.
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


def test_exact_match_and_decode_metrics() -> None:
    assert exact_match(["a", "b", "c", ""], ["a", "x", "c", ""]) == 0.75
    assert exact_match([], []) == 0.0
    metrics = decode_metrics(["Deutschland", "Frankreich"], ["Deutschland", "Frankreich"])
    # one-word references have no 2- to 4-grams: corpus BLEU is 0 even for exact copies
    # (sacreBLEU without effective order), which is why names are judged by chrF
    assert metrics == {"exact_match": 1.0, "chrf": pytest.approx(100.0), "bleu": 0.0, "n": 2.0}
    assert decode_metrics([], []) == {"exact_match": 0.0, "chrf": 0.0, "bleu": 0.0, "n": 0.0}


def test_mismatched_lengths_and_single_strings_are_refused() -> None:
    # sacreBLEU would score the common prefix, and take a string's characters for sentences
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        decode_metrics(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="1 hypotheses but 3 references"):
        chrf(["a"], ["a", "b", "c"])
    with pytest.raises(ValueError, match="0 hypotheses but 1 references"):
        exact_match([], ["a"])
    with pytest.raises(TypeError, match="lists of strings"):
        chrf("abc", "abc")
    with pytest.raises(TypeError, match="lists of strings"):
        chrf(["abc"], "abc")
    with pytest.raises(TypeError, match="lists of strings"):
        exact_match("abc", ["abc"])
    with pytest.raises(TypeError, match="one pair of strings"):
        sentence_chrf(["abc"], ["abc"])  # type: ignore[arg-type]


def test_bleu_is_sacrebleus_corpus_bleu_with_its_signature() -> None:
    hypotheses = ["The cat sat on the mat.", "Datei wurde nicht gefunden", "%s Dateien kopiert"]
    references = ["The cat sat on a mat.", "Datei nicht gefunden", "%s Dateien wurden kopiert"]
    expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert bleu(hypotheses, references) == pytest.approx(expected) and 0 < expected < 100
    assert bleu(references, references) == pytest.approx(100.0)
    assert bleu([], []) == 0.0
    assert "tok:13a" in bleu_signature() and f"version:{sacrebleu.__version__}" in bleu_signature()
    assert decode_metrics(hypotheses, references)["bleu"] == pytest.approx(expected)
