"""Primer's primitives: squared ReLU and multi-DConv-head attention, as layers, as choices of
the space, and applied to the seeds (`search_spaces.primer`). The shape, padding and
causality contracts of every layer name run in test_layers.py, pipelining exactly against one
process in test_compile.py; here what is Primer's own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pipeline
from search_spaces.architecture import (
    Block,
    Cell,
    from_json,
    functional_key,
    to_json,
)
from search_spaces.attention import DConvEncoderAttention
from search_spaces.compile import compile, parameter_count
from search_spaces.evolved_transformer import (
    PRIMITIVES,
    evolved_transformer,
    sample,
    seed_params,
    transformer,
    validate,
)
from search_spaces.layers import SquaredReLU, activation, make_layer
from search_spaces.primer import with_primitives
from search_spaces.sequence import Context
from search_spaces.suggest import FixedSuggest, RandomSuggest
from tests.search_spaces.common import MAX_LEN, PAD, VOCAB, D, build, run, tokens

BOTH = PRIMITIVES
ET = evolved_transformer(D, 4)
ET_PRIMER = with_primitives(ET, BOTH)


def test_squared_relu_is_relu_squared() -> None:
    x = torch.linspace(-3, 3, 13)
    torch.testing.assert_close(SquaredReLU()(x), torch.relu(x) ** 2)
    assert isinstance(activation("squared_relu"), SquaredReLU)


@pytest.mark.parametrize(
    ("name", "plain"), [("mdha", "attention"), ("encoder_mdha", "encoder_attention")]
)
def test_mdha_adds_three_width_3_kernels_per_channel(name: str, plain: str) -> None:
    def count(layer: str) -> int:
        module = make_layer(layer, 32, 64, causal=True, heads=4, d_memory=48)
        return sum(p.numel() for p in module.parameters())

    assert count(name) - count(plain) == 3 * 3 * 32  # Q, K and V convolved in d_in


def mdha_and_plain(name: str, causal: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    plain_name = {"mdha": "attention", "encoder_mdha": "encoder_attention"}[name]
    mdha = make_layer(name, 32, 32, causal=causal, heads=4, d_memory=32)
    plain = make_layer(plain_name, 32, 32, causal=causal, heads=4, d_memory=32)
    plain.load_state_dict(mdha.state_dict(), strict=False)  # the shared projections
    return mdha, plain


@pytest.mark.parametrize("name", ["mdha", "encoder_mdha"])
def test_mdha_starts_as_plain_attention_and_then_differs(name: str) -> None:
    mdha, plain = mdha_and_plain(name, causal=True)
    g = torch.Generator().manual_seed(0)
    x, memory = torch.randn(2, 6, 32, generator=g), torch.randn(2, 5, 32, generator=g)
    ctx = Context(memory=memory)
    torch.testing.assert_close(mdha(x, ctx), plain(x, ctx))
    with torch.no_grad():
        for p in mdha.parameters():
            if p.dim() == 3:  # a depthwise kernel: (channels, 1, width)
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    assert not torch.allclose(mdha(x, ctx), plain(x, ctx))


def test_cross_mdha_reads_source_positions_both_ways() -> None:
    """Q's convolution is causal (decoder positions); K and V's mix the source both ways,
    so a later source position changes what an earlier key holds."""
    module = make_layer("encoder_mdha", 32, 32, causal=True, heads=4, d_memory=32)
    assert isinstance(module, DConvEncoderAttention)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 3:
                p.fill_(0.5)
    g = torch.Generator().manual_seed(1)
    x, memory = torch.randn(1, 4, 32, generator=g), torch.randn(1, 5, 32, generator=g)
    k = module.project(x, memory, Context(memory=memory))[1]
    changed = memory.clone()
    changed[:, 3] += 1.0
    k_changed = module.project(x, changed, Context(memory=changed))[1]
    assert not torch.allclose(k_changed[:, 2], k[:, 2])  # position 2 sees position 3


def test_the_space_offers_the_primitives_only_when_asked() -> None:
    def found(primitives: tuple[str, ...]) -> set[str]:
        seen: set[str] = set()
        for seed in range(40):
            arch = sample(RandomSuggest(seed), d_model=D, window=None, primitives=primitives)  # type: ignore[arg-type]
            for cell in (arch.encoder, arch.decoder):
                assert cell is not None
                for block in cell.blocks:
                    seen |= {b.layer for b in block.branches} | {
                        b.activation for b in block.branches
                    }
        return seen

    assert not found(()) & {"squared_relu", "mdha", "encoder_mdha"}
    assert {"squared_relu", "mdha", "encoder_mdha"} <= found(BOTH)
    with pytest.raises(ValueError, match="primitives.*'gelu'.*must be one of"):
        sample(RandomSuggest(0), window=None, primitives=("gelu",))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "arch",
    [ET, ET_PRIMER, with_primitives(transformer(D, 4), BOTH)],
    ids=["et", "et_primer", "transformer_primer"],
)
def test_seed_params_replay_in_the_space_with_primitives(arch: object) -> None:
    assert isinstance(arch, type(ET))
    params = seed_params(arch, primitives=BOTH)
    replay = FixedSuggest(params)
    assert sample(replay, d_model=D, window=None, primitives=BOTH) == arch
    assert replay.unused() == []
    assert from_json(to_json(arch)) == arch
    validate(arch, window=None)


def test_a_primer_mutant_is_rejected_by_the_space_without_primitives() -> None:
    params = seed_params(ET_PRIMER, primitives=BOTH)
    with pytest.raises((ValueError, KeyError)):
        sample(FixedSuggest(params), d_model=D, window=None)


def test_with_primitives_changes_only_activations_and_attention() -> None:
    assert with_primitives(ET, ()) == ET
    sq = with_primitives(ET, ("squared_relu",))
    assert parameter_count(sq) == parameter_count(ET)
    acts = {
        b.activation
        for c in (sq.encoder, sq.decoder)
        if c
        for k in c.blocks
        for b in k.branches
        if not b.dead
    }
    assert acts <= {"squared_relu", "none"} and "squared_relu" in acts
    mdha = with_primitives(ET, ("mdha",))
    attention_layers = 1 * 3 + 4 * 2 + 4 * 2  # enc 1 self x 3 cells; dec 2 self + 2 cross x 4
    assert parameter_count(mdha) - parameter_count(ET) == 9 * D * attention_layers


def test_functional_key_ignores_branch_order_only() -> None:
    cell = ET.decoder
    block = cell.blocks[2]  # two live branches, joined by add
    swapped = Cell(
        (*cell.blocks[:2], Block(block.right, block.left, block.combiner), *cell.blocks[3:])
    )
    mirror = type(ET)(ET.d_model, ET.encoder_cells, ET.encoder, ET.decoder_cells, swapped)
    assert mirror != ET and functional_key(mirror) == functional_key(ET)
    assert functional_key(ET_PRIMER) != functional_key(ET)


def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=PAD)


def specs() -> list[pipeline.LayerSpec]:
    return compile(ET_PRIMER, VOCAB, max_len=MAX_LEN, dropout=0.1)


def batches() -> list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    return [((tokens(4, 6, s), tokens(4, 7, s + 1)), tokens(4, 7, s + 2)) for s in range(3)]


def test_a_primer_model_is_causal_on_the_decoder_side() -> None:
    modules = [m.eval() for m in build(specs())]
    src, tgt = tokens(2, 6, 0), tokens(2, 7, 1)
    changed = tgt.clone()
    changed[:, 4:] = tokens(2, 3, 9)
    torch.testing.assert_close(
        run(modules, (src, changed))[..., :4], run(modules, (src, tgt))[..., :4]
    )


def test_an_optuna_study_samples_the_space_with_primitives() -> None:
    """Every name keeps one distribution across trials (Optuna refuses anything else), also
    the cross branch's layer when the cross block moves."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    crosses = set()
    for _ in range(40):
        trial = study.ask()
        arch = sample(trial, d_model=D, window=None, primitives=BOTH)
        crosses.add(trial.params["dec.cross_block"])
        study.tell(trial, float(parameter_count(arch)))
    assert len(crosses) > 1 and "dec.cross_layer" in study.trials[0].params
