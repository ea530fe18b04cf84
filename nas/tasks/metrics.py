"""Metrics on generated strings: exact match and chrF, written out so nothing is downloaded.

chrF (Popovic 2015) is the character n-gram F-score. This follows sacreBLEU's defaults
(`CHRF()`: char order 6, word order 0, beta 2, whitespace removed, no epsilon smoothing):

* per string, count character n-grams (n = 1..6) of the hypothesis and of the reference
  after deleting all whitespace, and their clipped matches (multiset intersection);
* over a corpus, sum those three counts per n across all strings;
* average precision and recall over the orders where both sides have at least one n-gram
  (the "effective order"), then F_beta = (1 + beta^2) P R / (beta^2 P + R), times 100.

So a corpus score is not the mean of sentence scores, and a pair of empty strings (no
n-grams at all) scores 0, as in sacreBLEU.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

__all__ = ["chrf", "chrf_statistics", "decode_metrics", "exact_match", "sentence_chrf"]

CHAR_ORDER = 6
BETA = 2.0
_WHITESPACE = re.compile(r"\s+")


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("pass lists of strings, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def _ngrams(text: str, n: int) -> Counter[str]:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def chrf_statistics(hypothesis: str, reference: str, order: int = CHAR_ORDER) -> list[int]:
    """[hyp n-grams, ref n-grams, matches] for n = 1..order, flattened (3 * order ints)."""
    hyp, ref = _WHITESPACE.sub("", hypothesis), _WHITESPACE.sub("", reference)
    stats = []
    for n in range(1, order + 1):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        stats += [h.total(), r.total(), (h & r).total()]
    return stats


def _f_score(stats: Sequence[int], beta: float) -> float:
    precision = recall = 0.0
    effective = 0
    for n_hyp, n_ref, n_match in zip(stats[0::3], stats[1::3], stats[2::3], strict=True):
        if n_hyp > 0 and n_ref > 0:
            precision += n_match / n_hyp
            recall += n_match / n_ref
            effective += 1
    if effective == 0:
        return 0.0
    precision, recall = precision / effective, recall / effective
    if precision + recall == 0:
        return 0.0
    b2 = beta**2
    return 100 * (1 + b2) * precision * recall / (b2 * precision + recall)


def chrf(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    order: int = CHAR_ORDER,
    beta: float = BETA,
) -> float:
    """Corpus chrF in [0, 100] (statistics summed over the pairs, then one F-score)."""
    _check_lengths(hypotheses, references)
    total = [0] * (3 * order)
    for hyp, ref in zip(hypotheses, references, strict=True):
        total = [a + b for a, b in zip(total, chrf_statistics(hyp, ref, order), strict=True)]
    return _f_score(total, beta)


def sentence_chrf(
    hypothesis: str, reference: str, *, order: int = CHAR_ORDER, beta: float = BETA
) -> float:
    """chrF of one string pair, in [0, 100]."""
    return _f_score(chrf_statistics(hypothesis, reference, order), beta)


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The fraction of hypotheses equal to their reference (0.0 for no pairs)."""
    _check_lengths(hypotheses, references)
    if not references:
        return 0.0
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references)


def decode_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Exact match (fraction) and corpus chrF (0-100) of generated strings."""
    return {
        "exact_match": exact_match(hypotheses, references),
        "chrf": chrf(hypotheses, references),
        "n": float(len(references)),
    }
