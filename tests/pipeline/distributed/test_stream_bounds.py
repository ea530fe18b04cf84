"""A stream of any length holds only what is in flight: real processes, gloo, 1 thread each.

200 steps of `pipe.train(...)` under "2bw" and "pipemare" on 2 stages; every container a
segment keeps (inputs, targets, sizes, agreements, receives, micro-batches in flight,
outputs, input gradients, sends, timeline spans) is counted after each step on each rank.
Its largest count over steps 150-200 must not exceed its largest over steps 10-50 (spans,
whose count depends on timing, within 2x): a container that grows with the stream fails.
The step records behind `stats()` stop at `KEEP_STEPS`, and `stats()` reports each
process's memory peak over the whole run.
"""

from __future__ import annotations

import itertools

import pytest

import pipeline
from pipeline import StageContext
from pipeline.local.history import StepHistory
from pipeline.local.inflight import StepTimes
from pipeline.local.pipemare import PipeMareConfig
from tests.pipeline.distributed.common import model_pipeline

pytestmark = pytest.mark.multiprocess

STREAM_STEPS = 200
EARLY, LATE = range(10, 50), range(150, STREAM_STEPS)


def held_per_step(schedule: str) -> tuple[list[dict[str, int]], list[tuple[int, int]]]:
    config = PipeMareConfig(update_every=2) if schedule == "pipemare" else None
    pipe, batches = model_pipeline("mlp", schedule, 4, [3, 2], pipemare=config)
    data = itertools.islice(itertools.cycle(batches), STREAM_STEPS)
    counts = []
    for _loss in pipe.train(data):
        assert pipe.active_stream is not None
        counts.append(pipe.active_stream.held())
    assert pipe.step == STREAM_STEPS
    memory = [(s.process_peak_bytes, s.state_bytes) for s in pipe.stats().stages]
    pipe.close()
    return counts, memory


def run(ctx: StageContext) -> dict[str, tuple[list[dict[str, int]], list[tuple[int, int]]]]:
    return {schedule: held_per_step(schedule) for schedule in ("2bw", "pipemare")}


@pytest.mark.timeout(300)
def test_a_long_stream_holds_only_what_is_in_flight() -> None:
    results = pipeline.launch(run, 2, threads_per_stage=1, timeout_s=120)
    for rank, by_schedule in enumerate(results):
        for schedule, (counts, memory) in by_schedule.items():
            assert len(counts) == STREAM_STEPS
            # the whole run's peak of each stage process (CPU: its resident high-water mark)
            assert all(peak > 10 * state for peak, state in memory), memory
            for key in counts[0]:
                early = max(counts[t][key] for t in EARLY)
                late = max(counts[t][key] for t in LATE)
                bound = 2 * early if key == "spans" else early
                assert late <= bound, (rank, schedule, key, early, late)
            assert counts[-1]["inputs"] <= 2 * 4 and counts[-1]["sizes"] <= 2, counts[-1]


def test_step_records_stop_at_keep_and_memory_figures_survive_them() -> None:
    history = StepHistory(keep=3)
    for step in range(10):
        times = StepTimes(
            total_s=float(step),
            peak_activation_bytes=100 + step if step < 2 else 0,
            allocator_peak_bytes=1000 if step == 4 else 10,
        )
        history.record(8, None if step % 2 else 48, times)
    assert history.steps == 10 and history.held == 3
    assert [r.times.total_s for r in history.recent(5)] == [7.0, 8.0, 9.0]
    assert [r.tokens for r in history.recent(2)] == [48, None]
    assert history.latest_activation_bytes == 101  # measured at steps 0 and 1 only
    assert history.peak_allocator_bytes == 1000 and history.latest_allocator_bytes == 10
    with pytest.raises(ValueError, match="keep must be a positive int, got 0"):
        StepHistory(keep=0)
