"""Compiled architectures: keys, carry, causality, padding, and the Transformer seed against
`torch.nn.Transformer`.

The Transformer seed compiles to exactly the parameters of `nn.Transformer(norm_first=True)`
of the same size plus the compiled model's embeddings and output projection:

    compiled = nn.Transformer                    (layers + encoder/decoder final LayerNorms)
             + 2 * (vocab + max_len) * d_model   (source and target token/position tables)
             + d_model * vocab + vocab           (the head's Linear)

because embed_tgt's memory LayerNorm is the encoder's final norm and the head's LayerNorm
the decoder's; with the same weights the two compute the same logits.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline.local.reference import ReferenceTrainer
from search_spaces.architecture import Architecture
from search_spaces.compile import compile, parameter_count
from search_spaces.evolved_transformer import PRIMITIVES, evolved_transformer, transformer
from search_spaces.primer import with_primitives
from tests.search_spaces.common import (
    MAX_LEN,
    PAD,
    VOCAB,
    D,
    build,
    run,
    tokens,
    valid_architectures,
)

ET, TRANSFORMER = evolved_transformer(D, 4), transformer(D, 4)
ET_LM, TRANSFORMER_LM = evolved_transformer(D, 4, 0, 2), transformer(D, 4, 0, 4)


def specs(arch: Architecture, dropout: float = 0.0) -> list[pipeline.LayerSpec]:
    return compile(arch, VOCAB, max_len=MAX_LEN, dropout=dropout, pad_id=PAD)


def batch(arch: Architecture, src_len: int = 7, tgt_len: int = 8, seed: int = 0) -> Any:
    tgt = tokens(2, tgt_len, seed + 1)
    return tgt if arch.decoder_only else (tokens(2, src_len, seed), tgt)


def test_keys_and_picklable_factories() -> None:
    keys = [s.key for s in specs(ET)]
    assert keys == [
        "embed_src",
        "enc0",
        "enc1",
        "enc2",
        "embed_tgt",
        "dec0",
        "dec1",
        "dec2",
        "dec3",
        "head",
    ]
    assert [s.key for s in specs(ET_LM)] == ["embed", "dec0", "dec1", "head"]
    for spec in specs(ET):
        assert isinstance(spec.factory, functools.partial)
        clone = pickle.loads(pickle.dumps(spec.factory))
        assert isinstance(clone(), nn.Module)


def test_carry_shapes() -> None:
    modules = build(specs(ET))
    src, tgt = batch(ET)
    carry = modules[0]((src, tgt))
    assert [t.shape for t in carry] == [(2, 7, D), (2, 7), (2, 8)]
    carry = modules[1](carry)
    assert carry[0].shape == (2, 7, D) and carry[1] is src and carry[2] is tgt
    carry = modules[4](modules[3](modules[2](carry)))
    assert [t.shape for t in carry] == [(2, 7, D), (2, 7), (2, 8, D), (2, 8)]
    assert run(modules[5:], carry).shape == (2, VOCAB, 8)
    lm = build(specs(ET_LM))
    h, ids = lm[0](tokens(2, 8, 0))
    assert h.shape == (2, 8, D) and ids.shape == (2, 8)


@pytest.mark.parametrize("arch", [ET, ET_LM], ids=["enc_dec", "decoder_only"])
def test_evolved_transformer_trains(arch: Architecture) -> None:
    modules: list[Any] = build(specs(arch, dropout=0.1))
    x = batch(arch)
    target = tokens(2, 8, 7)
    loss = F.cross_entropy(run(modules, x), target, ignore_index=PAD)
    loss.backward()
    assert torch.isfinite(loss)
    for module in modules:
        for name, p in module.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
    positions = modules[0].embed.positions.weight.grad
    assert positions[8:].abs().sum() == 0  # positions beyond the sequence are unused


def causal_check(arch: Architecture) -> None:
    """Changing target tokens after position t changes no logit at positions <= t."""
    modules = build(specs(arch))
    x = batch(arch)
    logits = run(modules, x)
    tgt = x if arch.decoder_only else x[1]
    for t in (0, 3, 6):
        future = tgt.clone()
        future[:, t + 1 :] = tokens(2, tgt.shape[1] - t - 1, 100 + t)
        changed = future if arch.decoder_only else (x[0], future)
        torch.testing.assert_close(run(modules, changed)[..., : t + 1], logits[..., : t + 1])


@pytest.mark.parametrize(
    "arch",
    [ET, TRANSFORMER, ET_LM, TRANSFORMER_LM],
    ids=["et", "transformer", "et_lm", "transformer_lm"],
)
def test_seeds_are_causal(arch: Architecture) -> None:
    causal_check(arch)


def test_random_architectures_are_causal() -> None:
    for arch in [*valid_architectures(5), *valid_architectures(3, decoder_only=True)]:
        causal_check(arch)


def padding_check(arch: Architecture) -> None:
    """Padding the source (or the target) more does not change any real output."""
    modules = build(specs(arch))
    x = batch(arch, src_len=5, tgt_len=6)
    logits = run(modules, x)

    def pad(ids: torch.Tensor, n: int) -> torch.Tensor:
        return F.pad(ids, (0, n), value=PAD)

    if arch.decoder_only:
        torch.testing.assert_close(run(modules, pad(x, 3))[..., :6], logits)
        return
    src, tgt = x
    torch.testing.assert_close(run(modules, (pad(src, 4), tgt)), logits)
    src_short = src.clone()
    src_short[1, 3:] = PAD  # the second source is shorter: its padding must not matter
    short = run(modules, (src_short, tgt))
    torch.testing.assert_close(run(modules, (pad(src_short[:, :3], 0), tgt))[1], short[1])
    torch.testing.assert_close(run(modules, (pad(src, 2), pad(tgt, 3)))[..., :6], logits)


def test_padding_does_not_leak() -> None:
    for arch in [
        ET,
        TRANSFORMER,
        ET_LM,
        *valid_architectures(4, start=500),
        *valid_architectures(2, decoder_only=True, start=500),
    ]:
        padding_check(arch)


def torch_transformer(n_layers: int, heads: int) -> nn.Transformer:
    return nn.Transformer(
        D, heads, n_layers, n_layers, 4 * D, dropout=0.0, batch_first=True, norm_first=True
    )


def numel(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@pytest.mark.parametrize("d_model,layers", [(D, 2), (D, 6), (128, 6), (512, 6)])
def test_transformer_seed_counts_like_torch(d_model: int, layers: int) -> None:
    reference = nn.Transformer(d_model, 8, layers, layers, 4 * d_model, norm_first=True)
    arch = transformer(d_model, 8, layers, layers)
    embeddings_and_head = 2 * (VOCAB + MAX_LEN) * d_model + d_model * VOCAB + VOCAB
    expected = numel(reference) + embeddings_and_head
    assert parameter_count(arch, VOCAB, max_len=MAX_LEN) == expected
    if d_model == D:
        assert sum(numel(m) for m in build(specs(arch))) == expected
        decoder_only = nn.TransformerEncoder(reference.encoder.layers[0], layers, nn.LayerNorm(D))
        lm = transformer(D, 8, 0, layers)
        assert parameter_count(lm, VOCAB, max_len=MAX_LEN) == numel(decoder_only) + (
            (VOCAB + MAX_LEN) * D + D * VOCAB + VOCAB
        )


def copy_attention(mine: Any, theirs: nn.MultiheadAttention) -> None:
    q, k, v = theirs.in_proj_weight.chunk(3)
    qb, kb, vb = theirs.in_proj_bias.chunk(3)
    for linear, w, b in ((mine.q, q, qb), (mine.k, k, kb), (mine.v, v, vb)):
        linear.weight.copy_(w)
        linear.bias.copy_(b)
    mine.out.load_state_dict(theirs.out_proj.state_dict())


@pytest.mark.filterwarnings("ignore:enable_nested_tensor")
@torch.no_grad()
def test_transformer_seed_computes_like_torch() -> None:
    heads, n = 4, 2
    reference = torch_transformer(n, heads)
    modules: list[Any] = build(specs(transformer(D, heads, n, n)))
    embed_src, enc0, embed_tgt, dec0, head = modules
    enc, dec = enc0.cell.blocks, dec0.cell.blocks
    for k, layer in enumerate(reference.encoder.layers):  # 3 blocks per layer
        a, ff_in, ff_out = enc[3 * k], enc[3 * k + 1], enc[3 * k + 2]
        a.left.norm.load_state_dict(layer.norm1.state_dict())
        copy_attention(a.left.layer, layer.self_attn)
        ff_in.left.norm.load_state_dict(layer.norm2.state_dict())
        ff_in.left.layer.linear.load_state_dict(layer.linear1.state_dict())
        ff_out.left.layer.linear.load_state_dict(layer.linear2.state_dict())
    for k, layer in enumerate(reference.decoder.layers):  # 4 blocks per layer
        a, cross, ff_in, ff_out = (dec[4 * k + j] for j in range(4))
        a.left.norm.load_state_dict(layer.norm1.state_dict())
        copy_attention(a.left.layer, layer.self_attn)
        cross.left.norm.load_state_dict(layer.norm2.state_dict())
        copy_attention(cross.left.layer, layer.multihead_attn)
        ff_in.left.norm.load_state_dict(layer.norm3.state_dict())
        ff_in.left.layer.linear.load_state_dict(layer.linear1.state_dict())
        ff_out.left.layer.linear.load_state_dict(layer.linear2.state_dict())
    embed_tgt.memory_norm.load_state_dict(reference.encoder.norm.state_dict())
    head.norm.load_state_dict(reference.decoder.norm.state_dict())

    src, tgt = batch(TRANSFORMER, src_len=7, tgt_len=8)
    src[1, 4:] = PAD
    logits = run(modules, (src, tgt))
    causal = nn.Transformer.generate_square_subsequent_mask(8)
    src_pad = src == PAD
    out = reference(
        embed_src((src, tgt))[0],
        embed_tgt.embed(tgt),
        tgt_mask=causal,
        src_key_padding_mask=src_pad,
        memory_key_padding_mask=src_pad,
        tgt_is_causal=True,
    )
    torch.testing.assert_close(logits, head.proj(out).transpose(1, 2), atol=1e-5, rtol=1e-5)


def test_compile_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        compile(ET, 0, max_len=8, dropout=0.0)
    with pytest.raises(ValueError, match="pad_id 13 is not a token id"):
        compile(ET, VOCAB, max_len=8, dropout=0.0, pad_id=VOCAB)
    with pytest.raises(ValueError, match="dropout"):
        compile(ET, VOCAB, max_len=8, dropout=1.0)
    with pytest.raises(TypeError, match="expected an Architecture"):
        compile("et", VOCAB, max_len=8, dropout=0.0)  # type: ignore[arg-type]
    modules = build(specs(ET_LM))
    with pytest.raises(ValueError, match="sequence length 17 exceeds max_len 16"):
        run(modules, tokens(2, 17, 0))


def test_no_padding_mode_masks_nothing() -> None:
    modules = build(compile(ET, VOCAB, max_len=MAX_LEN, dropout=0.0, pad_id=None))
    src, tgt = batch(ET)
    changed = src.clone()
    changed[:, -1] = PAD  # an ordinary token now: the output depends on it
    assert not torch.allclose(run(modules, (changed, tgt)), run(modules, (src, tgt)))


def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, target, ignore_index=PAD)


def train_batches() -> list[tuple[Any, torch.Tensor]]:
    return [((tokens(4, 6, s), tokens(4, 7, s + 1)), tokens(4, 7, s + 2)) for s in range(3)]


def test_reference_trainer_learns() -> None:
    trainer = ReferenceTrainer(
        specs(ET, dropout=0.1),
        n_microbatches=2,
        loss_fn=loss,
        optimizer=functools.partial(torch.optim.Adam, lr=3e-3),
    )
    x, y = train_batches()[0]
    losses = [trainer.train_step(x, y) for _ in range(8)]
    assert losses[-1] < losses[0]


def pipelined(ctx: pipeline.StageContext, arch: Architecture) -> dict[str, Any]:
    pipe = pipeline.ElasticPipeline(
        specs(arch, dropout=0.1),
        loss_fn=loss,
        n_microbatches=2,
        optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        seed=3,
        planning=pipeline.PlanOptions(partition=[5, 5]),
    )
    losses = [pipe.train_step(x, y) for x, y in train_batches()]
    state = pipe.full_state_dict()
    pipe.close()
    return {"losses": losses, "state": state}


@pytest.mark.multiprocess
@pytest.mark.parametrize("arch", [ET, with_primitives(ET, PRIMITIVES)], ids=["et", "et_primer"])
def test_pipeline_trains_like_one_process(arch: Architecture) -> None:
    """Two stages, the carry's integer ids and pass-through memory included, train exactly
    like `ReferenceTrainer` (same reduction order: one thread, as the stages); also with
    Primer's squared ReLU and multi-DConv-head attention."""
    run = functools.partial(pipelined, arch=arch)
    out = pipeline.launch(run, 2, threads_per_stage=1, timeout_s=60)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = ReferenceTrainer(
            specs(arch, dropout=0.1),
            n_microbatches=2,
            loss_fn=loss,
            seed=3,
            optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
        )
        losses = [trainer.train_step(x, y) for x, y in train_batches()]
    finally:
        torch.set_num_threads(threads)
    assert out["losses"] == pytest.approx(losses, abs=1e-5)
    for key, state in trainer.full_state_dict().items():
        for name, value in state.items():
            torch.testing.assert_close(out["state"][key][name], value, atol=1e-5, rtol=0)
