"""The search space as data: sampling, validity rules, seeds, replay, JSON, summary."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import random
import re
from collections.abc import Sequence
from typing import Any

import pytest

from search_spaces.architecture import (
    ATTENTION_LAYERS,
    COMBINERS,
    CROSS_LAYERS,
    DEAD,
    DECODER_BLOCKS,
    ENCODER_BLOCKS,
    LAYER_NAMES,
    Architecture,
    Block,
    Branch,
    Cell,
    InvalidArchitecture,
    from_json,
    has_dim,
    summary,
    to_json,
)
from search_spaces.compile import compile, parameter_count
from search_spaces.evolved_transformer import (
    ParamWindow,
    evolved_transformer,
    sample,
    seed_params,
    transformer,
    validate,
    with_residual,
)
from search_spaces.suggest import CategoricalChoice, FixedSuggest, RandomSuggest, Suggest, choose
from tests.search_spaces.common import D, build

REASONS = {
    "dead": r"^(enc|dec)\.block\d: both branches are dead \(at most one dead branch per block\)$",
    "attends": r"^dec: the decoder cell never attends to the encoder$",
    "residual": r"^(enc|dec): no residual path from the cell input to its output",
    "window": r"^[\d,]+ parameters is outside \[[\d.]+x, [\d.]+x\] of the 6-layer Transformer's",
}
SEEDS = {
    "transformer": transformer(D, 4),
    "evolved": evolved_transformer(D, 4),
    "transformer_lm": transformer(D, 4, 0, 4),
    "evolved_lm": evolved_transformer(D, 4, 0, 2),
}


def reason(error: InvalidArchitecture) -> str:
    matches = [key for key, pattern in REASONS.items() if re.search(pattern, str(error))]
    assert len(matches) == 1, f"unexpected rejection: {error}"
    return matches[0]


class RecordingSuggest(RandomSuggest):
    """RandomSuggest that records every name's choices (or int range) as asked."""

    def __init__(self, seed: int, asked: dict[str, object]) -> None:
        super().__init__(seed)
        self.asked = asked

    def suggest_categorical(self, name: str, choices: Sequence[CategoricalChoice]) -> Any:
        assert self.asked.setdefault(name, list(choices)) == list(choices), name
        return super().suggest_categorical(name, choices)

    def suggest_int(self, name: str, low: int, high: int) -> int:
        assert self.asked.setdefault(name, (low, high)) == (low, high), name
        return super().suggest_int(name, low, high)


@pytest.mark.parametrize("cells", [(1, 1), (1, 3)])
@pytest.mark.parametrize("decoder_only", [False, True], ids=["enc_dec", "decoder_only"])
def test_every_random_sample_is_a_valid_architecture(
    decoder_only: bool, cells: tuple[int, int]
) -> None:
    space: dict[str, Any] = {
        "d_model": [D, 2 * D],
        "decoder_only": decoder_only,
        "cells": cells,
        "window": None,
    }
    asked: dict[str, object] = {}  # name -> choices: fixed for the whole study (Optuna)
    repaired = 0
    for seed in range(1500):
        suggest = RecordingSuggest(seed, asked)
        arch = sample(suggest, **space)
        validate(arch, window=None)  # every rule holds, by construction or repair
        assert arch.decoder_only == decoder_only
        replay = FixedSuggest(suggest.params)  # deterministic: the same answers, same model
        assert sample(replay, **space) == arch and replay.unused() == []
        own = FixedSuggest(seed_params(arch))  # the architecture's own parameters give it back
        assert sample(own, **space) == arch and own.unused() == []
        try:  # without the repair the same answers give the same model, or are rejected
            assert sample(FixedSuggest(suggest.params), **space, repair=False) == arch
        except InvalidArchitecture as error:
            assert reason(error) == "residual"
            repaired += 1
        assert from_json(to_json(arch)) == arch
        assert "\n" not in summary(arch)
    assert 0 < repaired < 1500  # the residual repair runs where it must, not always


def random_branch(rng: random.Random, i: int, side: str) -> Branch:
    """A uniformly random branch of block i, dead allowed (no rule of the space applied)."""
    if rng.random() < 0.5:
        return Branch(rng.randint(0, i), "identity")
    layer = rng.choice(
        [n for n in LAYER_NAMES if n != "identity" and (side == "dec" or n not in CROSS_LAYERS)]
    )
    if layer == "dead":
        return DEAD
    return Branch(
        rng.randint(0, i),
        layer,
        "layer_norm",
        1.0 if has_dim(layer) else None,
        "relu",
        4 if layer in ATTENTION_LAYERS else None,
        4 if layer.startswith("light_conv") else None,
    )


