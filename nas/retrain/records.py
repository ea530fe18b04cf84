"""Where a retraining of a study reads and keeps things, by its settings.

Every part of a retraining (the caller that selects and compares, the stage processes that
train and export, the tracking at the end) finds the same places from the settings alone:
the stored study it reads the trials from and records the exports in (`load_study`), each
model's export folder (`model_folder`), and the runs recorded there that were trained as the
settings train now (`run_digest`, `model_records`, `recorded`; the files themselves are
`nas.retrain.runs`'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import optuna

from nas import storage
from nas.retrain import runs as retrain_runs
from nas.retrain.results import Model, RetrainRun
from nas.settings import NasSettings
from nas.storage import url as storage_url

__all__ = ["load_study", "model_folder", "model_records", "recorded", "run_digest"]


def load_study(settings: NasSettings) -> optuna.Study:
    """The stored study `settings.study.name`; a `ValueError` naming it (and the storage,
    without its password) when there is none."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    missing = ValueError(
        f"no study {settings.study.name!r} in {storage_url.masked(settings.storage_url)}; run "
        "the search first (stages=[search])"
    )
    url = settings.storage_url
    for prefix in ("sqlite:///", storage.JOURNAL):  # a file that is not there: no study
        if url.startswith(prefix) and not Path(url[len(prefix) :].split("?")[0]).exists():
            raise missing
    try:
        return optuna.load_study(
            study_name=settings.study.name,
            storage=storage.make_storage(
                settings.storage_url, max_retries=settings.study.max_retries
            ),
        )
    except KeyError as error:
        raise missing from error


def model_folder(settings: NasSettings, model: Model) -> Path:
    """Where `model` is exported and its runs are recorded: `<models_dir>/<study>/<model>`."""
    return Path(settings.retrain.models_dir) / settings.study.name / model.name


def run_digest(settings: NasSettings, model: Model) -> str:
    """How a run of `model` trains: equal digests, the same run (`nas.retrain.runs`)."""
    how = {
        "train": asdict(settings.train),
        "task": asdict(settings.task),
        "decode_pairs": settings.retrain.decode_pairs,
    }
    return retrain_runs.fingerprint(
        model.architecture, settings.retrain.steps or settings.train.steps, how
    )


def model_records(settings: NasSettings, model: Model) -> dict[int, tuple[RetrainRun, bool]]:
    """`model`'s recorded runs trained as now, by seed, and whether each was tracked."""
    digest, folder = run_digest(settings, model), model_folder(settings, model)
    found = {seed: retrain_runs.load(folder, seed, digest) for seed in settings.retrain.seeds}
    return {seed: (RetrainRun(**f[0]), f[1]) for seed, f in found.items() if f is not None}


def recorded(
    settings: NasSettings, models: Sequence[Model]
) -> tuple[dict[tuple[str, int], RetrainRun], set[tuple[str, int]]]:
    """The runs an earlier retraining of these models finished and recorded, by (model,
    seed), and which of them were tracked."""
    done, tracked = {}, set()
    for model in models:
        for seed, (run, was_tracked) in model_records(settings, model).items():
            done[model.name, seed] = run
            if was_tracked:
                tracked.add((model.name, seed))
    return done, tracked
