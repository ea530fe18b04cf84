"""`task=corpus` from the command line: a bad corpus ends the command in one line before a
study starts; a corpus file gives a study whose exported model translates text with its
subword tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import nas
from nas.export.pretrained import TranslationModel
from tests.nas.corpora import write_tsv
from tests.nas.harness.common import SMALL, run

pytestmark = pytest.mark.multiprocess


def test_a_missing_corpus_is_one_line_and_no_study_starts(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.tsv"
    done = run(tmp_path, "task=corpus", f"task.options.path={missing}", "study.name=missing")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    assert "Traceback" not in said and "pipeline-stage" not in said, said[-3000:]
    errors = [line for line in said.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and f"{missing}: no such file or folder" in errors[0], said[-3000:]
    assert not (tmp_path / "studies").exists()  # the study was never opened


@pytest.mark.timeout(600)
def test_a_study_on_a_corpus_file_exports_a_model_that_translates_text(tmp_path: Path) -> None:
    corpus = write_tsv(tmp_path / "pairs.tsv")
    done = run(
        tmp_path,
        "task=corpus",
        f"task.options.path={corpus}",
        "task.options.vocab_size=150",
        "study.name=mine",
        "study.n_trials=1",
        "tracker=none",
        "train.steps=2",
        "train.eval_every=2",
        *SMALL,
        f"retrain.models_dir={tmp_path / 'models'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [folder] = (tmp_path / "models" / "mine").iterdir()
    assert json.loads((folder / "config.json").read_text())["vocab"]["kind"] == "bpe"
    model = nas.load_model(folder)
    assert isinstance(model, TranslationModel) and (folder / "tokenizer.json").is_file()
    [text] = model.translate(["3 cannot open the file"])
    assert isinstance(text, str)
