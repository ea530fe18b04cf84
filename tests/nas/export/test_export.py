"""An exported model comes back as the same function: weights, decoding, the folder's files,
the model card, the old layout, and loading with the core install alone."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml
from huggingface_hub import ModelCard
from safetensors.torch import load_file, save_file

import nas
from nas.export.pretrained import ModelConfig
from nas.export.writing import ExportedModel, ModelFolderError, TranslationModel, export_model, main
from nas.settings import NasSettings, SearchSpaceSettings
from nas.study import training
from nas.tasks import Vocab, get_task
from nas.tasks.translation import Translation
from pipeline.local.carry import as_carry, unwrap
from pipeline.local.spec import build_layer
from search_spaces.architecture import Architecture, to_json
from search_spaces.evolved_transformer import PRIMITIVES, evolved_transformer, seed_params
from search_spaces.primer import with_primitives
from tests.nas.export.common import copy_folder, core_venv, export_built, run_in

METRICS = {
    "validation_loss": 1.5,
    "validation_chrf": 12.25,
    "validation_decode_s": 3.0,
    "test_loss": 1.625,
    "test_chrf": 11.5,
    "steps": 40,
    "seed": 2,
    "per_seed": [
        {"seed": 1, "validation_loss": 1.75, "test_loss": 1.875},
        {"seed": 2, "validation_loss": 1.5, "test_loss": 1.625},
    ],
}


@pytest.fixture(scope="module")
def task() -> Translation:
    made = get_task("translation")
    assert isinstance(made, Translation)
    return made


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, task: Translation) -> tuple[Path, dict]:
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    _, parameters = training.compile_model(arch, task, dropout=0.1)
    folder = tmp_path_factory.mktemp("models") / "et"
    return folder, _export(folder, arch, task, seed=3, metrics={**METRICS, "params": parameters})


def _export(
    folder: Path, arch: Architecture, task: Translation, seed: int, metrics: dict
) -> dict[str, torch.nn.Module]:
    """Export `arch`'s layers built with `seed` into `folder`; the layers."""
    return export_built(folder, arch, task, NasSettings(), seed=seed, metrics=metrics)


def layers_forward(layers: dict, x: object) -> torch.Tensor:
    carry = as_carry(x, "x")
    with torch.no_grad():
        for layer in layers.values():
            carry = as_carry(layer.eval()(unwrap(carry)), "layer")
    return unwrap(carry)


def test_the_loaded_model_computes_what_the_layers_computed(
    exported: tuple[Path, dict], task: Translation
) -> None:
    folder, layers = exported
    model = nas.load_model(folder)
    assert isinstance(model, TranslationModel) and not model.training
    assert model.metrics["validation_loss"] == 1.5
    assert model.params == seed_params(model.architecture)
    x, _ = next(task.batches("validation", 16))
    with torch.no_grad():
        assert torch.equal(model(x), layers_forward(layers, x))
    again = ExportedModel.from_pretrained(str(folder))  # the base class: what the folder holds
    assert isinstance(again, TranslationModel) and not again.training
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_translate_decodes_exactly_as_the_evaluation_does(
    exported: tuple[Path, dict], task: Translation
) -> None:
    model = TranslationModel.from_pretrained(exported[0])
    sources = [english for english, _ in task.pairs("validation")][:70]  # two batches
    evaluation = task.generate(
        lambda src, tgt: model((src, tgt)), "validation", batch_size=64, indices=range(70)
    )
    assert model.translate(sources, batch_size=64) == evaluation
    assert model.translate([]) == []
    with pytest.raises(ValueError, match="reads at most 48"):
        model.translate(["x" * 49])
    with pytest.raises(TypeError, match="a list of sources"):
        model.translate("Germany")


