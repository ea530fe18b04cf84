"""`nas.search.edits`: one-edit mutants of the ET in `search_2h`'s space (pure)."""

from __future__ import annotations

import functools

import pytest

from nas.search.edits import Space, mutants, questions
from nas.study.trials import param_window, sample_architecture, seed_architectures, space_primitives
from search_spaces.architecture import functional_key
from search_spaces.evolved_transformer import ParamWindow, seed_params, validate
from search_spaces.suggest import CategoricalChoice, FixedSuggest
from tests.nas.harness.common import composed

Space2h = tuple[Space, dict[str, CategoricalChoice], ParamWindow | None]


@pytest.fixture(scope="module")
def search_2h() -> Space2h:
    settings = composed("experiment=search_2h")
    space = functools.partial(sample_architecture, settings=settings)
    et = seed_architectures(settings)["evolved_transformer"]
    return space, seed_params(et, primitives=space_primitives(settings)), param_window(settings)


def test_each_mutant_is_its_parent_with_one_answer_changed_and_replays_as_a_trial(
    search_2h: Space2h,
) -> None:
    space, parent, window = search_2h
    asked = questions(parent, space)
    found = mutants(parent, space, 12, window=window, seed=3)
    assert len(found) == 12
    keys = {functional_key(m.architecture) for m in found}
    assert len(keys) == 12 and functional_key(space(FixedSuggest(parent))) not in keys
    for mutant in found:
        edit = mutant.edit
        assert edit.old == parent[edit.name] != edit.new and edit.new in asked[edit.name]
        kept = [n for n in asked if n in mutant.params and n != edit.name]
        assert all(mutant.params[n] == parent[n] for n in kept), edit
        assert mutant.params[edit.name] == edit.new
        validate(mutant.architecture, window=window)  # inside the window
        replayed = space(FixedSuggest(mutant.params))  # what a trial enqueued with it trains
        assert functional_key(replayed) == functional_key(mutant.architecture)
    assert len({m.edit.name.rsplit(".", 1)[-1] for m in found}) >= 3  # edits of many kinds


def test_mutants_are_drawn_the_same_for_a_seed_and_a_bad_count_is_refused(
    search_2h: Space2h,
) -> None:
    space, parent, window = search_2h
    first = mutants(parent, space, 4, window=window, seed=5)
    again = mutants(parent, space, 4, window=window, seed=5)
    assert [m.edit for m in first] == [m.edit for m in again]
    with pytest.raises(ValueError, match="count=0 is not valid"):
        mutants(parent, space, 0)
    widths = mutants(parent, space, 3, window=window, names=lambda n: n.endswith(".dim"))
    assert len(widths) == 3 and all(m.edit.name.endswith(".dim") for m in widths)
    with pytest.raises(ValueError, match="no answer to edit"):
        mutants(parent, space, 1, names=lambda n: n == "no such parameter")
