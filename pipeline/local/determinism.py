"""Seeds that make a model independent of how it is split into stages.

Every correctness test of the runtime rests on one rule: a layer's initial weights depend
only on `(seed, layer key)`, and its randomness during training (dropout) only on
`(seed, step, micro-batch, layer key)`. Whichever stage builds or runs a layer, and however
often it has migrated, it draws the same random numbers, so pipelined training equals
single-process training and a repartition changes no loss.

Seeds are derived with BLAKE2b, which is stable across processes and Python versions
(unlike `hash()`, which is salted per process).
"""

from __future__ import annotations

import hashlib

import torch

__all__ = ["dropout_seed", "layer_seed", "seed_rng"]


def _derive(*parts: object) -> int:
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def layer_seed(seed: int, key: str) -> int:
    """Seed for building the layer `key` (its initial weights)."""
    return _derive("init", seed, key)


def dropout_seed(seed: int, step: int, microbatch: int, key: str) -> int:
    """Seed for running the layer `key` on one micro-batch of one step."""
    return _derive("run", seed, step, microbatch, key)


def seed_rng(value: int, device: torch.device) -> None:
    """Seed the generator that random ops on `device` draw from (CPU, or that CUDA device)."""
    torch.random.default_generator.manual_seed(value)
    if device.type == "cuda":
        torch.cuda.default_generators[device.index or 0].manual_seed(value)
