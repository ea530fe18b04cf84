"""One NAS study: its lifecycle, its leader, its trials and training one candidate.

Owned here, above storage, search, tracking, tasks and settings:

    run             `run_study`: the lifecycle, top to bottom, on long-lived stage processes
    pooled          a study on the machine's stage pool: each candidate on the stages it needs
    remote          a pooled trial's rank 0 asking its worker's leader over a connection
    decisions       rank 0's decisions, agreed on every stage process
    candidate       building, training and measuring one candidate on every rank
    leader          rank 0's half: the study, the tracker, composed of the parts below
    asking          the next trial worth training (refusals, duplicates, orphans first)
    running         the trial training now: its heartbeat, a logging error held
    bars            the study's and the trial's progress bars
    opening         opening (creating, loading) a study, its seeds enqueued first
    strategies      the study's sampler and pruner, evolution's proposal check
    space           the search space `search_space.name` names, configured by the settings
    trials          what a trial records, which trials count, the time searched
    leading         which trial leads: the best mean fitness over its training seeds
    promotion       which children judged at inherited fidelity are measured in full
    phases          where a trial's seconds go: its steps and the fixed costs around them
    checkpoints     a training run's checkpoints and step history, to go on after a kill
    orphans         trials left running by dead processes: failed and asked again
    training        training and scoring one candidate on the pipeline
    judging         a child judged from its parent's weights, and promoted to a measurement
    inheritance     trained weights a later candidate starts from (in memory, or a file)
    kept_weights    the study's store of trained weights and this machine's copies of them
    shape           the pipeline shape (stages, threads, micro-batches) chosen for a machine
    shape_trials    a retraining's shape chosen among its best predicted by a few steps each
    profiles        candidates' layer costs, profiled at a size when first asked
    tracker_setup   the tracker a study or a retraining writes to, from the settings
    workers         several local worker processes sharing one study
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nas.study.run import StudyResult, run_study

__all__ = ["StudyResult", "run_study"]


def __getattr__(name: str) -> Any:
    # On first use: importing the package (`nas.study.workers`, say) loads no study code.
    if name in __all__:
        from nas.study import run

        return getattr(run, name)
    raise AttributeError(f"module 'nas.study' has no attribute {name!r}")
