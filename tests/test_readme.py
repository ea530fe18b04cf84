"""The README's "runtime in one screen" runs as written: a reader's first contact with the API."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What the snippet leaves to the reader: their batches and a second model.
_READER = """
def my_batches():
    for _ in range(2):
        yield torch.randn(8, 16, 256), torch.randn(8, 16, 256)


other_specs = specs[:6]

"""


def _runtime_snippet() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## The runtime in one screen", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README lost its runtime snippet"
    code = match.group(1)
    assert "def main(ctx):" in code and "pipeline.launch(main" in code
    code = code.replace("def main(ctx):", _READER + "def main(ctx):", 1)
    guarded = 'if __name__ == "__main__":\n    pipeline.launch(main'
    return code.replace("pipeline.launch(main", guarded)


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_the_runtime_in_one_screen_runs(tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(_runtime_snippet())
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'generation': 2" in done.stdout  # two reconfigures, then stats
