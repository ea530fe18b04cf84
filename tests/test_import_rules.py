"""The direction of imports (DESIGN.md section 2), with the rules read from pyproject.toml.

`pipeline` imports only torch and numpy; `search_spaces` never imports optuna or hydra;
Hydra/omegaconf live only in the CLI and config modules of `nas`, wandb only in its tracker.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RULES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["import_rules"]
PACKAGES = [p for p in RULES if p != "only_in"]


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in a file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def sources() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield package, path


@pytest.mark.parametrize("package,path", list(sources()), ids=lambda v: str(v))
def test_import_direction(package: str, path: Path) -> None:
    rule = RULES[package]
    allowed, forbidden = set(rule["allowed"]), set(rule.get("forbidden", []))
    module = module_name(path)
    for line, name in imports(path):
        where = f"{module} (line {line}) imports {name}"
        if name in sys.stdlib_module_names or name == "__future__":
            continue
        assert name not in forbidden, where
        assert "*" in allowed or name in allowed, f"{where}; allowed: {sorted(allowed)}"
        confined = RULES["only_in"].get(name)
        if confined is not None:
            assert any(module == m or module.startswith(m + ".") for m in confined), (
                f"{where}; {name} may only be imported in {confined}"
            )
