"""`nas.study.space`: the space `search_space.name` names, configured by the settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nas.study.space import SeedError, configured_space, seed_models
from search_spaces import get_space
from search_spaces.architecture import to_json
from search_spaces.evolved_transformer import PRIMITIVES
from search_spaces.evolved_transformer_space import PRIMER_SEED, EvolvedTransformerSpace
from search_spaces.primer import with_primitives
from search_spaces.transformer_space import TransformerSpace
from tests.nas.harness.common import composed


def test_the_named_space_gets_the_settings_it_has_options_for() -> None:
    evolved = configured_space(composed("search_space.max_cells=3", "search_space.d_model=[32]"))
    assert isinstance(evolved, EvolvedTransformerSpace)
    assert (evolved.d_model, evolved.min_cells, evolved.max_cells) == ((32,), 1, 3)
    plain = configured_space(composed("search_space.name=transformer", "task=charlm"))
    assert isinstance(plain, TransformerSpace) and plain.decoder_only  # as the task needs
    assert plain.n_heads == 4 and plain.layers == TransformerSpace().layers


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("search_space.primitives=[mdha]", r"search_space.primitives=\['mdha'\] is not an"),
        ("search_space.max_cells=1", "search_space.max_cells=1 is not an option of the"),
        ("search_space.param_window=[0.5,2.0]", r"search_space.param_window=\[0.5, 2.0\]"),
    ],
)
def test_a_setting_the_space_has_no_option_for_is_refused_unless_at_its_default(
    override: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message + ".*'transformer' space .its options: d_model"):
        configured_space(composed("search_space.name=transformer", override))


def test_an_unknown_space_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        ValueError, match="search_space.name='nope' is not valid; valid search spaces: ev"
    ):
        composed("search_space.name=nope")
    with pytest.raises(ValueError, match="unknown search space 'nope'; valid search spaces: evol"):
        get_space("nope")


PRIMER_SPACE = ("search_space.d_model=[32]", "search_space.primitives=[squared_relu,mdha]")


def test_seed_models_are_the_spaces_own_or_those_listed_by_name_or_exported_file(
    tmp_path: Path,
) -> None:
    plain = composed("search_space.d_model=[32]")
    assert list(seed_models(plain)) == ["transformer", "evolved_transformer"]  # the space's
    primer = composed(*PRIMER_SPACE, f"search_space.seeds=[evolved_transformer,{PRIMER_SEED}]")
    models, space = seed_models(primer), configured_space(primer)
    assert list(models) == ["evolved_transformer", PRIMER_SEED]
    assert models[PRIMER_SEED] == with_primitives(models["evolved_transformer"], PRIMITIVES)
    assert space.replay(space.seed_params(models[PRIMER_SEED])) == models[PRIMER_SEED]
    # a user's: an exported model's folder (its config.json) and a file of the architecture
    folder = tmp_path / "trial-370"
    folder.mkdir()
    config = {
        "format": "elastic-nas-model/2",
        "architecture": json.loads(to_json(models[PRIMER_SEED])),
    }
    (folder / "config.json").write_text(json.dumps(config))
    (tmp_path / "mine.json").write_text(to_json(models["evolved_transformer"]))
    listed = f"search_space.seeds=[transformer,'{folder}','{tmp_path / 'mine.json'}']"
    mine = seed_models(composed(*PRIMER_SPACE, listed))
    assert list(mine) == ["transformer", "trial-370", "mine"]
    assert mine["trial-370"] == models[PRIMER_SEED]
    assert mine["mine"] == models["evolved_transformer"]


def test_a_seed_the_study_cannot_train_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SeedError, match="'vit': neither a seed of the 'evolved_transformer' "):
        seed_models(composed("search_space.seeds=[vit]"))
    with pytest.raises(SeedError, match=f"{PRIMER_SEED!r}: neither"):  # primitives not offered
        seed_models(composed(f"search_space.seeds=[{PRIMER_SEED}]"))
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{not json")
    with pytest.raises(SeedError, match="garbled.json holds no architecture"):
        seed_models(composed(f"search_space.seeds=['{garbled}']"))
    wide = tmp_path / "wide.json"  # d_model 64 in a space of 32 only
    wide.write_text(to_json(configured_space(composed()).seeds()["evolved_transformer"]))
    with pytest.raises(SeedError, match="not in the configured 'evolved_transformer' space"):
        seed_models(composed("search_space.d_model=[32]", f"search_space.seeds=['{wide}']"))
    with pytest.raises(ValueError, match="search_space.seeds=.* names a seed twice"):
        composed("search_space.seeds=[transformer,transformer]")
