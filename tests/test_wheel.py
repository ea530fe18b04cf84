"""The package as a user gets it: a wheel, installed in a fresh virtual environment and run
from another folder, finds its configuration, runs a study and logs to Hydra's job log.

The wheel is built from a copy of what it is made of (nothing is written in the checkout).
The new environment sees the third-party packages already installed here through a `.pth`
file naming this environment's site-packages: they are not installed again, and the
checkout's editable install stays out of it (a `.pth` file inside a folder added that way is
not read), so `nas` can only come from the wheel.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import optuna
import pytest

from nas.study.trials import counted
from tests.nas.harness.test_cli import ONE_TRIAL

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "pipeline", "search_spaces")
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "conf", *PACKAGES)


def build_wheel(into: Path) -> Path:
    """The wheel of a copy of the checkout's sources under `into`."""
    source = into / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run([*command, "-q", "-w", str(into / "dist"), str(source)], check=True)
    (wheel,) = (into / "dist").glob("elastic_nas-*.whl")
    return wheel


def fresh_venv(path: Path) -> Path:
    """A virtual environment at `path` that sees this one's packages; its `bin` folder."""
    venv.create(path, with_pip=False, symlinks=True)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "parent_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin"


def clean_env() -> dict[str, str]:
    """This environment without anything that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "WANDB_MODE": "offline"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `bin` folder of a fresh environment with the wheel installed."""
    bin_dir = fresh_venv(tmp_path_factory.mktemp("env") / "venv")
    install = [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*install, "--ignore-installed", str(wheel)], check=True, env=clean_env())
    return bin_dir


def test_the_wheel_holds_every_package_its_configuration_and_licence(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        for init in (ROOT / package).rglob("__init__.py"):
            assert init.relative_to(ROOT).as_posix() in names, f"{init} is not in {wheel.name}"
        assert f"{package}/py.typed" in names
    configs = {p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")}
    assert {"config.yaml", "experiment/small_cpu.yaml", "hydra/help/elastic_nas.yaml"} <= configs
    missing = sorted(c for c in configs if f"nas/conf/{c}" not in names)
    assert not missing, f"configs missing from {wheel.name}: {missing}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(names)


def test_the_installed_command_runs_a_study_from_another_folder(
    installed: Path, tmp_path: Path
) -> None:
    env = clean_env()

    def run(command: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
        """`command` of the fresh environment, from `tmp_path`, its output kept."""
        command = [str(installed / command[0]), *command[1:]]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
        )

    found = run(["python", "-c", "import nas.conf; print(nas.conf.__file__)"], 120)
    assert found.returncode == 0, found.stderr[-3000:]
    where = found.stdout.strip()
    assert Path(where).is_relative_to(installed.parent), f"nas.conf comes from {where}"

    helped = run(["elastic-nas", "--help"], 300)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert helped.stdout.startswith("elastic-nas: neural architecture search"), helped.stdout
    assert "elastic-nas experiment=small_cpu" in helped.stdout
    assert "sampler: evolution, " in helped.stdout  # Hydra's $APP_CONFIG_GROUPS

    run_dir, studies = tmp_path / "run", tmp_path / "studies"
    overrides = ["experiment=small_cpu", "study.name=wheel", *ONE_TRIAL]
    places = [f"studies_dir={studies}", f"hydra.run.dir={run_dir}"]
    done = run(["elastic-nas", *overrides, *places], 540)
    assert done.returncode == 0, done.stderr[-3000:]
    study = optuna.load_study(study_name="wheel", storage=f"sqlite:///{studies / 'wheel.db'}")
    assert [t.state for t in study.trials if counted(t)] == [optuna.trial.TrialState.COMPLETE]
    log = (run_dir / "elastic-nas.log").read_text()
    assert "[MainProcess][nas.cli][INFO] - study wheel: stages search" in log, log
    stage = r"pipeline-(?:stage|pool)-\d"  # a launched stage process or a pool's
    stage_event = rf"\]\[{stage}\]\[pipeline\.distributed\.events\]\[INFO\] - .* build "
    assert re.search(stage_event, log), log
