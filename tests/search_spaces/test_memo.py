"""`search_spaces.memo`: an encoder layer decoding the same sources again hands back what it
computed, and only then: not in training, not with gradients, not after its weights
changed, not for another input; greedy decoding gives what it gave without it."""

from __future__ import annotations

import torch
from torch import nn

from search_spaces.compile import EncoderCell, compile
from search_spaces.evolved_transformer import evolved_transformer
from search_spaces.memo import SLOTS, Memo
from tests.search_spaces.common import MAX_LEN, PAD, VOCAB, D, build, run, tokens


class Counted:
    """A layer's computation, counted."""

    def __init__(self, layer: nn.Module, x: torch.Tensor) -> None:
        self.layer, self.x, self.calls = layer, x, 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return self.layer(self.x)


def test_an_input_seen_twice_is_kept_and_handed_back_while_the_weights_stay() -> None:
    layer, memo = nn.Linear(4, 4).eval(), Memo()
    x = torch.randn(3, 4)
    compute = Counted(layer, x)
    with torch.no_grad():
        first = memo.output(layer, (x,), compute)  # seen once: computed, not kept
        second = memo.output(layer, (x,), compute)  # seen again: computed and kept
        third = memo.output(layer, (x.clone(),), compute)  # an equal input: handed back
        assert compute.calls == 2 and torch.equal(third, second) and torch.equal(first, third)
        third.add_(1.0)  # whoever took it changed it: what is kept is not
        assert torch.equal(memo.output(layer, (x,), compute), second)
        other = x + 1
        memo.output(layer, (other,), Counted(layer, other))  # another input: computed
        layer.weight.add_(1.0)  # an optimizer step changes the weights in place
        fourth = memo.output(layer, (x,), compute)
    assert compute.calls == 3 and not torch.equal(fourth, third)


def test_nothing_is_kept_in_training_or_with_gradients_and_at_most_slots_inputs() -> None:
    layer, memo = nn.Linear(4, 4), Memo()
    x = torch.randn(3, 4)
    compute = Counted(layer, x)
    for _ in range(3):
        memo.output(layer, (x,), compute)  # training mode, gradients on
    layer.eval()
    for _ in range(3):
        memo.output(layer, (x,), compute)  # gradients on
    assert compute.calls == 6
    inputs = [torch.full((2, 4), float(i)) for i in range(SLOTS + 1)]
    with torch.no_grad():
        for _ in range(2):  # each seen twice: kept, the oldest dropped past SLOTS
            for i in inputs:
                memo.output(layer, (i,), Counted(layer, i))
        again = [Counted(layer, i) for i in inputs]
        for i, compute in reversed(list(zip(inputs, again, strict=True))):  # newest first
            memo.output(layer, (i,), compute)
    assert [c.calls for c in again] == [1] + [0] * SLOTS  # the first input was dropped


def test_greedy_decoding_gives_what_it_gave_without_the_memo() -> None:
    """The encoder's cells hand back their outputs for the same sources, token after token,
    and the logits are those of the same model recomputing them (in training mode, without
    dropout: the same numbers, nothing kept)."""
    arch = evolved_transformer(D, 4)
    specs = compile(arch, VOCAB, max_len=MAX_LEN, pad_id=PAD, dropout=0.0)
    modules = [m.eval() for m in build(specs)]
    encoders = [m for m in modules if isinstance(m, EncoderCell)]
    src, tgt = tokens(2, 7, 0), tokens(2, 1, 1)
    with torch.no_grad():
        kept = [run(modules, (src, tgt))]
        for _ in range(4):  # the source again each time, a longer target
            tgt = torch.cat([tgt, kept[-1][:, :, -1].argmax(1, keepdim=True)], dim=1)
            kept.append(run(modules, (src, tgt)))
        assert encoders and all(e.memo.kept == 1 for e in encoders)
        for m in modules:
            m.train()
        recomputed = [run(modules, (src, tgt[:, :n])) for n in range(1, 6)]
    for a, b in zip(kept, recomputed, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert all(e.memo.kept == 0 for e in encoders)  # dropped in training
