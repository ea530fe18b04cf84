"""Profiling: shapes on the meta device, timed sandbox runs, the cost cache."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.local.models import transformer_stack
from pipeline.local.profiler import (
    CostCache,
    estimate,
    on_threads,
    optimizer_state_ratio,
    sandbox,
    sized,
    trace_shapes,
)
from pipeline.local.spec import LayerSpec
from pipeline.pure.shape import RuntimeOverheads
from search_spaces.compile import compile as compile_arch
from search_spaces.evolved_transformer import transformer

CPU = torch.device("cpu")
IDS = torch.randint(1, 50, (4, 16), generator=torch.Generator().manual_seed(0))  # no padding


def language_model(n_layers: int) -> list[LayerSpec]:
    """The seed Transformer, decoder-only: embed (ids in), n_layers // 2 cells, head."""
    arch = transformer(32, n_heads=4, n_enc=0, n_dec=n_layers)
    return compile_arch(arch, 50, max_len=16, dropout=0.1)


def test_shapes_and_bytes_of_a_linear_stack() -> None:
    specs = [
        LayerSpec("a", functools.partial(nn.Linear, 8, 32)),
        LayerSpec("b", functools.partial(nn.Linear, 32, 4)),
    ]
    shapes = trace_shapes(specs, torch.zeros(16, 8))
    assert [s.output_bytes for s in shapes] == [16 * 32 * 4, 16 * 4 * 4]
    assert [s.param_bytes for s in shapes] == [(8 * 32 + 32) * 4, (32 * 4 + 4) * 4]
    assert shapes[0].flops == 2 * 16 * 8 * 32
    # layer b keeps its input (16 x 32 floats) for the weight gradient, and nothing else
    assert shapes[1].saved_bytes == 16 * 32 * 4
    # the same trace without its FLOPs (what a timed profile needs): all else alike
    uncounted = trace_shapes(specs, torch.zeros(16, 8), count_flops=False)
    assert [dataclasses.replace(s, flops=None) for s in shapes] == uncounted
    with pytest.raises(ValueError, match=r"without their FLOPs.*\['a', 'b'\]"):
        estimate(uncounted, torch.device("cpu"), 2.0)


def test_identical_layers_share_a_signature() -> None:
    shapes = trace_shapes(transformer_stack(3, 32, 4), torch.zeros(2, 10, 32))
    assert len({s.signature for s in shapes}) == 1
    longer = trace_shapes(transformer_stack(1, 32, 4), torch.zeros(2, 12, 32))[0]
    wider = trace_shapes(transformer_stack(1, 64, 4), torch.zeros(2, 10, 64))[0]
    assert len({shapes[0].signature, longer.signature, wider.signature}) == 3


def test_meta_trace_agrees_with_the_real_sandbox_on_saved_bytes() -> None:
    specs = language_model(4)  # ids in, a tuple carry with integer ids, logits out
    shapes = trace_shapes(specs, IDS)
    # the meta device traces attention's math kernel; run the same kernel for real
    with sdpa_kernel(SDPBackend.MATH):
        measured = sandbox(specs, shapes, CPU, 2.0, CostCache())
    assert [c.activation_bytes for c in measured] == [s.saved_bytes for s in shapes]
    assert all(c.forward_s > 0 and c.backward_s > 0 for c in measured)
    # with the kernel torch picks (a fused one on CPU keeps less), the trace is an upper bound
    fused = sandbox(specs, shapes, CPU, 2.0, CostCache())
    assert all(c.activation_bytes <= s.saved_bytes for c, s in zip(fused, shapes, strict=True))


def test_sandbox_times_each_signature_once_and_reuses_the_cache() -> None:
    cache = CostCache()
    first = language_model(4)
    sandbox(first, trace_shapes(first, IDS), CPU, 2.0, cache)
    assert len(cache) == 3  # embedding, one cell signature, head
    second = language_model(8)  # a deeper candidate
    costs = sandbox(second, trace_shapes(second, IDS), CPU, 2.0, cache)
    assert len(cache) == 3  # nothing new to time
    assert len({c.forward_s for c in costs[1:-1]}) == 1


