"""What each stage's processes import, for the stage processes' server to preload.

The server (`pipeline.distributed.server`) imports these once and forks every stage
process from itself, so no process of the job pays for them: the command preloads every
stage's (`nas.entry`, before its configuration is known), the CLI the job's own where it
starts the server itself (`nas.cli`).
"""

from __future__ import annotations

__all__ = ["STAGE_MODULES"]

# the search's workers and the jobs they run on the pool; the retraining's shape trials
# and runs
STAGE_MODULES = {
    "search": ("nas.study.workers", "nas.study.pooled"),
    "retrain": ("nas.study.shape_trials", "nas.retrain.trainer"),
}
