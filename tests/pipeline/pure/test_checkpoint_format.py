"""The checkpoint format without files or processes: entry names, the manifest, the model
check, and which automatic checkpoints are newest or expired."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.pure.checkpoint_format import (
    PARTS,
    CheckpointError,
    FileRecord,
    Manifest,
    check_same_model,
    checkpoint_name,
    entry_name,
    expired,
    newest,
    partial_name,
    split_entry,
    step_of,
)


@given(st.text(min_size=1), st.sampled_from(PARTS), st.text())
def test_entry_names_round_trip(key: str, part: str, tail: str) -> None:
    name = entry_name(key, part, tail)  # type: ignore[arg-type]
    assert split_entry(name) == (key, part, tail)
    assert name.split("/")[1] != "" and "/" not in name.split("/")[1]  # the key is quoted


def test_entry_names_are_readable_and_keyed_by_layer() -> None:
    assert entry_name("block0", "module", "linear1.weight") == "layers/block0/module/linear1.weight"
    assert entry_name("a/b", "group") == "layers/a%2Fb/group"
    # keys that would collide if joined plainly stay apart
    assert entry_name("a.b", "module", "c") != entry_name("a", "module", "b.c")
    with pytest.raises(ValueError, match="unknown checkpoint part 'grads'"):
        entry_name("a", "grads")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a layer entry"):
        split_entry("layers/a/grads/x")


def manifest(**changes: object) -> Manifest:
    fields: dict[str, object] = {
        "step": 12,
        "seed": 3,
        "layers": ("a", "b", "c"),
        "actions": ("keep", "recompute", "keep"),
        "sizes": (1, 2),
        "schedule": "1f1b",
        "stages_per_rank": 1,
        "n_ranks": 2,
        "n_microbatches": 4,
        "plan": {"sizes": [1, 2]},
        "owners": {"a": 0, "b": 1, "c": 1},
        "lr_scheduler": True,
        "versions": "2bw",
        "cost_cache": {"sig": {"forward_s": 1.0, "backward_s": 2.0, "activation_bytes": 3.0}},
        "files": {"__0_0.distcp": FileRecord(10, 123)},
        "torch_version": "2.13.0",
    }
    fields.update(changes)
    return Manifest(**fields)  # type: ignore[arg-type]


def test_the_manifest_round_trips_through_json() -> None:
    original = manifest()
    data = json.loads(json.dumps(original.to_dict()))
    assert Manifest.from_dict(data, "x/pipeline.json") == original
    assert original.n_stages == 2


def test_a_bad_manifest_is_an_error_naming_the_file() -> None:
    data = manifest().to_dict()
    with pytest.raises(CheckpointError, match="ck/pipeline.json is not a pipeline checkpoint"):
        Manifest.from_dict({"format": "other"}, "ck/pipeline.json")
    with pytest.raises(CheckpointError, match="ck/pipeline.json has checkpoint format version 9"):
        Manifest.from_dict({**data, "version": 9}, "ck/pipeline.json")
    with pytest.raises(CheckpointError, match="ck/pipeline.json is a damaged manifest"):
        Manifest.from_dict({**data, "step": None}, "ck/pipeline.json")
    with pytest.raises(CheckpointError, match="damaged"):
        Manifest.from_dict({**data, "sizes": [1, 1]}, "ck/pipeline.json")  # 2 of 3 layers


def test_another_model_is_named_by_its_first_differing_key() -> None:
    check_same_model(["a", "b"], ["a", "b"], "ck")
    with pytest.raises(CheckpointError, match="layer 1 is 'x' in this model but 'b' in"):
        check_same_model(["a", "b", "c"], ["a", "x", "c"], "ck")
    with pytest.raises(CheckpointError, match="layer 2 is 'c' in this model but None"):
        check_same_model(["a", "b"], ["a", "b", "c"], "ck")
    with pytest.raises(CheckpointError, match="ck is a checkpoint of another model"):
        check_same_model(["a", "b"], ["a"], "ck")


def test_automatic_checkpoint_names() -> None:
    assert checkpoint_name(100) == "step-00000100"
    assert step_of("step-00000100") == 100 and step_of("step-123456789") == 123456789
    assert step_of(".step-00000100.partial") is None and step_of("final") is None
    assert partial_name("step-00000100") == ".step-00000100.partial"
    with pytest.raises(ValueError, match="step must be >= 0"):
        checkpoint_name(-1)


def test_newest_and_expired_checkpoints() -> None:
    names = ["step-00000300", "step-00000100", "mine", "step-00000200"]
    assert newest(names) == "step-00000300"
    assert newest(["mine"]) is None
    assert expired(names, 2) == ["step-00000100"]
    assert expired(names, 1) == ["step-00000100", "step-00000200"]
    assert expired(names, None) == [] and expired(names, 5) == []
