"""The direction of imports (docs/design.md, section 2), with the rules read from pyproject.toml.

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
PACKAGES = [p for p in RULES if p not in ("only_in", "layers", "comm", "floors")]


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


def pipeline_modules() -> list[tuple[str, Path]]:
    return [(module_name(path), path) for path in sorted((ROOT / "pipeline").rglob("*.py"))]


def runtime_imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, full module name) of every absolute import of `pipeline` or torch.distributed."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(("pipeline.", "torch.distributed")):
                yield node.lineno, name


@pytest.mark.parametrize("module,path", pipeline_modules(), ids=lambda v: str(v))
def test_layers_inside_pipeline(module: str, path: Path) -> None:
    """pure <- local <- distributed: a part never imports a later one or torch.distributed."""
    rules = RULES["layers"]
    layer = next((name for name in rules if module == name or module.startswith(name + ".")), None)
    if layer is None:
        return  # the distributed parts and the facade may import anything of the runtime
    allowed = rules[layer]
    for line, name in runtime_imports(path):
        where = f"{module} (line {line}) imports {name}"
        assert not name.startswith("torch.distributed"), where
        if name.count(".") >= 1 and name.split(".")[1] in {
            "pure",
            "local",
            "distributed",
            "errors",
        }:
            target = ".".join(name.split(".")[:2])
            assert target in allowed, f"{where}; {layer} may import only {allowed}"


def distributed_calls(path: Path) -> Iterator[tuple[int, str]]:
    """(line, name) of every call `dist.<name>(...)` or `torch.distributed.<name>(...)`."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {"torch.distributed"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = ast.unparse(node.func.value)
            if owner in aliases:
                yield node.lineno, node.func.attr
        if isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            for alias in node.names:
                yield node.lineno, alias.name


@pytest.mark.parametrize("module,path", pipeline_modules(), ids=lambda v: str(v))
def test_one_owner_of_collectives_and_messages(module: str, path: Path) -> None:
    rule = RULES["comm"]
    if module == rule["owner"]:
        return
    for line, name in distributed_calls(path):
        assert name not in rule["calls"], (
            f"{module} (line {line}) calls torch.distributed.{name}; every collective and "
            f"message goes through {rule['owner']}.Comm"
        )


def test_the_comm_rule_sees_a_direct_call(tmp_path: Path) -> None:
    """The check above would catch a module that calls a collective directly."""
    source = tmp_path / "bad.py"
    source.write_text("import torch.distributed as dist\n\ndist.all_reduce(t)\n")
    assert list(distributed_calls(source)) == [(3, "all_reduce")]


# -- floors inside nas/ ------------------------------------------------------------------------
def part_of(name: str, floors: list[list[str]]) -> tuple[int, str] | None:
    """(floor, part) of a module or imported name: the longest part that names it or holds
    it; the package itself ("nas") holds only its own `__init__`."""
    found = [
        (floor, part)
        for floor, parts in enumerate(floors)
        for part in parts
        if name == part or (part.count(".") and name.startswith(part + "."))
    ]
    return max(found, key=lambda f: len(f[1]), default=None)


def floor_violations(
    module: str, names: list[tuple[int, str]], floors: list[list[str]]
) -> Iterator[str]:
    """What `module` imports against the floors: a part of its own floor or above."""
    mine = part_of(module, floors)
    assert mine is not None, f"{module} is on no floor of pyproject.toml's import_rules.floors"
    for line, name in names:
        theirs = part_of(name, floors)
        if theirs is None or theirs[1] == mine[1]:
            continue
        if theirs[0] >= mine[0]:
            yield f"{module} (line {line}) imports {name}: {theirs[1]} is not below {mine[1]}"


def package_imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, full name) of every absolute import of `package` (names imported from a
    module included: `from nas import study` is nas.study), lazy ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [(line, n) for line, n in found if n == package or n.startswith(package + ".")]


def floored_modules() -> list[tuple[str, str, Path]]:
    return [
        (package, module_name(path), path)
        for package in RULES["floors"]
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


@pytest.mark.parametrize("package,module,path", floored_modules(), ids=lambda v: str(v))
def test_floors_inside_nas(package: str, module: str, path: Path) -> None:
    """Each part imports only the floors below it: no back arrow between nas' parts."""
    floors = RULES["floors"][package]
    violations = list(floor_violations(module, package_imports(path, package), floors))
    assert not violations, "; ".join(violations)


def test_the_floor_rule_sees_a_back_arrow() -> None:
    floors = [["nas.errors"], ["nas.study"], ["nas.retrain", "nas.report"]]
    assert not list(floor_violations("nas.retrain.stage", [(1, "nas.study.run")], floors))
    assert list(floor_violations("nas.study.run", [(3, "nas.retrain.stage")], floors))
    assert list(floor_violations("nas.report", [(5, "nas.retrain")], floors))  # same floor
