"""The runtime's errors travel between processes intact (they are raised on every rank)."""

from __future__ import annotations

import pickle

import pytest
import torch

from pipeline import (
    MigrationError,
    NonFiniteLossError,
    PipelineError,
    StageError,
    StageFailedError,
)
from pipeline.distributed.links import TensorMeta, _decode, _encode

ERRORS = [
    StageError(
        1, "backward", 7, "RuntimeError: boom", "Traceback ...", layer="block3", microbatch=2
    ),
    NonFiniteLossError(2, "loss", 0, "the loss is nan", microbatch=0),
    StageFailedError(0, "the process exited with code -9"),
    MigrationError("migration [2, 2] -> [1, 3] rolled back in its build phase"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
def test_errors_pickle_with_every_field(error: PipelineError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error) and str(copy) == str(error)
    assert vars(copy) == vars(error)
    assert isinstance(copy, PipelineError)


def test_a_stage_error_names_where_it_happened() -> None:
    text = str(ERRORS[0])
    assert text.startswith(
        "stage 1 failed in the backward of layer 'block3' (micro-batch 2) "
        "at step 7: RuntimeError: boom"
    )
    assert "Traceback ..." in text


def test_a_failed_header_carries_no_shapes() -> None:
    meta = (TensorMeta((4, 3), torch.float32, True),)
    assert _decode(_encode(meta)) == meta
    assert _decode(_encode((), ok=False)) is None