def test_sized_counts_the_bytes_a_timed_run_saves_and_times_nothing() -> None:
    specs = language_model(4)
    shapes = trace_shapes(specs, IDS)
    cache = CostCache()
    counted = sized(specs, shapes, CPU, 2.0, cache)
    assert len(cache) == 0 and all(c.forward_s == c.backward_s == 0 for c in counted)
    timed = sandbox(specs, shapes, CPU, 2.0, cache)  # the kernel torch picks, as training
    assert [c.activation_bytes for c in counted] == [c.activation_bytes for c in timed]
    assert [dataclasses.replace(c, forward_s=0.0, backward_s=0.0) for c in timed] == counted
    assert sized(specs, shapes, CPU, 2.0, cache) == timed  # the cache's entries, seconds too


def test_estimate_from_flops() -> None:
    shapes = trace_shapes(transformer_stack(2, 32, 4), torch.zeros(2, 10, 32))
    costs = estimate(shapes, CPU, opt_ratio=2.0)
    assert all(c.forward_s > 0 and c.backward_s == pytest.approx(2 * c.forward_s) for c in costs)
    assert costs[0].optimizer_bytes == 2 * costs[0].param_bytes


@pytest.mark.parametrize(
    "factory,ratio",
    [
        (functools.partial(torch.optim.AdamW, lr=1e-3), 2.0),
        (functools.partial(torch.optim.SGD, lr=1e-3), 0.0),
        (functools.partial(torch.optim.SGD, lr=1e-3, momentum=0.9), 1.0),
    ],
)
def test_optimizer_state_ratio(factory: functools.partial, ratio: float) -> None:
    assert optimizer_state_ratio(factory) == ratio


def test_cost_cache_round_trip(tmp_path: Path) -> None:
    cache = CostCache()
    cache.put("abc", 0.5, 1.0, 1024)
    cache.save(tmp_path / "c.json")
    loaded = CostCache.load(tmp_path / "c.json")
    assert "abc" in loaded and loaded.get("abc") == {
        "forward_s": 0.5,
        "backward_s": 1.0,
        "activation_bytes": 1024,
    }
    (tmp_path / "bad.json").write_text('{"version": 7, "entries": {}}')
    with pytest.raises(ValueError, match="unknown cost cache version 7"):
        CostCache.load(tmp_path / "bad.json")


def test_a_layer_on_more_threads_is_another_signature() -> None:
    specs = [LayerSpec("a", functools.partial(nn.Linear, 8, 8))]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = trace_shapes(specs, torch.zeros(4, 8))[0].signature
        torch.set_num_threads(2)
        two = trace_shapes(specs, torch.zeros(4, 8))[0].signature
    finally:
        torch.set_num_threads(before)
    assert one != two
    # the same sizes signed for other threads: as a trace on them would sign them
    traced = trace_shapes(specs, torch.zeros(4, 8))
    assert [s.signature for s in on_threads(traced, 1)] == [one]
    assert [s.signature for s in on_threads(traced, 2)] == [two]
    assert on_threads(traced, 2)[0].inputs == traced[0].inputs


def test_the_cache_keeps_the_runtime_overheads(tmp_path: Path) -> None:
    measured = RuntimeOverheads(microbatch_s=4e-4, message_s=8e-4, step_s=1e-3)
    cache = CostCache({"sig": {"forward_s": 1.0, "backward_s": 2.0, "activation_bytes": 3.0}})
    assert cache.overheads is None
    cache.set_overheads(measured)
    cache.save(tmp_path / "costs.json")
    loaded = CostCache.load(tmp_path / "costs.json")
    assert loaded.overheads == measured and loaded.entries() == cache.entries()


def test_learn_replaces_profiled_costs_with_measured_ones() -> None:
    specs = [LayerSpec(k, functools.partial(nn.Linear, 8, 8)) for k in ("a", "b")]
    shapes = trace_shapes(specs, torch.zeros(4, 8))
    cache = CostCache()
    profiled = sandbox(specs, shapes, CPU, 2.0, cache)
    signature = shapes[0].signature
    measured = [
        dataclasses.replace(profiled[0], forward_s=0.5, backward_s=1.5, activation_bytes=64),
        dataclasses.replace(profiled[1], forward_s=0.0, backward_s=0.0),  # never measured
    ]
    cache.learn([s.signature for s in shapes], measured)
    # both layers share a signature: the measured one is learned, the unmeasured ignored
    assert cache.get(signature) == {"forward_s": 0.5, "backward_s": 1.5, "activation_bytes": 64}
    assert sandbox(specs, shapes, CPU, 2.0, cache)[1].forward_s == 0.5
    with pytest.raises(ValueError, match="1 signatures for 2"):
        cache.learn([signature], measured)
