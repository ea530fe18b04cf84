"""The retrain stage: a study's best architectures trained again from scratch and exported.

Owned here, above the study (whose trials it reads and whose training it reuses) and the
export (which writes what it trained):

    stage     `retrain`: select, train every (model, seed), score, export; the order of it
    trainer   train, score and export, inside every stage process
    track     every run as a tracker run, every export recorded in the study
    records   where a retraining reads and keeps things, by its settings
    runs      one (model, seed) run's record and where it is kept
    claims    which worker trains which run when several share a retraining
    results   the models' figures, paired against a reference, as a table
"""

from nas.retrain.results import Model, RetrainResult, RetrainRun, model_table
from nas.retrain.stage import recorded_runs, retrain, retrain_models, select_models

__all__ = [
    "Model",
    "RetrainResult",
    "RetrainRun",
    "model_table",
    "recorded_runs",
    "retrain",
    "retrain_models",
    "select_models",
]