def random_cell(rng: random.Random, side: str) -> Cell:
    blocks = []
    for i in range(ENCODER_BLOCKS if side == "enc" else DECODER_BLOCKS):
        left, right = random_branch(rng, i, side), random_branch(rng, i, side)
        combiner = "add" if DEAD in (left, right) else rng.choice(COMBINERS)
        blocks.append(Block(left, right, combiner))
    return Cell(tuple(blocks))


def test_without_the_encoding_and_repair_most_random_points_are_invalid() -> None:
    """What the space's encoding and repair fix: the rules checked on uniform random cells
    (dead on either side, no cross block, no repair) reject nearly all of them."""
    rng, reasons = random.Random(0), collections.Counter[str]()
    for _ in range(300):
        arch = Architecture(D, 1, random_cell(rng, "enc"), 1, random_cell(rng, "dec"))
        try:
            validate(arch, window=None)
            reasons["valid"] += 1
        except InvalidArchitecture as error:
            reasons[reason(error)] += 1
    assert reasons["valid"] < 30 and {"dead", "attends", "residual"} <= set(reasons), reasons


def test_the_residual_repair_changes_only_cells_without_a_residual_path() -> None:
    for name, seed in SEEDS.items():  # valid cells come back as they are
        for cell in (seed.encoder, seed.decoder):
            if cell is not None:
                assert with_residual(cell) is cell, name
    et = SEEDS["evolved"]
    assert et.encoder is not None
    gated = dataclasses.replace(et.encoder.blocks[0], combiner="multiply")  # breaks the chain
    broken = replace_block(et, "enc", 0, gated)
    with pytest.raises(InvalidArchitecture, match=REASONS["residual"]):
        validate(broken)
    assert broken.encoder is not None and with_residual(broken.encoder) == et.encoder  # "add"
    conv = Block(et.encoder.blocks[0].left, Branch(0, "conv_3x1", dim=1.0), "multiply")
    broken = replace_block(et, "enc", 0, conv)  # no identity of the input: no combiner helps
    assert broken.encoder is not None
    fixed = with_residual(broken.encoder)
    assert fixed.blocks[:-1] == broken.encoder.blocks[:-1]  # only the last block's right
    assert fixed.blocks[-1].left == broken.encoder.blocks[-1].left
    assert fixed.blocks[-1].right == Branch(0, "identity")  # the chain ends at the input
    assert fixed.blocks[-1].combiner == "add" and with_residual(fixed) is fixed
    validate(replace_block(broken, "enc", 5, fixed.blocks[-1]), window=None)


def test_the_residual_repair_of_random_cells() -> None:
    """Any cell comes back with a residual path, changed in one combiner (the first that
    works) or else in its last block's right branch, nothing else."""
    rng, kinds = random.Random(1), collections.Counter[str]()
    for _ in range(2000):
        side = rng.choice(["enc", "dec"])
        cell = random_cell(rng, side)
        fixed = with_residual(cell)
        assert with_residual(fixed) is fixed  # it has a path now (a cell with one is kept)
        assert with_residual(cell) == fixed  # and the repair is pure
        pairs = zip(cell.blocks, fixed.blocks, strict=True)
        changed = [i for i, (a, b) in enumerate(pairs) if a != b]
        if fixed is cell:
            kinds["valid"] += 1
        elif fixed.blocks[changed[0]] == dataclasses.replace(
            cell.blocks[changed[0]], combiner="add"
        ):
            assert len(changed) == 1
            kinds["combiner"] += 1
            for i in range(changed[0]):  # no earlier combiner would have done
                if cell.blocks[i].combiner != "add":
                    added = dataclasses.replace(cell.blocks[i], combiner="add")
                    other = Cell((*cell.blocks[:i], added, *cell.blocks[i + 1 :]))
                    assert with_residual(other) is not other
        else:
            assert changed == [len(cell.blocks) - 1]
            last = fixed.blocks[-1]
            assert last.left == cell.blocks[-1].left and last.right.layer == "identity"
            kinds["last_block"] += 1
    assert min(kinds.values()) > 100, kinds


@pytest.mark.parametrize("window", [ParamWindow(), ParamWindow(0.9, 1.1)])
def test_the_parameter_window_is_the_only_rejection(window: ParamWindow) -> None:
    reasons: collections.Counter[str] = collections.Counter()
    for seed in range(300):
        try:
            sample(RandomSuggest(seed), d_model=D, window=window)
            reasons["valid"] += 1
        except InvalidArchitecture as error:
            reasons[reason(error)] += 1
    assert set(reasons) == {"valid", "window"}


