"""Bi-Partition across processes: the cut, the replicas, and what crosses it per step.

`handoff[s] = k` hands the backward of stage s's last k layers to stage s + 1 (they must
be separable, `pipeline.local.separable`). Stage s owns those layers (their weights,
optimizer state, checkpoints and migrations are its, as for any layer); s + 1 holds
replicas for their backward. One step of a flushed schedule (GPipe, 1F1B, ZB-H1), numbered:

    0. Start of the step: s sends the handed layers' weights; s + 1 loads them into its
       replicas before anything else (it would wait for s's first forward anyway). So
       the replicas hold exactly the weights the forward uses, whatever changed them
       since the last step: an update, a migration, inherited weights, the user.
    1. Forward, per micro-batch: s runs the handed layers without a graph and sends
       (x_1, ..., x_k, y): their inputs, then the output, with a gradient flag on x_1
       only. s + 1 keeps x_1..x_k until its backward and trains on y as usual.
    2. Backward, per micro-batch: s + 1 back-propagates its own layers to the gradient of
       y, runs the handed layers' backward from it (accumulating their weight gradients)
       and sends the gradient of x_1, which s back-propagates from its layer before them.
       Under ZB-H1 that is s + 1's BI; the handed weight gradients wait for its W when
       the layer's separable backward defers them (nn.Linear does).
    3. End of the lists, before the agreement (`pipeline.distributed.executor`, step 3):
       s + 1 sends the handed layers' summed gradients; s receives them as their `.grad`.
       Both always exchange, failed or not, so nothing stays in flight; a failed step is
       then dropped everywhere by the agreement.

    2 stages, 1F1B, layers a b | c with b handed (F = 1, B = 2 per layer):

        stage 0:  W_b─> Fa Fb(no graph) ──(x_b, y_b)──>      <──g_x_b── Ba   | <─dW_b─ step
        stage 1:  <─W_b                    Fc  Bc  Bb(replica) ──────────>    | ─dW_b─> step

    Whole layers: stage 0 costs 2F + 2B = 6, stage 1 F + B = 3; handed: 2F + B = 4 and
    F + 2B = 5, a bottleneck of 5 instead of 6.

A migration or a new plan drops every replica first (the owners hold the truth, step 3
put the gradients there), moves whole layers as for any schedule, then `configure`
builds the new cut's replicas; the next step's step 0 gives them their weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pipeline.distributed.links import PeerLink
from pipeline.local.separable import HandedLayers
from pipeline.local.spec import LayerSpec
from pipeline.local.stage import Stage
from pipeline.pure.checks import is_int
from pipeline.pure.partition import bounds

__all__ = ["check_handoff", "configure", "exchange_gradients", "share_weights"]

Links = tuple[PeerLink | None, PeerLink | None]


def check_handoff(handoff: Sequence[int] | None, sizes: Sequence[int]) -> tuple[int, ...]:
    """Per boundary, the layers whose backward moves downstream (none: zeros), checked."""
    n = len(sizes) - 1
    if handoff is None:
        return (0,) * n
    values = tuple(handoff)
    if len(values) != n or any(not is_int(k) for k in values):
        raise ValueError(
            f"handoff must give an int for each of the {n} stage boundaries, got {handoff!r}"
        )
    for s, k in enumerate(values):
        if not 0 <= k < sizes[s]:
            raise ValueError(
                f"handoff[{s}]={k} is not valid: stage {s} holds {sizes[s]} "
                f"layers, so it may hand 0..{sizes[s] - 1} of them"
            )
    return values


def configure(
    stage: Stage,
    specs: Sequence[LayerSpec],
    sizes: Sequence[int],
    handoff: Sequence[int],
    seed: int,
) -> None:
    """Set this stage's cut on both sides and build the replicas (each step's
    `share_weights` gives them the owners' weights). Every rank calls it with the same
    arguments; a layer that is not separable raises ValueError where its replica would
    be (`comm.together`)."""
    rank, (start, _) = stage.index, bounds(sizes)[stage.index]
    k_in = handoff[rank - 1] if rank > 0 else 0
    handed = HandedLayers(specs[start - k_in : start], seed, stage.device) if k_in else None
    stage.set_handoff(handoff[rank] if rank < len(handoff) else 0, handed)


def exchange_gradients(stage: Stage, links: Links) -> None:
    """Step 3 of the protocol: the handed layers' gradients go to their owner."""
    prev, nxt = links
    if stage.handed_in is not None:
        assert prev is not None
        prev.send_state(stage.handed_in.gradients())
        stage.handed_in.zero_grads()
    if stage.handoff_out:
        assert nxt is not None
        params = _handed_params(stage)
        buffers = [torch.empty_like(p) for p in params]
        nxt.recv_state(buffers)
        for p, g in zip(params, buffers, strict=True):
            if p.requires_grad:
                p.grad = g if p.grad is None else p.grad + g
    if prev is not None:
        prev.wait_sends()


def share_weights(stage: Stage, links: Links) -> None:
    """Step 0: the owner's weights of its handed layers go to the replicas (the owner's
    sends complete with the step's other sends)."""
    prev, nxt = links
    if stage.handoff_out:
        assert nxt is not None
        nxt.send_state(_handed_params(stage))
    if stage.handed_in is not None:
        assert prev is not None
        params = stage.handed_in.parameters()
        buffers = [torch.empty_like(p) for p in params]
        prev.recv_state(buffers)
        with torch.no_grad():
            for p, w in zip(params, buffers, strict=True):
                p.copy_(w)


def _handed_params(stage: Stage) -> list[torch.Tensor]:
    return [
        p
        for layer in stage.layers[len(stage.layers) - stage.handoff_out :]
        for p in layer.module.parameters()
    ]
