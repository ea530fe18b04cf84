"""The `.wandb` reader on files built here, byte by byte: the block format (records split
across 32 KiB blocks, padding, checksums, a cut-off tail) and the decoding of records
(config, history with JSON and typed values, summary updates and removals, metric
definitions, artifacts, exit code).
The real files W&B writes are read in test_wandb_tracker.py."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from nas.tracking.wandb import (
    MetricDefinition,
    WandbArtifact,
    WandbLogError,
    find_run_files,
    iter_chunks,
    iter_records,
    read_run,
)

pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def write_log(records: list[bytes]) -> bytes:
    """A W&B transaction log holding `records`, as wandb-core's writer lays it out."""
    out = bytearray(b":W&B" + struct.pack("<HB", 0xBEE1, 0))
    for record in records:
        data, first = record, True
        while True:
            left = BLOCK - len(out) % BLOCK
            if left < HEADER:
                out += bytes(left)  # pad the block's tail
                continue
            fragment, data = data[: left - HEADER], data[left - HEADER :]
            last = not data
            kind = (FULL if last else FIRST) if first else (LAST if last else MIDDLE)
            crc = zlib.crc32(fragment, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF
            out += struct.pack("<IHB", crc, len(fragment), kind) + fragment
            first = False
            if last:
                break
    return bytes(out)


def payloads() -> list[bytes]:
    """Small and large records; the sizes put block boundaries inside records and leave
    block tails too short for a header (padding)."""
    sizes = [10, 100_000, BLOCK - 2 * HEADER - 3, 5, 40_000, 0, 1]
    return [bytes([i % 251]) * size for i, size in enumerate(sizes)]


def test_records_round_trip_across_blocks_and_padding() -> None:
    records = payloads()
    data = write_log(records)
    assert list(iter_records(data)) == records
    kinds = [kind for kind, _ in iter_chunks(data)]
    assert {FULL, FIRST, MIDDLE, LAST} <= set(kinds)
    assert list(iter_records(data + bytes(100))) == records  # trailing zeroes: no records


def test_a_bad_header_or_checksum_is_an_error() -> None:
    data = bytearray(write_log([b"hello world"]))
    with pytest.raises(WandbLogError, match="not a W&B transaction log"):
        list(iter_records(b"LEVELDB" + bytes(data[7:])))
    with pytest.raises(WandbLogError, match="too short"):
        list(iter_records(b":W&B"))
    data[-1] ^= 0xFF
    with pytest.raises(WandbLogError, match="bad checksum"):
        list(iter_records(bytes(data)))


def test_a_cut_off_tail_yields_the_complete_records_only() -> None:
    records = payloads()
    data = write_log(records)
    whole_first_two = len(write_log(records[:2]))
    for cut in (whole_first_two + 3, whole_first_two + 40, len(data) - 1):
        got = list(iter_records(data[:cut]))
        assert got == records[: len(got)] and len(got) >= 2
    assert list(iter_records(data[: whole_first_two - 10])) == records[:1]


def item(key: str, value: Any) -> Any:
    return pb.HistoryItem(nested_key=[key], value_json=json.dumps(value))


def run_records() -> list[Any]:
    """The run's header, its run record (config, tags...) and a config removal."""
    config = pb.ConfigRecord(
        update=[
            pb.ConfigItem(key="arch", value_json='{"d": 64}'),
            pb.ConfigItem(key="drop", value_json="1"),
        ]
    )
    run = pb.RunRecord(
        run_id="abc",
        project="p",
        display_name="s-trial-0",
        run_group="s",
        job_type="trial",
        tags=["x"],
        config=config,
    )
    return [
        pb.Record(header=pb.HeaderRecord()),
        pb.Record(run=run),
        pb.Record(config=pb.ConfigRecord(remove=[pb.ConfigItem(key="drop")])),
    ]


def history_records() -> list[Any]:
    """Two history rows: JSON values with `_step` among them, then every typed value with
    the step in the record."""
    json_row = [item("_step", 0), item("loss", 2.0), item("nan", "NaN"), item("_runtime", 0.1)]
    typed_row = [
        pb.HistoryItem(key="loss", number=1.5),
        pb.HistoryItem(key="count", integer=-3),
        pb.HistoryItem(key="ok", boolean=True),
        pb.HistoryItem(key="name", text="a"),
        pb.HistoryItem(key="gone", none=0),
        pb.HistoryItem(key="obj", json='{"a": [1]}'),
        pb.HistoryItem(nested_key=["table", "nrows"], value_json="2"),
    ]
    return [
        pb.Record(history=pb.HistoryRecord(item=json_row)),
        pb.Record(history=pb.HistoryRecord(step=pb.HistoryStep(num=1), item=typed_row)),
    ]


def summary_and_metric_records() -> list[Any]:
    """Summary updates and a removal; a glob and a named metric definition."""
    updates = [
        pb.SummaryItem(key="loss", value_json="1.5"),
        pb.SummaryItem(nested_key=["_wandb", "runtime"], value_json="1"),
        pb.SummaryItem(key="tmp", value_json="0"),
    ]
    loss = pb.MetricRecord(
        name="loss",
        step_metric="step",
        summary=pb.MetricSummary(min=True, last=True),
        options=pb.MetricOptions(step_sync=True),
    )
    return [
        pb.Record(summary=pb.SummaryRecord(update=updates)),
        pb.Record(summary=pb.SummaryRecord(remove=[pb.SummaryItem(key="tmp")])),
        pb.Record(metric=pb.MetricRecord(glob_name="*", step_metric="step")),
        pb.Record(metric=loss),
    ]


def artifact_record() -> Any:
    """A logged model artifact with one file in its manifest."""
    entry = pb.ArtifactManifestEntry(path="w/a.bin", digest="x==", size=3)
    artifact = pb.ArtifactRecord(
        name="s-trial-0",
        type="model",
        digest="d1",
        metadata='{"seed": 1}',
        aliases=["latest"],
        manifest=pb.ArtifactManifest(contents=[entry]),
    )
    return pb.Record(artifact=artifact)


def run_file(tmp_path: Path, *, exit_code: int | None, cut: int = 0) -> Path:
    """A run's `.wandb` file holding a record of every kind (an exit record only with an
    `exit_code`), its last `cut` bytes cut off."""
    records = [
        *run_records(),
        *history_records(),
        *summary_and_metric_records(),
        artifact_record(),
    ]
    if exit_code is not None:
        records.append(pb.Record(exit=pb.RunExitRecord(exit_code=exit_code)))
    data = write_log([r.SerializeToString() for r in records])
    folder = tmp_path / "wandb" / f"offline-run-20260101_000000-{'abc' if cut else 'xyz'}"
    folder.mkdir(parents=True)
    path = folder / "run-abc.wandb"
    path.write_bytes(data[: len(data) - cut] if cut else data)
    return path


def test_read_run_decodes_every_record_kind(tmp_path: Path) -> None:
    path = run_file(tmp_path, exit_code=1)
    run = read_run(path.parent)  # the folder or the file
    assert run.path == path and run.directory == path.parent
    assert (run.run_id, run.name, run.project, run.group, run.job_type, run.tags) == (
        "abc",
        "s-trial-0",
        "p",
        "s",
        "trial",
        ("x",),
    )
    assert run.config == {"arch": {"d": 64}}
    assert len(run.history) == 2
    first, second = run.history
    assert first["_step"] == 0 and first["loss"] == 2.0 and first["_runtime"] == 0.1
    assert first["nan"] == "NaN"  # a JSON string stays a string
    assert second == {
        "_step": 1,
        "loss": 1.5,
        "count": -3,
        "ok": True,
        "name": "a",
        "gone": None,
        "obj": {"a": [1]},
        "table": {"nrows": 2},
    }
    assert run.metrics()[0] == {"_step": 0, "loss": 2.0, "nan": "NaN"}
    assert run.summary == {"loss": 1.5, "_wandb": {"runtime": 1}}
    assert run.metric_definitions == {
        "*": MetricDefinition("*", glob=True, step_metric="step"),
        "loss": MetricDefinition(
            "loss", step_metric="step", summary=("min", "last"), step_sync=True
        ),
    }
    assert run.artifacts == [
        WandbArtifact("s-trial-0", "model", "d1", {"seed": 1}, ("latest",), {"w/a.bin": (3, "x==")})
    ]
    assert run.exit_code == 1 and not run.truncated


def test_read_run_of_a_crashed_run(tmp_path: Path) -> None:
    run = read_run(run_file(tmp_path, exit_code=None, cut=5))
    assert run.exit_code is None and run.truncated
    assert len(run.history) == 2  # everything before the cut-off record
    assert find_run_files(tmp_path) == [run.path]