def test_the_folder_holds_what_a_user_reads(exported: tuple[Path, dict]) -> None:
    folder = exported[0]
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md",
        "architecture.png",
        "config.json",
        "config.yaml",
        "metrics.json",
        "model.safetensors",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "elastic-nas-model/2" and config["max_len"] == 50
    assert config["task"] == {"name": "translation", "options": {}}
    assert config["params"]["dec.cells"] == 1
    assert config["training"]["steps"] == 40 and config["training"]["batch_size"] == 32
    assert Vocab.from_json(json.dumps(config["vocab"])) == get_task("translation").vocab
    run = yaml.safe_load((folder / "config.yaml").read_text())
    assert run["study"]["name"] == "nas" and run["train"]["steps"] == 60
    assert (folder / "architecture.png").stat().st_size > 10_000
    assert json.loads((folder / "metrics.json").read_text())["per_seed"][0]["seed"] == 1
    names = load_file(str(folder / "model.safetensors"))
    assert set(names) == set(nas.load_model(folder).state_dict())
    assert "layers.embed_src.embed.tokens.weight" in names


def test_a_later_export_of_the_same_architecture_keeps_its_picture(
    exported: tuple[Path, dict], tmp_path: Path, task: Translation
) -> None:
    """A better seed re-exported into the model's folder: new weights, the picture kept; a
    folder of another architecture gets its own picture."""
    folder = copy_folder(exported[0], tmp_path / "again")
    (folder / "architecture.png").write_bytes(b"kept")
    arch = nas.load_model(folder).architecture

    weights = (folder / "model.safetensors").read_bytes()
    _export(folder, arch, task, seed=4, metrics={**METRICS, "seed": 4})
    assert (folder / "architecture.png").read_bytes() == b"kept"
    assert (folder / "model.safetensors").read_bytes() != weights
    other = evolved_transformer(32, n_heads=4, n_enc=2, n_dec=1)
    _export(folder, other, task, seed=4, metrics={**METRICS, "seed": 4})
    assert (folder / "architecture.png").read_bytes()[:4] == b"\x89PNG"


def test_the_model_card_says_what_the_model_is_and_how_to_load_it(
    exported: tuple[Path, dict],
) -> None:
    folder = exported[0]
    text = (folder / "README.md").read_text()
    card = ModelCard.load(folder / "README.md")  # the Hub's own reader of the front matter
    assert card.data.library_name == "elastic-nas" and card.data.license == "apache-2.0"
    assert card.data.pipeline_tag == "translation"
    assert {"elastic-nas", "neural-architecture-search", "translation"} <= set(card.data.tags)
    parameters = sum(p.numel() for p in nas.load_model(folder).parameters())
    assert f"parameters: {parameters:,}" in text
    assert "![The encoder and decoder cells](architecture.png)" in text
    assert "- steps: 40 per training seed" in text and "- batch size: 32" in text
    assert "| loss | 1.5 | 1.625 |" in text and "| chrf | 12.25 | 11.5 |" in text
    assert "decode s" not in text  # timings are not figures of the model
    assert "Whole splits, training seed 2:" in text
    assert "| 1 | 1.75 | 1.875 |" in text and "| 2 (these weights) | 1.5 | 1.625 |" in text
    assert f'TranslationModel.from_pretrained("{folder}")' in text
    assert f'nas.load_model("{folder}")' in text and "from nas.export.pretrained import" in text


def test_save_pretrained_writes_a_folder_that_loads_as_the_same_model(
    exported: tuple[Path, dict], tmp_path: Path, task: Translation
) -> None:
    model = nas.load_model(exported[0])
    saved = model.save_pretrained(tmp_path / "copy")
    assert sorted(p.name for p in saved.iterdir()) == sorted(p.name for p in exported[0].iterdir())
    assert (saved / "config.json").read_text() == (exported[0] / "config.json").read_text()
    assert f'from_pretrained("{saved}")' in (saved / "README.md").read_text()
    again = TranslationModel.from_pretrained(saved)
    x, _ = next(task.batches("validation", 8))
    with torch.no_grad():
        assert torch.equal(again(x), model(x))
    assert again.metrics == model.metrics


def test_a_missing_or_an_extra_tensor_is_named_with_the_file(
    exported: tuple[Path, dict], tmp_path: Path
) -> None:
    folder = copy_folder(exported[0], tmp_path / "strict")
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({**tensors, "layers.head.stray": torch.zeros(2)}, str(weights))
    with pytest.raises(ModelFolderError, match=f"{weights} holds tensor 'layers.head.stray'"):
        nas.load_model(folder)
    del tensors["layers.embed_tgt.embed.tokens.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(
        ModelFolderError, match=f"{weights} has no tensor 'layers.embed_tgt.embed.tokens.weight'"
    ):
        nas.load_model(folder)


