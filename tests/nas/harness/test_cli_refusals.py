"""`python -m nas` refusing what it is given, as a user sees it: a subprocess that ends at
composition or at the settings' checks, before any stage process starts (so these run with
the tests without processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.nas.harness.common import run


def test_the_composed_config_prints(tmp_path: Path) -> None:
    shown = run(tmp_path, "--cfg", "job", "experiment=search_2h", "pruner=none")
    assert shown.returncode == 0 and "fidelity: inherited" in shown.stdout
    assert "[ERROR]" not in shown.stdout + shown.stderr


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (("--cfg", "job", "train.lr=fast"), "train.lr='fast' is not valid; it must be > 0"),
    ],
    ids=["wrong-type-cfg"],  # the others: `test_bad_inputs`
)
def test_a_bad_override_ends_in_one_error_line_naming_the_key(
    tmp_path: Path, overrides: tuple[str, ...], said: str
) -> None:
    """Refused while composing (Hydra, OmegaConf) or by the settings: one [ERROR] line, the
    last, naming the key and what is valid; no traceback, no study started."""
    done = run(tmp_path, *overrides)
    printed = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in printed, printed[-3000:]
    errors = [line for line in printed.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and said in errors[0], printed[-3000:]
    assert printed.strip().splitlines()[-1] == errors[0]
    assert not (tmp_path / "studies").exists()
