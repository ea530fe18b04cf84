"""`elastic-nas` / `python -m nas`: one Hydra run is one NAS study (`--multirun` sweeps).

Hydra composes `conf/` (shipped as `nas.conf`, see `nas.config`), changes nothing else: the
run folder is Hydra's output directory and holds the job log `elastic-nas.log` (the stage
processes write to it too: `nas.job_log`), the study storage sits at a stable path under
`outputs/studies/` so a re-run with the same `study.name` resumes, and the stages are plain
functions: the search `nas.study.run.run_study(settings)`, then the retrain of its best
`nas.retrain.stage.retrain(settings)` (`stages=[retrain]` alone retrains a stored study). At the
end the results are summarised (`nas.report`).
Under `--multirun` each job is its own study, named `<study.name>-<the job's overrides>`
unless the sweep sets `study.name` itself.

    elastic-nas experiment=small_cpu
    elastic-nas study.name=demo study.n_trials=4 train.steps=40 sampler=evolution
    elastic-nas study.name=demo stages=[retrain] retrain.top_k=2 retrain.seeds=[0,1,2]
    elastic-nas --multirun pipeline.schedule=1f1b,gpipe seed=0,1
"""

from __future__ import annotations

import logging
import os
import re
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nas import job_log
from nas.config import CONFIG_PATH, register, to_settings

register()
logger = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def main(cfg: DictConfig) -> None:
    os.environ.setdefault("WANDB_MODE", "offline")
    hydra_cfg = HydraConfig.get()
    OmegaConf.update(cfg, "output_dir", hydra_cfg.runtime.output_dir, force_add=True)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        cfg.study.name = _job_study_name(
            cfg.study.name, list(hydra_cfg.overrides.task), hydra_cfg.job.num
        )
    try:
        settings = to_settings(cfg)
    except (ValueError, TypeError, OmegaConfBaseException) as error:  # a setting out of range
        logger.error("invalid settings: %s", "; ".join(str(error).strip().splitlines()))
        sys.exit(1)
    job_log.publish()  # the stage processes log to this job's log file too
    from nas.retrain.stage import retrain  # after composing: --help and --cfg stay fast
    from nas.storage.opening import StorageError
    from nas.study.run import run_study
    from nas.tasks import TaskInputError, check_task
    from pipeline import lead_process

    logger.info(
        "study %s: stages %s, run folder %s",
        settings.study.name,
        ",".join(settings.stages),
        settings.output_dir,
    )
    try:
        check_task(settings.task.name, settings.task.options)  # the user's data, read once
        result = run_study(settings) if "search" in settings.stages else None
        if result is not None:
            logger.info(
                "study %s: search done, %d finished trials, %d restarts",
                result.study_name,
                result.finished,
                result.restarts,
            )
        retrained = retrain(settings) if "retrain" in settings.stages else None
        if retrained is not None:
            logger.info(
                "study %s: retrain done, %d runs, selected %s",
                settings.study.name,
                len(retrained.runs),
                retrained.selected,
            )
        if lead_process():  # under torchrun: rank 0 reports (and imports matplotlib)
            from nas.report import report_study

            report_study(settings, result, retrained)
    except (StorageError, TaskInputError) as error:  # unreachable storage, a bad corpus
        logger.error("%s", error)  # file or task option: one line, no traceback
        sys.exit(1)


def _job_study_name(name: str, overrides: list[str], number: int) -> str:
    """A multirun job's study: `name` + the values this job sweeps (`nas-seed=1`), so that
    each job is its own study (and re-running the sweep resumes each); `name` itself when
    the sweep sets `study.name`; `name-<job number>` when the swept keys are unknown."""
    swept = {
        arg.split("=", 1)[0].lstrip("+~")
        for arg in sys.argv[1:]
        if "=" in arg and "," in arg.split("=", 1)[1] and not arg.split("=", 1)[1].startswith("[")
    }
    if "study.name" in swept:
        return name
    mine = [o.lstrip("+~") for o in overrides if o.split("=", 1)[0].lstrip("+~") in swept]
    suffix = re.sub(r"[^A-Za-z0-9_.=,+-]", "_", ",".join(mine)) or str(number)
    return f"{name}-{suffix}"


if __name__ == "__main__":
    main()
