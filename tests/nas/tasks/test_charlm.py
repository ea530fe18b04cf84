"""The character language models: pydoc topics and the user's text file."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from nas.tasks import PAD, SPLITS, CharLM, TextFile, get_task
from nas.tasks.charlm import split_text
from nas.tasks.textfile import minimum_chars


@pytest.fixture(scope="module")
def lm() -> CharLM:
    return CharLM(seq_len=64)


def test_split_text_cuts_90_5_5() -> None:
    train, validation, test = split_text("x" * 1000)
    assert (len(train), len(validation), len(test)) == (900, 50, 50)
    assert "".join(split_text("abcdefghijklmnopqrstuvwxyz")) == "abcdefghijklmnopqrstuvwxyz"


def test_charlm_sizes_and_splits(lm: CharLM) -> None:
    sizes = {s: lm.size(s) for s in SPLITS}
    assert sizes["train"] > 400_000 and 15_000 < sizes["validation"] < 30_000
    assert 15_000 < sizes["test"] < 30_000
    assert lm.texts["validation"] not in lm.texts["train"]
    assert lm.vocab.decode(lm.ids["test"]) == lm.texts["test"]


def test_charlm_batches_are_shifted_windows_and_deterministic(lm: CharLM) -> None:
    x, y = next(lm.batches("train", 8, seed=1, epoch=0))
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = next(CharLM(seq_len=64).batches("train", 8, seed=1, epoch=0))  # another rank
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, next(lm.batches("train", 8, seed=1, epoch=1))[0])
    assert not torch.equal(x, next(lm.batches("train", 8, seed=2, epoch=0))[0])
    n = sum(1 for _ in lm.batches("train", 256, seed=0))
    assert n == ((lm.size("train") - 1) // 64) // 256


def test_charlm_evaluation_tiles_the_split_once(lm: CharLM) -> None:
    targets = []
    for x, y in lm.batches("validation", 32):
        assert x.shape == y.shape == (32, 64)
        targets.append(y[y != PAD])
    assert torch.equal(torch.cat(targets), lm.ids["validation"][1:])


def test_charlm_metrics_and_baseline(lm: CharLM) -> None:
    _, y = next(lm.batches("validation", 4))
    metrics = lm.metrics(torch.zeros(4, len(lm.vocab), 64), y)
    assert metrics["bits_per_char"] == pytest.approx(math.log2(len(lm.vocab)))
    assert set(metrics) == {"loss", "bits_per_char", "accuracy", "tokens"}
    for split in SPLITS:
        assert 0 < lm.unigram_baseline(split) < math.log2(len(lm.vocab))
    assert lm.baseline_metric == "bits_per_char"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_textfile_task(tmp_path: Path) -> None:
    text = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(100))
    task = get_task("textfile", path=write(tmp_path / "corpus.txt", text), seq_len=32)
    assert isinstance(task, TextFile)
    assert sum(task.size(s) for s in SPLITS) == len(text)
    assert task.size("validation") == int(len(text) * 0.95) - int(len(text) * 0.9)
    x, y = next(task.batches("train", 4, seed=0))
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert 0 < task.unigram_baseline("validation") < math.log2(len(task.vocab))


def test_textfile_accepts_exactly_the_minimum(tmp_path: Path) -> None:
    need = minimum_chars(16)
    assert need == 360
    task = TextFile(write(tmp_path / "min.txt", "abcde" * (need // 5)), seq_len=16)
    assert min(task.size(s) for s in SPLITS) >= 17
    next(task.batches("validation", 2))


def test_textfile_errors_name_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(FileNotFoundError, match=r"missing\.txt does not exist"):
        TextFile(missing)
    with pytest.raises(IsADirectoryError, match="not a regular file"):
        TextFile(tmp_path)
    empty = write(tmp_path / "empty.txt", "")
    with pytest.raises(ValueError, match=r"empty\.txt is empty.*at least 1,320"):
        TextFile(empty)
    short = write(tmp_path / "short.txt", "hello world\n" * 10)
    with pytest.raises(ValueError, match=r"short\.txt has 120 characters.*at least 1,320"):
        TextFile(short)
    binary = tmp_path / "latin1.txt"
    binary.write_bytes("Grüße\n".encode("latin-1") * 500)
    with pytest.raises(ValueError, match=r"latin1\.txt is not UTF-8"):
        TextFile(binary)
    with pytest.raises(ValueError, match="seq_len must be positive"):
        TextFile(short, seq_len=0)


def test_charlm_evaluate_gives_bits_per_char_and_accuracy(lm: CharLM) -> None:
    def uniform(x: torch.Tensor) -> torch.Tensor:
        return torch.zeros(x.shape[0], len(lm.vocab), x.shape[1])

    metrics = lm.evaluate(uniform, batch_size=32, max_batches=2, decode=5)  # nothing decodes
    assert set(metrics) == {"loss", "bits_per_char", "accuracy", "tokens"}
    assert math.isclose(metrics["bits_per_char"], math.log2(len(lm.vocab)), rel_tol=1e-6)
    assert metrics["tokens"] == 2 * 32 * 64
