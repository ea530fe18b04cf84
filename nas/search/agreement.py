"""How well a cheap estimate ranks candidates as full training does: a fidelity, measured.

A search judges many candidates cheaply (a rung of a few hundred steps, weights inherited
from a trained parent and a few steps more) and trusts that the cheap figure orders them as
the full budget would. Before a search relies on an estimate, it is measured against the
truth: candidates trained to the full budget with training seeds shared with the reference
model (the Evolved Transformer), each a paired difference against it (`nas.paired`). Both
the truth and an estimate are "lower is better" differences against the reference.

`agreement(truth, estimate)` reads one estimate against the truth:

* Kendall's tau (`scipy.stats.kendalltau`, tau-b) over the candidates, with a percentile
  bootstrap interval (the candidates resampled with replacement, `scipy.stats.bootstrap`);
* sign accuracy: on the candidates whose truth is decided (its mean beyond `decided_se`
  paired standard errors), how often the estimate says the same: better or worse than the
  reference;
* top-1 and top-k agreement: is the estimate's best the true best; what share of the true
  top k the estimate's top k holds;
* and, given by the caller, the estimate's cost as a share of a full trial.

`noise_ceiling(first, second)` is the tau between two seeds of the truth: no estimate can be
expected to rank better than training the full budget again with another seed does. Pure:
figures in, figures out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from nas.paired import PairedDifference

__all__ = ["Agreement", "agreement", "kendall_tau", "noise_ceiling"]


@dataclass(frozen=True)
class Agreement:
    """One estimate against the truth (module doc); NaN where a figure is undefined."""

    candidates: int
    kendall_tau: float
    tau_low: float  # the bootstrap interval's ends (`confidence`)
    tau_high: float
    decided: int  # candidates whose truth is beyond `decided_se` standard errors
    sign_accuracy: float  # on the decided candidates
    top1: bool
    top_k: int
    top_k_share: float
    cost_share: float  # of a full trial, as the caller measured it

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values: NaN as None."""
        return {
            k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in asdict(self).items()
        }


def kendall_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-b of two equally long lists; NaN for fewer than 2 items or no order."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau needs lists of one length, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    from scipy.stats import kendalltau  # here: scipy.stats takes a second to import

    return float(kendalltau(x, y).statistic)


def agreement(
    truth: Mapping[str, PairedDifference],
    estimate: Mapping[str, float],
    *,
    cost_share: float,
    decided_se: float = 2.0,
    top_k: int = 3,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> Agreement:
    """`estimate` (lower is better, per candidate) against `truth` (each candidate's paired
    difference from the reference), over the candidates both hold with finite figures."""
    names = sorted(n for n in truth if n in estimate and _finite(truth[n].mean, estimate[n]))
    if len(names) < 2:
        raise ValueError(
            f"an agreement needs at least 2 candidates with a truth and an estimate, got "
            f"{names} (truth: {sorted(truth)}, estimate: {sorted(estimate)})"
        )
    if not 1 <= top_k <= len(names):
        raise ValueError(f"top_k={top_k} is not valid; use 1..{len(names)} (the candidates)")
    true = [truth[n].mean for n in names]
    guess = [estimate[n] for n in names]
    low, high = _tau_interval(true, guess, confidence, resamples, seed)
    decided = [
        n
        for n in names
        if math.isfinite(truth[n].stderr) and abs(truth[n].mean) > decided_se * truth[n].stderr
    ]
    same_sign = [math.copysign(1, truth[n].mean) == math.copysign(1, estimate[n]) for n in decided]
    best_true = sorted(names, key=lambda n: truth[n].mean)
    best_guess = sorted(names, key=lambda n: estimate[n])
    return Agreement(
        candidates=len(names),
        kendall_tau=kendall_tau(true, guess),
        tau_low=low,
        tau_high=high,
        decided=len(decided),
        sign_accuracy=sum(same_sign) / len(decided) if decided else math.nan,
        top1=best_true[0] == best_guess[0],
        top_k=top_k,
        top_k_share=len(set(best_true[:top_k]) & set(best_guess[:top_k])) / top_k,
        cost_share=cost_share,
    )


def noise_ceiling(first: Mapping[str, float], second: Mapping[str, float]) -> float:
    """Kendall's tau between the truth measured with one training seed and with another
    (each candidate's difference from the reference on that seed)."""
    names = sorted(n for n in first if n in second and _finite(first[n], second[n]))
    return kendall_tau([first[n] for n in names], [second[n] for n in names])


def _tau_interval(
    x: list[float], y: list[float], confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """The percentile bootstrap interval of tau, the candidates resampled in pairs; NaN when
    fewer than 3 candidates leave nothing to resample."""
    if len(x) < 3:
        return math.nan, math.nan
    from scipy.stats import bootstrap, kendalltau  # here: see kendall_tau

    def tau(a: np.ndarray, b: np.ndarray) -> float:
        value = kendalltau(a, b).statistic
        return 0.0 if math.isnan(value) else float(value)  # a resample with no order

    result = bootstrap(
        (np.asarray(x), np.asarray(y)),
        tau,
        paired=True,
        vectorized=False,
        n_resamples=resamples,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)