def test_a_wrong_or_incomplete_folder_is_named_with_what_is_missing(
    exported: tuple[Path, dict], tmp_path: Path
) -> None:
    with pytest.raises(ModelFolderError, match=f"{tmp_path / 'none'} is not a folder"):
        nas.load_model(tmp_path / "none")
    with pytest.raises(ModelFolderError, match=f"{tmp_path / 'none'} is not a folder"):
        TranslationModel.from_pretrained(tmp_path / "none")  # a Path is never a Hub id
    broken = tmp_path / "broken"
    broken.mkdir()
    with pytest.raises(ModelFolderError, match="is not an exported model: missing config.json"):
        nas.load_model(broken)
    (broken / "config.json").write_text((exported[0] / "config.json").read_text())
    with pytest.raises(ModelFolderError, match="missing model.safetensors"):
        nas.load_model(broken)
    (broken / "model.safetensors").write_bytes((exported[0] / "model.safetensors").read_bytes())
    config = json.loads((broken / "config.json").read_text())
    config["architecture"]["d_model"] = 64  # not the weights' width
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ModelFolderError, match=r"tensor 'layers.embed_src.embed.\w+.weight' has shape"
    ):
        nas.load_model(broken)
    (broken / "config.json").write_text(json.dumps({**config, "format": "other/1"}))
    with pytest.raises(ModelFolderError, match="has format 'other/1'; valid"):
        nas.load_model(broken)


def test_a_hub_id_is_fetched_only_when_no_local_folder_has_that_name(tmp_path: Path) -> None:
    """Offline (`local_files_only`), an `owner/name` that is not in the cache is refused."""
    with pytest.raises(ModelFolderError, match="the Hugging Face Hub did not give it"):
        TranslationModel.from_pretrained(
            "nobody/no-such-model", local_files_only=True, cache_dir=tmp_path
        )


def test_a_folder_of_the_old_layout_loads_and_converts(
    exported: tuple[Path, dict], tmp_path: Path, task: Translation
) -> None:
    """architecture.json of format "elastic-nas-model/1", weights named `<layer>.<name>`."""
    folder = copy_folder(exported[0], tmp_path / "old")
    config = json.loads((folder / "config.json").read_text())
    old = {k: config[k] for k in ("task", "params", "architecture", "vocab", "max_len")}
    (folder / "architecture.json").write_text(json.dumps({"format": "elastic-nas-model/1", **old}))
    tensors = load_file(str(folder / "model.safetensors"))
    renamed = {k.removeprefix("layers."): v for k, v in tensors.items()}
    save_file(
        renamed, str(folder / "model.safetensors"), metadata={"format": "elastic-nas-model/1"}
    )
    for name in ("config.json", "README.md"):
        (folder / name).unlink()
    model = nas.load_model(folder)
    x, _ = next(task.batches("validation", 8))
    with torch.no_grad():
        assert torch.equal(model(x), layers_forward(exported[1], x))
    assert main(["convert", str(folder)]) == 0
    assert not (folder / "architecture.json").exists()
    assert set(load_file(str(folder / "model.safetensors"))) == set(tensors)
    assert "- steps: 40 per training seed" in (folder / "README.md").read_text()
    with torch.no_grad():
        assert torch.equal(TranslationModel.from_pretrained(folder)(x), model(x))
    assert main(["convert", str(folder)]) == 0  # already converted: nothing to do


def test_a_decoder_only_model_saves_and_loads_as_an_exported_model(tmp_path: Path) -> None:
    vocab = Vocab.from_texts(["the cat sat"])
    arch = evolved_transformer(32, n_heads=4, n_enc=0, n_dec=1)
    config = ModelConfig(
        architecture=json.loads(to_json(arch)),
        params={},
        vocab=json.loads(vocab.to_json()),
        task={"name": "charlm", "options": {"seq_len": 16}},
        max_len=16,
    )
    model = ExportedModel(config).eval()
    folder = model.save_pretrained(tmp_path / "lm")
    loaded = nas.load_model(folder)
    assert type(loaded) is ExportedModel and loaded.architecture == arch
    x = torch.tensor([vocab.encode("the cat", bos=True)])
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert 'pipeline_tag: "text-generation"' in (folder / "README.md").read_text()
    with pytest.raises(
        ModelFolderError, match="a decoder-only model, which a TranslationModel cannot hold"
    ):
        TranslationModel.from_pretrained(folder)


