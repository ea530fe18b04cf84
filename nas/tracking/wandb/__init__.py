"""Everything that touches wandb, in one package (pyproject's import rule confines wandb here).

`tracker`: `WandbTracker`, a run per trial and a run per study, offline by default;
`values`: how it writes metric summaries and table cells, and `sync_command` for uploading
offline runs later. `history`: `read_run`, which decodes an offline run's `.wandb` file back
into its config, history rows, summary, metric definitions and artifacts; `log_format`: the
file's block format it reads them from. None of them imports wandb at module level, so
importing this package does not need wandb.
"""

from __future__ import annotations

from nas.tracking.wandb.history import (
    MetricDefinition,
    WandbArtifact,
    WandbRunData,
    file_digest,
    find_run_files,
    read_run,
)
from nas.tracking.wandb.log_format import WandbLogError, iter_chunks, iter_records
from nas.tracking.wandb.tracker import MODES, QUIET_SETTINGS, WandbTracker
from nas.tracking.wandb.values import STEP_METRIC, metric_summary, sync_command

__all__ = [
    "MODES",
    "QUIET_SETTINGS",
    "STEP_METRIC",
    "MetricDefinition",
    "WandbArtifact",
    "WandbLogError",
    "WandbRunData",
    "WandbTracker",
    "file_digest",
    "find_run_files",
    "iter_chunks",
    "iter_records",
    "metric_summary",
    "read_run",
    "sync_command",
]
