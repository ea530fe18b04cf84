"""A model of a subword task exports with its tokenizer (`tokenizer.json`) and comes back
translating text to text, as the evaluation does, in a process that imports `nas.export.pretrained`
alone: no Optuna, Hydra or W&B."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import nas
from nas.export.writing import ModelFolderError, TranslationModel
from nas.settings import NasSettings, TaskSettings
from nas.study import training
from nas.tasks import Corpus, get_task
from nas.text.subwords import SubwordVocab
from search_spaces.evolved_transformer import evolved_transformer
from tests.nas.corpora import write_tsv
from tests.nas.export.common import copy_folder, core_venv, export_built, run_in

HARNESS = ("optuna", "hydra", "omegaconf", "wandb", "sacrebleu", "matplotlib", "yaml")
SOURCES = ["3 cannot open the file", "1 deleted the table", "5 did not find the key"]

# A fresh Python that imports only nas.export.pretrained: loads the folder, translates text,
# and says which of the harness's packages it imported.
LOAD = """
import json, sys
import torch
torch.set_num_threads(1)
from nas.export.pretrained import load_model
model = load_model(sys.argv[1])
print(json.dumps({
    "class": type(model).__name__,
    "vocab": type(model.vocab).__name__,
    "translations": model.translate(json.loads(sys.argv[2])),
    "imported": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[3:])),
}))
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Corpus]:
    """A folder exported from a BPE task's model with freshly initialised weights."""
    return export_task(tmp_path_factory.mktemp("subwords"))


def export_task(root: Path, **more: object) -> tuple[Path, Corpus]:
    """A model of the BPE corpus task with `more` options, exported to `root`/model."""
    options = {"path": str(write_tsv(root / "pairs.tsv")), "tokenizer": "bpe", "vocab_size": 150}
    options |= more
    task = get_task("corpus", **options)
    assert isinstance(task, Corpus)
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    _, parameters = training.compile_model(arch, task, dropout=0.1)
    folder = root / "model"
    settings = NasSettings(task=TaskSettings(name="corpus", options=options))
    metrics = {"params": parameters, "validation_bleu": 1.5, "data": task.describe()}
    export_built(folder, arch, task, settings, seed=5, metrics=metrics)
    return folder, task


def test_the_folder_carries_the_tokenizer(exported: tuple[Path, Corpus]) -> None:
    folder, task = exported
    assert (folder / "tokenizer.json").read_text() == task.vocab.to_json()
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab"] == {
        "specials": ["<pad>", "<bos>", "<eos>", "<unk>"],
        "kind": "bpe",
        "tokenizer": "tokenizer.json",
    }
    assert config["max_len"] == task.max_tokens + 2
    card = (folder / "README.md").read_text()
    assert "subword-level (BPE) encoder-decoder" in card and "`tokenizer.json`" in card
    signature = task.describe()["bleu_signature"]
    assert signature.startswith("nrefs:1|") and f"signature `{signature}`" in card


def test_the_loaded_model_translates_text_as_the_evaluation_does(
    exported: tuple[Path, Corpus],
) -> None:
    folder, task = exported
    model = nas.load_model(folder)
    assert isinstance(model, TranslationModel) and isinstance(model.vocab, SubwordVocab)
    assert model.vocab == task.vocab and model.max_length == task.max_tokens
    sources = [source for source, _ in task.pairs("validation")]
    evaluation = task.generate(lambda src, tgt: model((src, tgt)), "validation", batch_size=8)
    assert model.translate(sources, batch_size=8) == evaluation
    assert all(isinstance(text, str) for text in evaluation)
    long = " ".join(["3 cannot open the file"] * 10)
    with pytest.raises(
        ValueError, match=rf"has \d+ tokens; this model reads at most {task.max_tokens}"
    ):
        model.translate([long])


def test_save_pretrained_keeps_the_tokenizer(exported: tuple[Path, Corpus], tmp_path: Path) -> None:
    model = TranslationModel.from_pretrained(exported[0])
    again = TranslationModel.from_pretrained(model.save_pretrained(tmp_path / "copy"))
    assert (tmp_path / "copy" / "tokenizer.json").is_file() and again.vocab == model.vocab
    assert again.translate(SOURCES) == model.translate(SOURCES)


def test_a_missing_tokenizer_is_named(exported: tuple[Path, Corpus], tmp_path: Path) -> None:
    folder = copy_folder(exported[0], tmp_path / "broken")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=r"cannot read tokenizer.json, which config.json"):
        nas.load_model(folder)
    (folder / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(ModelFolderError, match=r"tokenizer.json is not a subword vocabulary"):
        nas.load_model(folder)


def load_in(python: Path | str, folder: Path, cwd: Path) -> dict:
    return run_in(python, LOAD, [str(folder), json.dumps(SOURCES), *HARNESS], cwd)


@pytest.mark.timeout(600)
def test_a_fresh_process_with_the_core_install_translates_text(
    exported: tuple[Path, Corpus], tmp_path: Path
) -> None:
    folder = exported[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        here = nas.load_model(folder)
        assert isinstance(here, TranslationModel)
        expected = here.translate(SOURCES)
    finally:
        torch.set_num_threads(threads)
    for python in (sys.executable, core_venv(tmp_path)):
        got = load_in(python, folder, tmp_path)
        assert got["imported"] == [], python  # neither Optuna, Hydra nor W&B
        assert (got["class"], got["vocab"]) == ("TranslationModel", "SubwordVocab")
        assert got["translations"] == expected


def test_separate_source_and_target_vocabularies_export_and_translate(tmp_path: Path) -> None:
    folder, task = export_task(tmp_path, shared_vocab=False, vocab_size=120)
    assert task.source_vocab != task.vocab
    assert (folder / "source_tokenizer.json").read_text() == task.source_vocab.to_json()
    assert (folder / "tokenizer.json").read_text() == task.vocab.to_json()  # the target's
    config = json.loads((folder / "config.json").read_text())
    assert config["source_vocab"]["tokenizer"] == "source_tokenizer.json"
    model = nas.load_model(folder)
    assert isinstance(model, TranslationModel)
    assert model.source_vocab == task.source_vocab and model.vocab == task.vocab
    sources = [source for source, _ in task.pairs("validation")]
    evaluation = task.generate(lambda src, tgt: model((src, tgt)), "validation", batch_size=8)
    assert model.translate(sources, batch_size=8) == evaluation
    again = TranslationModel.from_pretrained(model.save_pretrained(tmp_path / "copy"))
    assert again.source_vocab == model.source_vocab
    assert again.translate(SOURCES) == model.translate(SOURCES)
    card = (folder / "README.md").read_text()
    assert f"- source vocabulary: {len(task.source_vocab)} tokens" in card
    assert f"- target vocabulary: {len(task.vocab)} tokens" in card
    got = load_in(sys.executable, folder, tmp_path)
    assert got["translations"] == model.translate(SOURCES) and got["imported"] == []
    (folder / "source_tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=r"cannot read source_tokenizer.json, which"):
        nas.load_model(folder)
