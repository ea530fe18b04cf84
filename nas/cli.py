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

A configuration that cannot run ends the command in one `[ERROR]` line naming the key and
what is valid there, no traceback (`nas.config.one_line`): an option or a key that does not
exist, a value of the wrong type, a mandatory value left unset (refused by Hydra and
OmegaConf while composing), or a value the settings refuse.

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
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nas import job_log
from nas.config import CONFIG_PATH, one_line, register, to_settings
from nas.settings import NasSettings
from nas.stage_imports import STAGE_MODULES
from nas.tracking import TRACKERS

register()
logger = logging.getLogger(__name__)

# Hydra prints an error it meets while composing (several lines, no key's valid values)
# unless this is "1": then it raises it, to `main`, which says it in one line.
FULL_ERROR = "HYDRA_FULL_ERROR"
_TRACE_ASKED = os.environ.get(FULL_ERROR) == "1"  # the user's own: Hydra's full traces
# A line as the job log writes them (conf/config.yaml), for errors met before Hydra
# configures logging: while composing.
LOG_FORMAT = "[%(asctime)s][%(processName)s][%(name)s][%(levelname)s] - %(message)s"


def main() -> None:
    """The command (`elastic-nas`, `python -m nas`): Hydra composes the configuration and
    runs `run`; an error met while composing ends it in one [ERROR] line (module doc)."""
    if _TRACE_ASKED:
        run()
        return
    os.environ[FULL_ERROR] = "1"  # until the job starts (`run`)
    try:
        run()
    except (HydraException, OmegaConfBaseException) as error:
        _say_error("invalid settings: %s", one_line(error))
        sys.exit(1)
    finally:
        os.environ.pop(FULL_ERROR, None)


def _child_modules(settings: NasSettings) -> tuple[str, ...]:
    """The modules this job's processes import (its stages', its tracker's backend)."""
    stages = [module for stage in settings.stages for module in STAGE_MODULES[stage]]
    return (*stages, *TRACKERS[settings.tracker.name].preload)


def _say_error(message: str, *args: object) -> None:
    """One [ERROR] line on stderr, as the job log writes them: while composing, Hydra has
    configured no logging yet, or only its own (`--multirun`)."""
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, args, None)
    print(logging.Formatter(LOG_FORMAT).format(record), file=sys.stderr)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def run(cfg: DictConfig) -> None:
    """One job: the composed `cfg`'s settings, then its stages (module doc)."""
    if not _TRACE_ASKED:  # the job's own errors: reported as Hydra reports them
        os.environ.pop(FULL_ERROR, None)
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
        logger.error("invalid settings: %s", one_line(error))
        sys.exit(1)
    job_log.publish()  # the stage processes log to this job's log file too
    from pipeline.distributed.server import prestart

    # the stage processes' server imports torch meanwhile, on another core, and what the
    # job's processes import (seconds each), so that none of them pays for it; kept where
    # the command started it already (`nas.entry`)
    prestart(preload=_child_modules(settings))
    from nas.retrain.stage import retrain  # after composing: --help and --cfg stay fast
    from nas.storage.opening import StorageError
    from nas.study.opening import StudyMismatchError
    from nas.study.run import run_study
    from nas.study.space import SeedError, seed_models
    from nas.tasks import TaskInputError, check_task
    from pipeline import StageFailedError, lead_process

    logger.info(
        "study %s: stages %s, run folder %s",
        settings.study.name,
        ",".join(settings.stages),
        settings.output_dir,
    )
    try:
        check_task(settings.task.name, settings.task.options)  # the user's data, read once
        seed_models(settings)  # the seed models listed, an exported one's file read
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
    # storage, a stored study of another search, corpus, seed file
    except (StorageError, StudyMismatchError, TaskInputError, SeedError) as error:
        logger.error("%s", error)  # file or task option: one line, no traceback
        sys.exit(1)
    except StageFailedError as error:  # a stage process killed (or out of memory) mid-run
        logger.error(
            "%s; the same command again resumes (finished trials and retraining runs are kept)",
            " ".join(str(error).split()),
        )
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
