"""`retrain.*`: the retrain stage that trains the study's best from scratch and exports them.

Read by `nas.retrain` (selection, seeds, checkpoints, the claims several workers share) and
`nas.export` (where the models go).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nas.settings.checks import Settings, setting
from nas.settings.constraints import POSITIVE, Distinct, Each, Flag, Integer, OrNone, Text, seconds

__all__ = ["RetrainSettings"]

_SEED = Integer(low=None)


@dataclass
class RetrainSettings(Settings):
    """The retrain stage (`nas.retrain.stage`): the `top_k` best architectures of the study (and,
    with `seed_models`, both seed architectures) trained from scratch for `steps` steps
    (None: `train.steps`) once per training seed in `seeds`; with `selection_seeds`, the
    `top_k` are first trained on those and only the best goes on to `seeds` (which then
    judge a model no choice saw them for); scored on whole splits with
    `decode_pairs` pairs decoded (None: all), then exported to `<models_dir>/<study>/<model>/`;
    each run checkpoints every `checkpoint_every` steps so that a killed retraining resumes;
    a worker waits up to `claim_wait_s` for a run another worker retraining it trains."""

    section: ClassVar[str] = "retrain"

    top_k: int = setting(1, POSITIVE)
    seeds: tuple[int, ...] = setting(
        (0,),
        Each(_SEED, non_empty=True, words="use a non-empty list of integers"),
        Distinct("names a seed twice"),
    )
    selection_seeds: tuple[int, ...] = setting(
        (),
        Each(_SEED, words="use distinct integers"),
        Distinct("is not valid; use distinct integers"),
    )
    steps: int | None = setting(None, OrNone(POSITIVE))
    seed_models: bool = setting(False, Flag())
    models_dir: str = setting("outputs/models", Text())
    # pairs decoded in the final scoring; None: every pair
    decode_pairs: int | None = setting(None, OrNone(POSITIVE))
    # each (model, seed) run saves a checkpoint every N steps into
    # <models_dir>/<study>/<model>/checkpoints/seed-<seed>/, so a killed retraining resumes
    # there (`nas.retrain.runs`); 0 or None: no checkpoints
    checkpoint_every: int | None = setting(
        100,
        OrNone(Integer(0, words="use a step count > 0, or 0 or null for no checkpoints")),
    )
    # several workers retraining one study share its runs (`nas.retrain.claims`): one with
    # only runs left that others train waits for their records, at most this many seconds
    # without any of them recorded, then stops with an error naming the claim it waited for
    claim_wait_s: float = setting(
        7200.0, seconds("how long a worker waits for a run another worker trains")
    )

    def rules(self) -> tuple[str | None, ...]:
        return (self._judges_chose_nothing(),)

    def _judges_chose_nothing(self) -> str | None:
        shared = sorted(set(self.selection_seeds) & set(self.seeds))
        if shared:
            return (
                f"retrain.selection_seeds={list(self.selection_seeds)!r} share {shared} with "
                f"retrain.seeds={list(self.seeds)!r}: the seeds that judge must play no part "
                "in the choice"
            )
        return None
