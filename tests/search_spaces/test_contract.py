"""Every registered search space keeps the `SearchSpace` contract the harness relies on.

One test per promise of `search_spaces.space.SearchSpace`, run over `search_spaces.SPACES`:
a space added to the registry is held to all of them (tiny shapes, one process).
"""

from __future__ import annotations

from typing import Any

import optuna
import pytest
import torch

from search_spaces import SPACES, SearchSpace, get_space, space_names
from search_spaces.architecture import Architecture, to_json
from search_spaces.compile import compile, parameter_count
from search_spaces.suggest import FixedSuggest, RandomSuggest
from tests.search_spaces.common import MAX_LEN, PAD, VOCAB, D, build, run, tokens

SIDES = pytest.mark.parametrize("decoder_only", [False, True], ids=["enc_dec", "decoder_only"])
NAMES = pytest.mark.parametrize("name", space_names())


def configured(name: str, decoder_only: bool = False) -> SearchSpace:
    return get_space(name).configure(d_model=(D,), decoder_only=decoder_only)


def compiled_tensors(arch: Architecture) -> dict[str, list[str]]:
    """Every tensor of the compiled model, `<layer key>.<tensor name>`, by layer key."""
    return {
        spec.key: [f"{spec.key}.{name}" for name in spec.factory().state_dict()]
        for spec in compile(arch, VOCAB, max_len=MAX_LEN, dropout=0.0, pad_id=PAD)
    }


def logits(arch: Architecture) -> torch.Tensor:
    """A forward pass of the compiled `arch` on a batch of 2: (2, VOCAB, 8)."""
    target = tokens(2, 8, 1)
    batch: Any = target if arch.decoder_only else (tokens(2, 7, 0), target)
    specs = compile(arch, VOCAB, max_len=MAX_LEN, dropout=0.0, pad_id=PAD)
    return run(build(specs), batch)


@NAMES
@SIDES
def test_random_samples_are_valid_replay_from_their_answers_and_run(
    name: str, decoder_only: bool
) -> None:
    space = configured(name, decoder_only)
    for seed in range(3):
        suggest = RandomSuggest(seed)
        arch = space.sample(suggest)
        space.validate(arch)  # every sample is valid when no window is configured
        assert arch.decoder_only == decoder_only and arch.d_model == D
        assert space.replay(suggest.params) == arch  # what a stored trial trains
        out = logits(arch)
        assert out.shape == (2, VOCAB, 8) and torch.isfinite(out).all()


@NAMES
def test_sampling_is_deterministic_for_a_seed_and_the_seed_matters(name: str) -> None:
    space = configured(name)
    first = [to_json(space.sample(RandomSuggest(seed))) for seed in range(6)]
    again = [to_json(space.sample(RandomSuggest(seed))) for seed in range(6)]
    assert first == again
    assert len(set(first)) > 1


@NAMES
@SIDES
def test_the_seeds_are_valid_and_their_params_replay_them_exactly(
    name: str, decoder_only: bool
) -> None:
    space = configured(name, decoder_only)
    seeds = space.seeds()
    assert seeds and all(arch.decoder_only == decoder_only for arch in seeds.values())
    for arch in seeds.values():
        space.validate(arch)
        suggest = FixedSuggest(space.seed_params(arch))
        assert space.sample(suggest) == arch
        assert suggest.unused() == []  # no stray answer: what `enqueue_trial` stores


@NAMES
@SIDES
def test_the_named_seeds_hold_the_seeds_and_replay_exactly(name: str, decoder_only: bool) -> None:
    space = configured(name, decoder_only)
    named = space.named_seeds()
    assert {k: named[k] for k in space.seeds()} == space.seeds()  # the seeds, by their names
    for arch in named.values():
        assert space.replay(space.seed_params(arch)) == arch


@NAMES
def test_a_bad_or_missing_answer_is_refused_naming_its_parameter(name: str) -> None:
    space = configured(name)
    suggest = RandomSuggest(0)
    space.sample(suggest)
    params = dict(suggest.params)
    for parameter in params:
        with pytest.raises(ValueError, match=f"parameter {parameter!r}"):
            space.replay({**params, parameter: "not a choice"})
    first = next(iter(params))
    with pytest.raises(KeyError, match=f"no fixed value for parameter {first!r}"):
        space.replay({k: v for k, v in params.items() if k != first})


@NAMES
def test_an_edit_names_tensors_of_the_compiled_child_and_an_unknown_name_is_refused(
    name: str,
) -> None:
    space = configured(name)
    suggest = RandomSuggest(1)
    arch = space.sample(suggest)
    tensors = compiled_tensors(arch)
    named = 0  # edits that touch tensors (an identity branch has none)
    for parameter, value in suggest.params.items():
        prefixes = space.edited_tensors(parameter, value, value, arch)
        assert all(prefix.split(".")[0] in tensors for prefix in prefixes), prefixes
        every = [t for key_tensors in tensors.values() for t in key_tensors]
        named += any(t.startswith(tuple(prefixes)) for t in every)
    assert named > 0
    with pytest.raises(ValueError, match="'no.such.parameter'"):
        space.edited_tensors("no.such.parameter", 0, 1, arch)


@NAMES
@pytest.mark.parametrize("sampler", [optuna.samplers.RandomSampler, optuna.samplers.TPESampler])
def test_an_optuna_sampler_drives_the_space_through_its_trials(
    name: str, sampler: type[optuna.samplers.BaseSampler]
) -> None:
    space = configured(name)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=sampler(seed=0))  # type: ignore[call-arg]
    study.optimize(lambda trial: float(parameter_count(space.sample(trial))), n_trials=4)
    for trial in study.trials:
        space.validate(space.replay(trial.params))
        assert trial.value == parameter_count(space.replay(trial.params))


@NAMES
def test_bad_options_are_refused_naming_the_option(name: str) -> None:
    space = get_space(name)
    assert {"d_model", "decoder_only", "n_heads"} <= set(space.option_names())
    with pytest.raises(ValueError, match=r"d_model=\[48\] is not valid"):
        space.configure(d_model=(48,))
    with pytest.raises(ValueError, match="n_heads=5 is not valid"):
        space.configure(n_heads=5)
    with pytest.raises(ValueError, match="decoder_only=None is not valid"):
        space.configure(decoder_only=None)
    with pytest.raises(ValueError, match=f"the {name!r} space has no option 'colour'; its "):
        space.configure(colour="blue")


def test_the_registry_names_each_space_once_and_refuses_an_unknown_name() -> None:
    assert space_names()[0] == "evolved_transformer" and "transformer" in space_names()
    assert all(SPACES[name].name == name for name in space_names())
    with pytest.raises(ValueError, match="unknown search space 'nope'; valid search spaces: "):
        get_space("nope")
