"""Metrics on generated strings: exact match, chrF and BLEU (sacreBLEU's `CHRF`, `BLEU`).

BLEU is sacreBLEU's corpus BLEU with its defaults (4-gram, the "13a" tokenizer, exponential
smoothing, case-sensitive) on the detokenized text, so it is comparable with published
scores; `BLEU_SIGNATURE` is sacreBLEU's signature of those settings, which reports record.

chrF (Popovic 2015) is the character n-gram F-score; the score is sacreBLEU's own
(`sacrebleu.metrics.CHRF()` defaults: char order 6, word order 0, beta 2, whitespace
removed, no epsilon smoothing), so the numbers are comparable with published ones:

* per string, count character n-grams (n = 1..6) of the hypothesis and of the reference
  after deleting all whitespace, and their clipped matches (multiset intersection);
* over a corpus, sum those three counts per n across all strings;
* average precision and recall over the orders where both sides have at least one n-gram
  (the "effective order"), then F_beta = (1 + beta^2) P R / (beta^2 P + R), times 100.

So a corpus score is not the mean of sentence scores, and a pair of empty strings (no
n-grams at all) scores 0. What sacreBLEU leaves implicit is checked here first: no pairs
score 0 (sacreBLEU raises an IndexError), lists of different lengths raise a ValueError
(sacreBLEU would score the common prefix), and a single string where a list belongs raises a
TypeError (sacreBLEU would take each character for a sentence).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sacrebleu.metrics import CHRF

__all__ = ["bleu", "bleu_signature", "chrf", "decode_metrics", "exact_match", "sentence_chrf"]

CHAR_ORDER = 6
BETA = 2.0


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("pass lists of strings, not a single string")
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def _metric(order: int, beta: float) -> CHRF:
    # imported here: only a process that scores generated text pays for sacreBLEU
    from sacrebleu.metrics import CHRF

    # CHRF takes an int beta in its annotation but computes with any number (beta ** 2)
    return CHRF(char_order=order, word_order=0, beta=beta)  # type: ignore[arg-type]


def chrf(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    order: int = CHAR_ORDER,
    beta: float = BETA,
) -> float:
    """Corpus chrF in [0, 100] (statistics summed over the pairs, then one F-score);
    0.0 for no pairs."""
    _check_lengths(hypotheses, references)
    if not references:
        return 0.0
    score = _metric(order, beta).corpus_score(list(hypotheses), [list(references)])
    return float(score.score)


def sentence_chrf(
    hypothesis: str, reference: str, *, order: int = CHAR_ORDER, beta: float = BETA
) -> float:
    """chrF of one string pair, in [0, 100]."""
    if not isinstance(hypothesis, str) or not isinstance(reference, str):
        raise TypeError("sentence_chrf scores one pair of strings; chrf scores lists")
    return float(_metric(order, beta).sentence_score(hypothesis, [reference]).score)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU in [0, 100] (sacreBLEU's defaults, module doc); 0.0 for no pairs."""
    from sacrebleu.metrics import BLEU

    _check_lengths(hypotheses, references)
    if not references:
        return 0.0
    return float(BLEU().corpus_score(list(hypotheses), [list(references)]).score)


def bleu_signature() -> str:
    """sacreBLEU's signature of the BLEU computed here, e.g. `nrefs:1|case:mixed|eff:no|
    tok:13a|smooth:exp|version:2.6.0`: what a report records beside the score."""
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    metric.corpus_score(["a"], [["a"]])  # the signature names the references' count
    return str(metric.get_signature())


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """The fraction of hypotheses equal to their reference (0.0 for no pairs)."""
    _check_lengths(hypotheses, references)
    if not references:
        return 0.0
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / len(references)


def decode_metrics(hypotheses: list[str], references: list[str]) -> dict[str, float]:
    """Exact match (fraction), corpus chrF and corpus BLEU (0-100) of generated strings."""
    return {
        "exact_match": exact_match(hypotheses, references),
        "chrf": chrf(hypotheses, references),
        "bleu": bleu(hypotheses, references),
        "n": float(len(references)),
    }
