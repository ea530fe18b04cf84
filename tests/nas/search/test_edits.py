"""`nas.search.edits`: one-edit mutants of the ET in `search_2h`'s space, and of the
Transformer space's seed (pure)."""

from __future__ import annotations

import pytest

from nas.search.edits import mutants, questions
from nas.study.space import configured_space
from search_spaces import SearchSpace, get_space
from search_spaces.architecture import functional_key
from search_spaces.suggest import CategoricalChoice, FixedSuggest
from tests.nas.harness.common import composed

Space2h = tuple[SearchSpace, dict[str, CategoricalChoice]]


@pytest.fixture(scope="module")
def search_2h() -> Space2h:
    space = configured_space(composed("experiment=search_2h"))
    assert space.limits().startswith("the parameter window")  # mutants must stay inside it
    return space, space.seed_params(space.seeds()["evolved_transformer"])


def test_each_mutant_is_its_parent_with_one_answer_changed_and_replays_as_a_trial(
    search_2h: Space2h,
) -> None:
    space, parent = search_2h
    asked = questions(parent, space)
    found = mutants(parent, space, 12, seed=3)
    assert len(found) == 12
    keys = {functional_key(m.architecture) for m in found}
    assert len(keys) == 12 and functional_key(space.replay(parent)) not in keys
    for mutant in found:
        edit = mutant.edit
        assert edit.old == parent[edit.name] != edit.new and edit.new in asked[edit.name]
        kept = [n for n in asked if n in mutant.params and n != edit.name]
        assert all(mutant.params[n] == parent[n] for n in kept), edit
        assert mutant.params[edit.name] == edit.new
        space.validate(mutant.architecture)  # inside the window
        replayed = space.sample(FixedSuggest(mutant.params))  # what an enqueued trial trains
        assert functional_key(replayed) == functional_key(mutant.architecture)
    assert len({m.edit.name.rsplit(".", 1)[-1] for m in found}) >= 3  # edits of many kinds


def test_mutants_are_drawn_the_same_for_a_seed_and_a_bad_count_is_refused(
    search_2h: Space2h,
) -> None:
    space, parent = search_2h
    first = mutants(parent, space, 4, seed=5)
    again = mutants(parent, space, 4, seed=5)
    assert [m.edit for m in first] == [m.edit for m in again]
    with pytest.raises(ValueError, match="count=0 is not valid"):
        mutants(parent, space, 0)
    widths = mutants(parent, space, 3, names=lambda n: n.endswith(".dim"))
    assert len(widths) == 3 and all(m.edit.name.endswith(".dim") for m in widths)
    with pytest.raises(ValueError, match="no answer to edit"):
        mutants(parent, space, 1, names=lambda n: n == "no such parameter")


def test_edits_need_nothing_more_of_a_space_than_its_answers() -> None:
    """The Transformer space's mutants: each changes one hyper-parameter of the seed."""
    space = get_space("transformer").configure(d_model=(32, 64))
    parent = space.seed_params(space.seeds()["transformer"])
    found = mutants(parent, space, 5, seed=1)
    assert len(found) == 5
    for mutant in found:
        assert [n for n in parent if mutant.params[n] != parent[n]] == [mutant.edit.name]
        assert space.replay(mutant.params) == mutant.architecture
