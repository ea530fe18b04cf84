"""The single-process parts of checkpoints, without processes: per-layer lr schedules (equal
to one scheduler over one optimizer, across a move between optimizers), a stage's layers as
checkpoint entries and back, the folder on disk, and `CheckpointOptions`."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.optim import lr_scheduler as sched

from pipeline import CheckpointError, CheckpointOptions
from pipeline.local import checkpoint_files as files
from pipeline.local import layer_state
from pipeline.local.lr_schedules import LayerSchedules, check_lr_scheduler
from pipeline.local.models import mlp_stack
from pipeline.local.objective import build_optimizer
from pipeline.local.stage import Stage
from pipeline.pure.checkpoint_format import MANIFEST, FileRecord, Manifest

SCHEDULERS: dict[str, Callable[[torch.optim.Optimizer], Any]] = {
    "step": functools.partial(sched.StepLR, step_size=2, gamma=0.5),
    "one cycle": functools.partial(sched.OneCycleLR, max_lr=0.1, total_steps=12),
    "lambda": lambda opt: sched.LambdaLR(opt, lambda e: 1 / (1 + e)),
    "warm-up then cosine": lambda opt: sched.SequentialLR(
        opt,
        [sched.LinearLR(opt, 0.1, total_iters=3), sched.CosineAnnealingLR(opt, T_max=8)],
        milestones=[3],
    ),
}
ADAM = functools.partial(torch.optim.Adam, lr=1e-2)


def layers(n: int = 3) -> list[torch.nn.Linear]:
    torch.manual_seed(0)
    return [torch.nn.Linear(2, 2) for _ in range(n)]


def settings(optimizers: list[torch.optim.Optimizer]) -> dict[str, tuple[float, Any]]:
    return {g["layer"]: (g["lr"], g.get("betas")) for opt in optimizers for g in opt.param_groups}


def step(optimizers: list[torch.optim.Optimizer]) -> None:
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = torch.ones_like(p)
        opt.step()


def move_group(key: str, source: torch.optim.Optimizer, target: torch.optim.Optimizer) -> None:
    """What a migration does to the optimizers: the group leaves one, a copy joins the other."""
    group = next(g for g in source.param_groups if g["layer"] == key)
    source.param_groups[:] = [g for g in source.param_groups if g is not group]
    state = {p: source.state.pop(p) for p in group["params"] if p in source.state}
    target.add_param_group(
        {"params": group["params"], **{k: v for k, v in group.items() if k != "params"}}
    )
    target.state.update(state)


@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_per_layer_schedules_equal_one_scheduler_across_a_move(name: str) -> None:
    factory = SCHEDULERS[name]
    ref_layers, own_layers = layers(), layers()
    ref_opt = build_optimizer(ADAM, [(f"l{i}", m) for i, m in enumerate(ref_layers)])
    assert ref_opt is not None
    ref_sched = factory(ref_opt)
    first = build_optimizer(ADAM, [("l0", own_layers[0]), ("l1", own_layers[1])])
    second = build_optimizer(ADAM, [("l2", own_layers[2])])
    assert first is not None and second is not None
    schedules = LayerSchedules(check_lr_scheduler(factory, ADAM))
    schedules.sync([first, second])
    for t in range(10):
        if t == 4:  # layer l1 migrates from the first optimizer to the second
            schedules.stash([first, second])
            move_group("l1", first, second)
            schedules.sync([first, second])
        step([ref_opt])
        ref_sched.step()
        step([first, second])  # each optimizer's step post-hook steps its layers' schedules
        assert settings([first, second]) == settings([ref_opt]), (name, t)
    assert [g["layer"] for g in second.param_groups] == ["l2", "l1"]
    assert all("lr_scheduler_state" not in g for g in second.param_groups)
    for mine, theirs in zip(own_layers, ref_layers, strict=True):
        assert torch.equal(mine.weight, theirs.weight)


def test_a_bad_lr_scheduler_factory_is_refused() -> None:
    with pytest.raises(TypeError, match="must be a factory optimizer -> LRScheduler"):
        check_lr_scheduler(42, ADAM)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ReduceLROnPlateau steps on a metric"):
        check_lr_scheduler(sched.ReduceLROnPlateau, ADAM)
    with pytest.raises(TypeError, match="returned a SGD; it must return"):
        check_lr_scheduler(lambda opt: torch.optim.SGD([torch.zeros(1)], lr=1.0), ADAM)  # type: ignore[arg-type,return-value]
    assert check_lr_scheduler(None, ADAM) is None


# -- a stage's layers as entries, and back --------------------------------------------------
def stage(seed: int) -> Stage:
    specs = mlp_stack([4, 8, 8, 3], dropout=0.1, batch_norm=True)
    return Stage(
        0, 1, specs, seed=seed, device=torch.device("cpu"), optimizer=ADAM, loss_fn=F.cross_entropy
    )


def trained(schedules: LayerSchedules) -> Stage:
    s = stage(seed=1)
    assert s.optimizer is not None
    schedules.sync([s.optimizer])
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    for _ in range(3):
        s.begin_step(0, 1, False)
        state = s.forward(0, (x,), y)
        s.backward(state, 0, [])
        s.optimizer_step()
    return s


def test_a_stage_round_trips_through_its_entries() -> None:
    factory = functools.partial(sched.StepLR, step_size=2, gamma=0.5)
    source = trained(LayerSchedules(factory))
    saved_schedules = LayerSchedules(factory)
    assert source.optimizer is not None
    saved_schedules.sync([source.optimizer])
    saved_schedules.load("mlp0", {"last_epoch": 3, "_step_count": 4})
    entries = layer_state.entries([source], saved_schedules)
    assert "layers/mlp0/optimizer/exp_avg/linear.weight" in entries
    assert "layers/mlp0/module/norm.running_mean" in entries
    available = {
        name: (v.shape, v.dtype) if torch.is_tensor(v) else None for name, v in entries.items()
    }
    target, schedules = stage(seed=2), LayerSchedules(factory)  # other initial weights
    assert target.optimizer is not None
    schedules.sync([target.optimizer])
    wanted = layer_state.wanted([target], available)
    assert wanted.keys() == entries.keys()
    filled = {k: v.clone() if torch.is_tensor(v) else v for k, v in entries.items()}
    layer_state.apply([target], filled, schedules, lambda s: None)
    for a, b in zip(source.layers, target.layers, strict=True):
        for (name, x), y in zip(
            a.module.state_dict().items(), b.module.state_dict().values(), strict=True
        ):
            assert torch.equal(x, y), name
    src, dst = source.optimizer, target.optimizer
    for p, q in zip(source.parameters(), target.parameters(), strict=True):
        assert all(torch.equal(src.state[p][k], dst.state[q][k]) for k in src.state[p])
    assert [g["lr"] for g in dst.param_groups] == [g["lr"] for g in src.param_groups]
    assert schedules.state("mlp0")["last_epoch"] == 3  # type: ignore[index]


def test_loading_another_models_layer_names_it() -> None:
    entries = layer_state.entries([stage(seed=1)], LayerSchedules(None))
    available = {n: (v.shape, v.dtype) if torch.is_tensor(v) else None for n, v in entries.items()}
    wider = Stage(
        0,
        1,
        mlp_stack([4, 9, 8, 3], dropout=0.1, batch_norm=True),
        seed=1,
        device=torch.device("cpu"),
        optimizer=ADAM,
        loss_fn=F.cross_entropy,
    )
    filled = layer_state.wanted([wider], available)
    with pytest.raises(CheckpointError, match="layer 'mlp0': linear.weight has shape"):
        layer_state.apply([wider], filled, LayerSchedules(None), lambda s: None)
    with pytest.raises(CheckpointError, match="holds no state of layer 'mlp1'"):
        layer_state.wanted([wider], {k: v for k, v in available.items() if "mlp1" not in k})


# -- the folder on disk ---------------------------------------------------------------------
def manifest(recorded: dict[str, FileRecord]) -> Manifest:
    return Manifest(5, 0, ("a",), ("keep",), (1,), "1f1b", 1, 1, 4, files=recorded)


def test_publish_replaces_a_checkpoint_whole_and_verify_names_a_bad_file(tmp_path: Path) -> None:
    final, partial = tmp_path / "ck", tmp_path / ".ck.partial"
    for content in (b"first", b"second"):
        files.prepare(partial)
        (partial / "__0_0.distcp").write_bytes(content)
        recorded = files.records(partial, ["__0_0.distcp"])
        files.publish(partial, final, manifest(recorded))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no partial, no old copy
    assert (final / "__0_0.distcp").read_bytes() == b"second"
    loaded = files.read_manifest(final)
    assert loaded.files == {"__0_0.distcp": FileRecord(6, loaded.files["__0_0.distcp"].crc32)}
    files.verify(final, ["__0_0.distcp"], loaded)
    (final / "__0_0.distcp").write_bytes(b"SECOND")
    with pytest.raises(CheckpointError, match=r"ck/__0_0.distcp is corrupt: its CRC-32"):
        files.verify(final, ["__0_0.distcp"], loaded)
    (final / "__0_0.distcp").write_bytes(b"2")
    with pytest.raises(CheckpointError, match=r"__0_0.distcp is corrupt: 1 bytes, 6 were"):
        files.verify(final, ["__0_0.distcp"], loaded)
    (final / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match=r"ck/__0_0.distcp is missing"):
        files.verify(final, ["__0_0.distcp"], loaded)
    with pytest.raises(CheckpointError, match=r"__1_0.distcp is not listed"):
        files.verify(final, ["__1_0.distcp"], loaded)


def test_read_manifest_names_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a folder"):
        files.read_manifest(tmp_path / "nothing")
    with pytest.raises(CheckpointError, match=f"{MANIFEST} is missing"):
        files.read_manifest(tmp_path)
    (tmp_path / MANIFEST).write_text("{broken")
    with pytest.raises(CheckpointError, match="cannot be read"):
        files.read_manifest(tmp_path)


def test_resolve_and_prune_automatic_checkpoints(tmp_path: Path) -> None:
    assert files.resolve(tmp_path / "nothing") is None
    assert files.resolve(tmp_path) is None
    for step in (100, 300, 200):
        folder = tmp_path / f"step-{step:08d}"
        folder.mkdir()
        (folder / MANIFEST).write_text(json.dumps(manifest({}).to_dict()))
    (tmp_path / "step-00000400").mkdir()  # no manifest: not complete
    assert files.resolve(tmp_path) == tmp_path / "step-00000300"
    assert files.resolve(tmp_path / "step-00000100") == tmp_path / "step-00000100"
    assert files.prune(tmp_path, 2) == ["step-00000100"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000200",
        "step-00000300",
        "step-00000400",
    ]


def test_checkpoint_options_are_checked() -> None:
    options = CheckpointOptions(directory="ck", every=100, resume_from="latest")
    assert options.directory == Path("ck") and options.resume_from == "latest"
    assert CheckpointOptions(resume_from="ck/step-00000100").resume_from == Path("ck/step-00000100")
    with pytest.raises(ValueError, match="every=5 saves into a directory"):
        CheckpointOptions(every=5)
    with pytest.raises(ValueError, match="every must be a positive int, got 0"):
        CheckpointOptions(directory="ck", every=0)
    with pytest.raises(ValueError, match="keep_last must be a positive int, got -1"):
        CheckpointOptions(keep_last=-1)
    with pytest.raises(ValueError, match="resume_from='latest' resumes from the newest"):
        CheckpointOptions(resume_from="latest")
    with pytest.raises(TypeError, match="directory must be a path"):
        CheckpointOptions(directory=3)  # type: ignore[arg-type]