def test_a_window_around_the_evolved_transformer_holds_it_and_its_tolerance() -> None:
    et = evolved_transformer(D, 4, n_enc=1, n_dec=1)
    window = ParamWindow(0.3, 1.02, layers=2, seed="evolved_transformer")
    assert window.reference(D, decoder_only=False) == parameter_count(et)
    assert window.describe() == "1-cell Evolved Transformer"
    validate(et, window=window)  # the seed is inside its own window...
    with pytest.raises(InvalidArchitecture, match=r"outside \[0.3x, 0.99x\] of the 1-cell Evol"):
        validate(et, window=ParamWindow(0.3, 0.99, layers=2, seed="evolved_transformer"))
    with pytest.raises(ValueError, match="window seed 'vit' is not valid"):
        ParamWindow(seed="vit")  # type: ignore[arg-type]


def test_sampling_is_define_by_run_with_stable_names() -> None:
    params = seed_params(evolved_transformer(D, 4))
    assert params["enc.block3.left.layer"] == "attention"
    assert params["enc.block3.left.heads"] == 4
    assert params["enc.block3.right.skip"] is True
    assert "enc.block3.right.layer" not in params and "enc.block3.right.norm" not in params
    assert "enc.block4.right.input" not in params  # a dead branch reads nothing
    assert "enc.block4.combiner" not in params  # no combiner beside a dead branch
    assert "enc.block1.left.heads" not in params  # heads only for attention
    assert params["dec.block2.left.dim"] == 2.0 and params["dec.block2.combiner"] == "add"


@pytest.mark.parametrize("name", list(SEEDS))
def test_seeds_replay_through_sample_and_json(name: str) -> None:
    seed = SEEDS[name]
    validate(seed)
    fixed = FixedSuggest(seed_params(seed))
    assert sample(fixed, d_model=D, decoder_only=seed.decoder_only, cells=(1, 6)) == seed
    assert fixed.unused() == []
    assert from_json(to_json(seed)) == seed
    document = json.loads(to_json(seed))
    assert document["version"] == 1 and document["format"] == "evolved_transformer"


def test_seed_shapes() -> None:
    t, et = SEEDS["transformer"], SEEDS["evolved"]
    assert (t.encoder_cells, t.decoder_cells) == (3, 3)  # two layers per cell
    assert (et.encoder_cells, et.decoder_cells) == (3, 4)
    assert et.decoder.blocks[0].left.heads == 8  # twice the heads (capped at 16)
    assert evolved_transformer(D, 16).decoder.blocks[0].left.heads == 16
    assert summary(et).startswith("d=32 enc 3x[ln.glu>d@0 + id@0 | ln.conv_1x1>4d.relu@1 + ")
    for d_model in (128, 512):  # the ET's 3 + 4 cells are about the 6 + 6-layer size
        ratio = parameter_count(evolved_transformer(d_model)) / parameter_count(
            transformer(d_model)
        )
        assert 1.0 < ratio < 1.1
    with pytest.raises(ValueError, match="must be even"):
        transformer(D, 4, 3, 4)
    with pytest.raises(ValueError, match="n_heads 6"):
        evolved_transformer(D, 6)


def replace_block(arch: Architecture, side: str, i: int, block: Block) -> Architecture:
    cell = arch.encoder if side == "enc" else arch.decoder
    assert cell is not None
    blocks = list(cell.blocks)
    blocks[i] = block
    if side == "enc":
        return dataclasses.replace(arch, encoder=Cell(tuple(blocks)))
    return dataclasses.replace(arch, decoder=Cell(tuple(blocks)))


def test_each_rule_rejects_with_its_reason() -> None:
    et = SEEDS["evolved"]
    dead = Branch(0, "dead")
    with pytest.raises(InvalidArchitecture, match=REASONS["dead"]):
        validate(replace_block(et, "enc", 4, Block(dead, dead)))
    enc_attention = Branch(3, "encoder_attention", "layer_norm", 1.0, heads=4)
    with pytest.raises(InvalidArchitecture, match=r"enc\.block3\.left: attention to the encoder"):
        validate(replace_block(et, "enc", 3, Block(enc_attention, Branch(3, "identity"))))
    lm = SEEDS["evolved_lm"]
    with pytest.raises(InvalidArchitecture, match=r"dec\.block1\.left: attention to the encoder"):
        cross = dataclasses.replace(enc_attention, input=1)
        validate(replace_block(lm, "dec", 1, Block(cross, Branch(1, "identity"))))
    no_cross = replace_block(et, "dec", 1, Block(Branch(1, "identity"), dead))
    no_cross = replace_block(no_cross, "dec", 5, Block(Branch(5, "identity"), dead))
    with pytest.raises(InvalidArchitecture, match=REASONS["attends"]):
        validate(no_cross)
    gated = dataclasses.replace(et.encoder.blocks[0], combiner="multiply")  # type: ignore[union-attr]
    with pytest.raises(InvalidArchitecture, match=REASONS["residual"]):
        validate(replace_block(et, "enc", 0, gated))
    small = transformer(D, 4, 2, 2)
    with pytest.raises(InvalidArchitecture, match=REASONS["window"]):
        validate(small)
    validate(small, window=None)
    validate(small, window=ParamWindow(low=0.1))