def test_a_model_with_primers_primitives_exports_and_loads(
    tmp_path: Path, task: Translation
) -> None:
    """Squared ReLU and multi-DConv-head attention (self and cross) come back from the folder
    as the same function, with the picture drawn."""
    arch = with_primitives(evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1), PRIMITIVES)
    specs, parameters = training.compile_model(arch, task, dropout=0.1)
    layers = {spec.key: build_layer(spec, 5, torch.device("cpu")).eval() for spec in specs}
    settings = NasSettings(search_space=SearchSpaceSettings(primitives=PRIMITIVES))
    folder = export_model(
        tmp_path / "primer",
        state={k: m.state_dict() for k, m in layers.items()},
        arch=arch,
        params=seed_params(arch, primitives=PRIMITIVES),
        task=task,
        settings=settings,
        metrics={"params": parameters},
        max_len=training.max_len(task),
    )
    model = nas.load_model(folder)
    assert model.architecture == arch
    assert (folder / "architecture.png").stat().st_size > 10_000
    x, _ = next(task.batches("validation", 8))
    with torch.no_grad():
        assert torch.equal(model(x), layers_forward(layers, x))


# -- loading with the core install alone ----------------------------------------------------
HARNESS_ONLY = (
    "optuna",
    "hydra",
    "omegaconf",
    "wandb",
    "matplotlib",
    "sacrebleu",
    "rich",
    "scipy",
    "pycountry",
    "sqlalchemy",
    "yaml",
)

# Loads the folder, translates and runs a forward on fixed ids; prints what it got, which
# of the harness's packages it imported, and whether Optuna could be imported at all.
LOAD = """
import importlib.util, json, sys
import torch
torch.set_num_threads(1)
import nas
from nas.export.pretrained import TranslationModel
model = TranslationModel.from_pretrained(sys.argv[1])
assert type(nas.load_model(sys.argv[1])) is TranslationModel
ids = torch.tensor([model.vocab.encode("Germany", bos=True)])
with torch.no_grad():
    logits = model((ids, ids))
print(json.dumps({
    "translations": model.translate(["Germany", "France", "Österreich"]),
    "logits": logits[0, :, -1].tolist(),
    "imported": sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[2:])),
    "hub_imported": "huggingface_hub" in sys.modules,
    "optuna": importlib.util.find_spec("optuna") is not None,
}))
"""


def load_in(python: Path | str, folder: Path, cwd: Path) -> dict:
    return run_in(python, LOAD, [str(folder), *HARNESS_ONLY], cwd)


@pytest.mark.timeout(600)
def test_a_model_loads_with_the_core_install_alone(
    exported: tuple[Path, dict], tmp_path: Path
) -> None:
    """In a virtual environment without Optuna, Hydra, W&B, matplotlib, sacrebleu, rich,
    SciPy, pycountry, SQLAlchemy or PyYAML the model loads and computes what it computes
    here; in this one, loading imports none of them (nor huggingface_hub, for a folder)."""
    folder = exported[0]
    here = load_in(sys.executable, folder, tmp_path)
    assert here["imported"] == [] and not here["hub_imported"] and here["optuna"]
    core = load_in(core_venv(tmp_path), folder, tmp_path)
    assert not core["optuna"] and core["imported"] == [] and not core["hub_imported"]
    model = TranslationModel.from_pretrained(folder)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ids = torch.tensor([model.vocab.encode("Germany", bos=True)])
        with torch.no_grad():
            logits = model((ids, ids))[0, :, -1]
        translations = model.translate(["Germany", "France", "Österreich"])
    finally:
        torch.set_num_threads(threads)
    assert core["translations"] == here["translations"] == translations
    assert torch.allclose(torch.tensor(core["logits"]), logits, atol=1e-5)
