"""An exported model comes back as the same function: weights, decoding, errors (no processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

import nas
from nas import training
from nas.export import ModelFolderError, TranslationModel, export_model
from nas.settings import NasSettings, SearchSpaceSettings
from nas.tasks import get_task
from nas.tasks.translation import Translation
from pipeline.local.carry import as_carry, unwrap
from pipeline.local.spec import build_layer
from search_spaces.evolved_transformer import PRIMITIVES, evolved_transformer, seed_params
from search_spaces.primer import with_primitives


@pytest.fixture(scope="module")
def task() -> Translation:
    made = get_task("translation")
    assert isinstance(made, Translation)
    return made


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, task: Translation) -> tuple[Path, dict]:
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    specs, parameters = training.compile_model(arch, task, dropout=0.1)
    layers = {spec.key: build_layer(spec, 3, torch.device("cpu")) for spec in specs}
    state = {key: layer.state_dict() for key, layer in layers.items()}
    folder = export_model(
        tmp_path_factory.mktemp("models") / "et",
        state=state,
        arch=arch,
        params=seed_params(arch),
        task=task,
        settings=NasSettings(),
        metrics={"validation_loss": 1.5, "params": parameters},
        max_len=training.max_len(task),
    )
    return folder, layers


def test_the_loaded_model_computes_what_the_layers_computed(
    exported: tuple[Path, dict], task: Translation
) -> None:
    folder, layers = exported
    model = nas.load_model(folder)
    assert isinstance(model, TranslationModel) and not model.training
    assert model.metrics["validation_loss"] == 1.5
    assert model.params == seed_params(model.architecture)
    x, _ = next(task.batches("validation", 16))
    carry = as_carry(x, "x")
    with torch.no_grad():
        for layer in layers.values():
            carry = as_carry(layer.eval()(unwrap(carry)), "layer")
        assert torch.equal(model(x), unwrap(carry))


def test_translate_decodes_exactly_as_the_evaluation_does(
    exported: tuple[Path, dict], task: Translation
) -> None:
    model = nas.load_model(exported[0])
    assert isinstance(model, TranslationModel)
    sources = [english for english, _ in task.pairs("validation")][:150]
    evaluation = task.generate(
        lambda src, tgt: model((src, tgt)), "validation", batch_size=128, indices=range(150)
    )
    assert model.translate(sources) == evaluation
    assert model.translate([]) == []
    with pytest.raises(ValueError, match="reads at most 48"):
        model.translate(["x" * 49])
    with pytest.raises(TypeError, match="a list of sources"):
        model.translate("Germany")


def test_the_folder_holds_what_a_user_reads(exported: tuple[Path, dict]) -> None:
    folder = exported[0]
    info = json.loads((folder / "architecture.json").read_text())
    assert info["task"]["name"] == "translation" and info["params"]["dec.cells"] == 1
    config = yaml.safe_load((folder / "config.yaml").read_text())
    assert config["study"]["name"] == "nas" and config["train"]["steps"] == 60
    assert (folder / "architecture.png").stat().st_size > 10_000


def test_a_wrong_or_incomplete_folder_is_named_with_what_is_missing(
    exported: tuple[Path, dict], tmp_path: Path
) -> None:
    with pytest.raises(ModelFolderError, match=f"{tmp_path / 'none'} is not a folder"):
        nas.load_model(tmp_path / "none")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("architecture.json", "metrics.json"):
        (broken / name).write_text((exported[0] / name).read_text())
    with pytest.raises(ModelFolderError, match="missing model.safetensors, config.yaml"):
        nas.load_model(broken)
    for name in ("model.safetensors", "config.yaml"):
        (broken / name).write_bytes((exported[0] / name).read_bytes())
    info = json.loads((broken / "architecture.json").read_text())
    info["architecture"]["d_model"] = 64  # not the weights' width
    (broken / "architecture.json").write_text(json.dumps(info))
    with pytest.raises(ModelFolderError, match="does not fit the architecture .* 'embed_src'"):
        nas.load_model(broken)


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
    carry = as_carry(x, "x")
    with torch.no_grad():
        for layer in layers.values():
            carry = as_carry(layer(unwrap(carry)), "layer")
        assert torch.equal(model(x), unwrap(carry))
