"""The stage processes write to the job's log file too, not only the process that ran the CLI.

Hydra sets up logging in the process that runs `nas.cli.main`: its console, and the job log
`<run dir>/elastic-nas.log`. The stage processes that `pipeline.launch` spawns start with
logging unset, so what they log (the runtime's plans, schedules and migrations on
`pipeline.distributed.events`, the harness's own records) would reach the job log never,
and the terminal only at WARNING. So:

* `publish()`, in the CLI once Hydra has set up logging, finds the root logger's log file
  and puts it (path, level, format) in the environment variable `JOB_LOG_ENV`, which the
  spawned processes inherit;
* `attach()`, the first thing each stage entry function (`nas.study.run`, `nas.retrain.stage`) does,
  adds a handler appending to that file with the same format and level (and keeps WARNING
  and above on stderr, as they were). Without the variable (a study run from a script or a
  test) it does nothing; in a process that already writes to the file (one stage under
  torchrun, which runs the CLI itself) neither.

Every line carries the process's name (`conf/config.yaml` adds it to Hydra's format):
`MainProcess` for the CLI, `pipeline-stage-<rank>` for a stage.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["JOB_LOG_ENV", "JobLog", "attach", "publish"]

JOB_LOG_ENV = "ELASTIC_NAS_JOB_LOG"


@dataclass(frozen=True)
class JobLog:
    """Where and how the job logs: a file, the root logger's level, a `logging` format."""

    path: str
    level: int
    format: str | None = None
    datefmt: str | None = None

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, text: str) -> JobLog:
        """The `JobLog` that `to_env` wrote; ValueError naming the text when it is not one."""
        try:
            fields = json.loads(text)
            return cls(**fields)
        except (ValueError, TypeError) as error:
            raise ValueError(
                f"{JOB_LOG_ENV}={text!r} is not a job log (JSON with path, level, format, "
                f"datefmt): {error}"
            ) from error


def publish() -> JobLog | None:
    """Put the root logger's log file (the last one set up, os.devnull aside) in the
    environment for the stage processes to come; returns it. Without a log file (Hydra's
    job logging disabled) the variable is removed and None returned."""
    root = logging.getLogger()
    files = [
        h
        for h in root.handlers
        if isinstance(h, logging.FileHandler) and h.baseFilename != os.path.abspath(os.devnull)
    ]
    handler = files[-1] if files else None
    if handler is None:
        os.environ.pop(JOB_LOG_ENV, None)
        return None
    formatter = handler.formatter
    job = JobLog(
        handler.baseFilename,
        max(root.level, handler.level),
        formatter._fmt if formatter is not None else None,
        formatter.datefmt if formatter is not None else None,
    )
    os.environ[JOB_LOG_ENV] = job.to_env()
    return job


def attach() -> JobLog | None:
    """In a stage process: log to the published job log (module docstring); returns it, or
    None when nothing was published or this process writes to it already."""
    text = os.environ.get(JOB_LOG_ENV)
    if not text:
        return None
    job = JobLog.from_env(text)
    root = logging.getLogger()
    path = str(Path(job.path).resolve())
    if any(
        isinstance(h, logging.FileHandler) and str(Path(h.baseFilename).resolve()) == path
        for h in root.handlers
    ):
        return None
    if not root.handlers and logging.lastResort is not None:
        root.addHandler(logging.lastResort)  # WARNING and above still reach stderr, as before
    file = logging.FileHandler(job.path, mode="a", encoding="utf-8")
    file.setFormatter(logging.Formatter(job.format, job.datefmt))
    root.addHandler(file)
    root.setLevel(job.level)
    return job
