"""One NAS study: its lifecycle, its leader, its trials and training one candidate.

Owned here, above storage, search, tracking, tasks and settings:

    run             `run_study`: the lifecycle, top to bottom, on long-lived stage processes
    leader          rank 0's half: the Optuna study, the tracker, the bars, the heartbeat
    trials          opening the study, sampling an architecture, counting trials
    training        training and scoring one candidate on the pipeline
    inherited       a child judged from its parent's weights (Optuna's artifact store)
    inheritance     the trained weights a later candidate may start from
    shape           the pipeline shape (stages, threads, micro-batches) chosen for a machine
    tracker_setup   the tracker a study or a retraining writes to, from the settings
    workers         several local worker processes sharing one study
"""

from nas.study.run import StudyResult, run_study

__all__ = ["StudyResult", "run_study"]
