"""One contract over every built-in task (what the harness asks of a task plug-in): its
metric directions, batches that are the same for the same arguments and exactly
`batch_size` rows, none larger than its largest batch, and an evaluation that returns every
metric it declares."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import torch

from nas.settings import DIRECTIONS
from nas.tasks import SPLITS, TASKS, Task, bind_options, get_task
from tests.nas.corpora import write_catalogs, write_tsv
from tests.nas.harness.common import write_text
from tests.nas.harness.plugin_task import PerplexityCharLM

OPTIONS: dict[str, dict[str, Any]] = {
    "translation": {},
    "charlm": {"seq_len": 16},
    "textfile": {"seq_len": 16},
    "corpus": {"vocab_size": 150},  # subword pieces (BPE); a corpus file written here
    "messages": {"tokenizer": "unigram", "vocab_size": 150},  # catalogs written here
}


@pytest.fixture(params=sorted(OPTIONS))
def task(request: pytest.FixtureRequest, tmp_path: Path) -> Task:
    options = dict(OPTIONS[request.param])
    if request.param == "textfile":
        options["path"] = str(write_text(tmp_path / "corpus.txt"))
    if request.param == "corpus":
        options["path"] = str(write_tsv(tmp_path / "pairs.tsv"))
    if request.param == "messages":
        options["folder"] = str(write_catalogs(tmp_path / "locale"))
    return get_task(request.param, **options)


def test_every_built_in_task_is_under_the_contract() -> None:
    assert sorted(OPTIONS) == sorted(TASKS)


CLASSES = {**TASKS, "plug-in": PerplexityCharLM}


@pytest.mark.parametrize("cls", CLASSES.values(), ids=list(CLASSES))
def test_the_metrics_a_task_singles_out_are_metrics_it_declares(cls: type[Task]) -> None:
    """Headline and decoded metrics are among `metric_directions` (what a study and the
    report can read), each named once."""
    for singled_out in (cls.headline_metrics, cls.decoded_metrics):
        assert set(singled_out) <= set(cls.metric_directions), (cls.name, singled_out)
        assert len(set(singled_out)) == len(singled_out)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_options_users_write_bind_to_the_constructor(name: str) -> None:
    """The flat options of the config (`task.options.*`) are what the constructor takes,
    checked without reading data (`nas.tasks.bind_options`, the CLI's check)."""
    mandatory = {"path": "never-read.txt"} if name in ("corpus", "textfile") else {}
    options = {**OPTIONS[name], **mandatory}
    assert set(bind_options(name, options)) <= set(inspect.signature(TASKS[name]).parameters)
    with pytest.raises(TypeError, match=rf"bad options for task '{name}': unknown options"):
        bind_options(name, {**options, "no_such_option": 1})


def test_a_task_declares_what_a_study_can_rank_it_by(task: Task) -> None:
    assert {"loss", "accuracy"} <= set(task.metric_directions)
    assert set(task.metric_directions.values()) <= set(DIRECTIONS)
    assert task.baseline_metric in task.metric_directions
    assert isinstance(task.decoder_only, bool) and task.example_call.startswith("m")


def test_batches_are_the_same_for_the_same_arguments_and_full(task: Task) -> None:
    for split in SPLITS:
        assert task.size(split) > 0
    first = list(task.batches("train", 8, seed=1, epoch=2))[:3]
    again = list(task.batches("train", 8, seed=1, epoch=2))[:3]
    for (x, y), (x2, y2) in zip(first, again, strict=True):
        assert torch.equal(y, y2) and y.shape[0] == 8
        for part, part2 in zip(_parts(x), _parts(x2), strict=True):
            assert torch.equal(part, part2) and part.shape[0] == 8


def test_no_batch_is_larger_than_the_largest(task: Task) -> None:
    """`largest_batch` (what a memory plan fits): full, the types of a batch, and no
    training or evaluation batch has a longer side."""
    x, y = task.largest_batch(8)
    biggest = [*_parts(x), y]
    assert all(part.shape[0] == 8 for part in biggest)
    for split in SPLITS:
        for batch_x, batch_y in task.batches(split, 8):
            parts = [*_parts(batch_x), batch_y]
            assert [p.dim() for p in parts] == [b.dim() for b in biggest]
            assert [p.dtype for p in parts] == [b.dtype for b in biggest]
            for part, big in zip(parts, biggest, strict=True):
                assert all(n <= most for n, most in zip(part.shape, big.shape, strict=True))


def test_evaluate_returns_every_declared_metric(task: Task) -> None:
    vocab = len(task.vocab)

    def uniform(x: Any) -> torch.Tensor:  # the same logits everywhere: (batch, vocab, seq)
        ids = _parts(x)[-1]
        return torch.zeros(ids.shape[0], vocab, ids.shape[1])

    metrics = task.evaluate(uniform, "validation", batch_size=16, max_batches=2, decode=2)
    assert set(task.metric_directions) <= set(metrics)
    assert metrics["loss"] == pytest.approx(torch.log(torch.tensor(float(vocab))).item())


def _parts(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, tuple | list) else [x]
