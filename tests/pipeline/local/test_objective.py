"""The loss sees its target where the output is: a user's targets stay on the host."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from pipeline.local.objective import on_device, scalar_loss


class Pair(NamedTuple):
    labels: torch.Tensor
    mask: torch.Tensor


def test_every_tensor_in_a_target_moves_and_its_containers_keep_their_types() -> None:
    meta = torch.device("meta")
    target = {"pair": Pair(torch.ones(2), torch.zeros(2)), "list": [torch.ones(1), 3], "n": "x"}
    moved = on_device(target, meta)
    assert isinstance(moved["pair"], Pair) and moved["pair"].labels.device == meta
    assert moved["pair"].mask.device == meta and moved["list"][0].device == meta
    assert moved["list"][1] == 3 and moved["n"] == "x"


def test_the_loss_takes_the_target_to_the_outputs_device() -> None:
    seen: list[torch.device] = []

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen.append(target.device)
        return output.sum()

    scalar_loss(loss_fn, torch.ones(2, device="meta"), torch.ones(2))
    assert seen == [torch.device("meta")]


def test_a_loss_that_is_not_a_scalar_is_refused_naming_its_shape() -> None:
    with pytest.raises(ValueError, match=r"scalar tensor \(mean-reduced\), got \(2,\)"):
        scalar_loss(lambda out, _: out, torch.ones(2), None)
