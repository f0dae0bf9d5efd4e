"""The package as a user installs it: a wheel built from this checkout, installed into a fresh
environment outside it, runs ``recsys data list`` (the dataset registry, data/, ships as data files)
and a short ``recsys train`` from a folder that is not the checkout; installed with
``pip install --target DIR``, it finds its registry too.

Nothing is downloaded: the wheel is built without build isolation, installed with ``--no-index
--no-deps``, and the fresh environment reaches this one's dependencies (torch and the rest)
through one ``.pth`` line added after the install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from recsys.data.registry import registry

from conftest import TINY_RUN_OVERRIDES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "recsys", "data")  # what setuptools reads (readme, packages, data-files)


def _run(cmd: list[str | Path], cwd: Path) -> str:
    """Run ``cmd`` in ``cwd`` without this checkout on ``PYTHONPATH``; its stdout, or a failure
    with the command's whole output."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _build_wheel(work: Path) -> Path:
    """The wheel of a copy of this checkout's build inputs (the build writes beside its sources,
    so it runs on the copy)."""
    source = work / "source"
    for name in BUILD_INPUTS:
        src = ROOT / name
        if name == "data":  # the registry only, not datasets fetched into it
            (source / name).mkdir(parents=True)
            for path in [*src.glob("*.toml"), src / "README.md"]:
                shutil.copy2(path, source / name / path.name)
        elif src.is_dir():
            shutil.copytree(src, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(src, source / name)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            work / "dist",
            source,
        ],
        cwd=work,
    )
    (wheel,) = (work / "dist").glob("multi_interest_recsys-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """``bin/`` of a fresh venv holding the wheel, outside the checkout."""
    work = tmp_path_factory.mktemp("venv")
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel], cwd=work)
    purelib = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd=work).strip())
    (purelib / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv / "bin"


def test_the_installed_package_is_the_wheel(installed, tmp_path):
    where = _run([installed / "python", "-c", "import recsys.data.registry as r; print(r.REGISTRY_DIR)"], cwd=tmp_path)
    assert Path(where.strip()).is_relative_to(installed.parent), where


def test_data_list_in_the_installed_package_lists_every_registered_dataset(installed, tmp_path):
    out = _run([installed / "recsys", "data", "list"], cwd=tmp_path)
    listed = {line.split()[0] for line in out.splitlines()[1:] if line.strip() and not line.startswith("cache:")}
    assert listed == set(registry()), out


def test_a_short_train_runs_from_outside_the_checkout(installed, tmp_path):
    overrides = [a for o in TINY_RUN_OVERRIDES if not o.startswith("train.") for a in ("--set", o)] + [
        "--set",
        "train.max_steps=4",
        "--set",
        "train.eval_every=4",
        "--set",
        "train.batch_size=32",
        "--set",
        "train.num_negatives=16",
    ]
    out = _run([installed / "recsys", "train", *overrides, "--set", "output_dir=runs"], cwd=tmp_path)
    prefix = "run directory: "
    (run_dir,) = {line.removeprefix(prefix) for line in out.splitlines() if line.startswith(prefix)}
    assert (tmp_path / "runs") in (tmp_path / run_dir).parents and (tmp_path / run_dir).is_dir(), out
    assert "test metrics" in out


def test_an_install_with_target_finds_its_registry(wheel, tmp_path):
    """Was: `pip install --target DIR` put the registry in DIR/share/..., but the wheel's file list,
    written for an environment, pointed at ../../share/... outside DIR: "the dataset registry is missing"."""
    target = tmp_path / "target"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", target, wheel], cwd=tmp_path)
    code = "import recsys.data.registry as r; print(r.REGISTRY_DIR); print(len(r.registry()))"
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"} | {"PYTHONPATH": str(target)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    where, count = done.stdout.split()
    assert Path(where).is_relative_to(target) and int(count) == len(registry()), done.stdout
