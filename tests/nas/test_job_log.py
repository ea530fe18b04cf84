"""`nas.job_log`: another process appends to the published log file, in its format and level;
nothing happens without one, and a process already writing to it does not write twice."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nas.job_log import JOB_LOG_ENV, JobLog, attach, publish

FORMAT = "[%(processName)s][%(name)s][%(levelname)s] - %(message)s"


@pytest.fixture
def job_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The root logger writing to a file at INFO, as Hydra's job logging sets it up."""
    monkeypatch.delenv(JOB_LOG_ENV, raising=False)
    root = logging.getLogger()
    level, path = root.level, tmp_path / "job.log"
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield path
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)


def test_a_stage_process_appends_to_the_published_file(job_file: Path) -> None:
    published = publish()
    assert published == JobLog(str(job_file), logging.INFO, FORMAT)
    logging.getLogger("nas.cli").info("from the parent")
    code = (
        "import logging\nfrom nas import job_log\nassert job_log.attach() is not None\n"
        "logging.getLogger('pipeline.x').info('from the stage')\n"
        "logging.getLogger('pipeline.x').debug('not at INFO')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
    assert job_file.read_text().splitlines() == [
        "[MainProcess][nas.cli][INFO] - from the parent",
        "[MainProcess][pipeline.x][INFO] - from the stage",
    ]


def test_a_process_that_writes_to_the_file_already_adds_nothing(job_file: Path) -> None:
    publish()
    handlers = list(logging.getLogger().handlers)
    assert attach() is None  # one stage under torchrun runs the CLI itself
    assert logging.getLogger().handlers == handlers


def test_without_a_log_file_nothing_is_published_or_attached(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(JOB_LOG_ENV, JobLog("/nowhere.log", logging.INFO).to_env())
    root = logging.getLogger()
    others = [h for h in root.handlers if not isinstance(h, logging.FileHandler)]
    monkeypatch.setattr(root, "handlers", others)
    assert publish() is None and JOB_LOG_ENV not in os.environ
    assert attach() is None


def test_a_garbled_variable_names_itself() -> None:
    with pytest.raises(ValueError, match=JOB_LOG_ENV):
        JobLog.from_env("{not json")