def test_malformed_data_is_rejected_on_construction() -> None:
    with pytest.raises(InvalidArchitecture, match="identity has no norm"):
        Branch(0, "identity", norm="layer_norm")
    with pytest.raises(InvalidArchitecture, match="dim must be one of"):
        Branch(0, "glu", dim=3.0)
    with pytest.raises(InvalidArchitecture, match="heads is set for attention layers only"):
        Branch(0, "glu", dim=1.0, heads=4)
    with pytest.raises(InvalidArchitecture, match="unknown layer"):
        Branch(0, "conv_7x1", dim=1.0)
    with pytest.raises(InvalidArchitecture, match="does not exist yet"):
        Cell((Block(Branch(1, "identity"), Branch(0, "dead")),))
    et = SEEDS["evolved"]
    with pytest.raises(InvalidArchitecture, match="multiple of 32"):
        dataclasses.replace(et, d_model=48)
    with pytest.raises(InvalidArchitecture, match="has 5 blocks, not 6"):
        dataclasses.replace(et, encoder=Cell(et.encoder.blocks[:5]))  # type: ignore[union-attr]


def test_json_errors_are_clear() -> None:
    document = json.loads(to_json(SEEDS["evolved"]))
    with pytest.raises(ValueError, match="version 2 is not supported"):
        from_json(json.dumps(document | {"version": 2}))
    with pytest.raises(ValueError, match="not a JSON architecture"):
        from_json("{")
    with pytest.raises(ValueError, match="malformed"):
        from_json(json.dumps(document | {"decoder": {"cells": 1}}))
    document["decoder"]["blocks"][0]["left"]["layer"] = "conv_7x1"
    with pytest.raises(InvalidArchitecture, match="unknown layer"):
        from_json(json.dumps(document))


def test_parameter_count_is_exact() -> None:
    random_archs = []
    for seed in range(60):
        with contextlib.suppress(InvalidArchitecture):
            random_archs.append(sample(RandomSuggest(seed), d_model=D, window=None))
    assert random_archs
    for arch in [*SEEDS.values(), *random_archs[:3]]:
        modules = build(compile(arch, 11, max_len=9, dropout=0.1))
        built = sum(p.numel() for m in modules for p in m.parameters())
        assert parameter_count(arch, 11, max_len=9) == built


def test_fixed_suggest_errors_name_the_parameter() -> None:
    fixed = FixedSuggest({"a": "x", "n": 7, "f": 1})
    with pytest.raises(KeyError, match="no fixed value for parameter 'b'"):
        fixed.suggest_categorical("b", ["x"])
    with pytest.raises(ValueError, match="fixed value 'x' of parameter 'a' is not among"):
        fixed.suggest_categorical("a", ["y", "z"])
    with pytest.raises(ValueError, match=r"outside \[0, 5\]"):
        fixed.suggest_int("n", 0, 5)
    assert fixed.suggest_int("n", 0, 9) == 7
    assert choose(fixed, "f", (0.5, 1.0)) == 1.0  # 1 from JSON matches the choice 1.0
    assert fixed.unused() == []
    with pytest.raises(ValueError, match="is not an integer"):
        FixedSuggest({"n": "7"}).suggest_int("n", 0, 9)
    with pytest.raises(ValueError, match="not among its choices"):
        FixedSuggest({"flag": 1}).suggest_categorical("flag", [True, False])


def test_random_suggest_is_seeded_and_consistent() -> None:
    a, b = RandomSuggest(5), RandomSuggest(5)
    draws = [a.suggest_int(f"p{i}", 0, 100) for i in range(10)]
    assert draws == [b.suggest_int(f"p{i}", 0, 100) for i in range(10)]
    assert a.suggest_int("p0", 0, 100) == draws[0]  # the same name gives the same answer
    assert isinstance(a, Suggest) and isinstance(FixedSuggest({}), Suggest)
    assert list(a.params) == [f"p{i}" for i in range(10)]
