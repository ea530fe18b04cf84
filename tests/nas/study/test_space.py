"""`nas.study.space`: the space `search_space.name` names, configured by the settings."""

from __future__ import annotations

import pytest

from nas.study.space import configured_space
from search_spaces import get_space
from search_spaces.evolved_transformer_space import EvolvedTransformerSpace
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
