"""scripts/offline_wheels.py: the wheels an offline machine with torch needs, and their install there."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from train_helpers import ROOT

pytestmark = pytest.mark.unit

SCRIPT = ROOT / "scripts" / "offline_wheels.py"
_spec = importlib.util.spec_from_file_location("offline_wheels", SCRIPT)
assert _spec is not None and _spec.loader is not None
offline_wheels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(offline_wheels)

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_wheels_are_ladders_requirements_at_the_tested_versions_less_torchs():
    pins = offline_wheels.wheels_needed(["ladder"], python_version=HERE, skip=[])
    for name in ("deepspeed", "hydra-core", "omegaconf", "antlr4-python3-runtime", "pydantic-core", "wandb"):
        assert pins[name] == f"{name}=={metadata.version(name)}", pins
    # The target has its own torch, and what torch requires (typing-extensions, sympy, ...).
    for name in ("torch", "typing-extensions", "sympy", "ladder"):
        assert name not in pins, pins
    # The dev extra's tools are not the run's requirements.
    for name in ("pytest", "ruff", "mypy"):
        assert name not in pins, pins


def test_an_extra_brings_its_tools_along():
    pins = offline_wheels.wheels_needed(["ladder[dev]"], python_version=HERE, skip=["wandb"])
    for name in ("pytest", "ruff", "mypy", "deepspeed"):
        assert pins[name] == f"{name}=={metadata.version(name)}", pins
    assert "ladder" not in pins and "wandb" not in pins


def test_a_skipped_distribution_takes_what_only_it_needs_along():
    full = offline_wheels.wheels_needed(["ladder"], python_version=HERE, skip=[])
    without = offline_wheels.wheels_needed(["ladder"], python_version=HERE, skip=["wandb"])
    assert "wandb" not in without and "protobuf" in full and "protobuf" not in without
    # What others need too stays.
    assert "pyyaml" in without and "rich" in without


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel of one module, ``name``, that returns its version."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{name}.py", f"VERSION = {version!r}\n")
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_install_puts_in_what_the_interpreter_lacks_and_keeps_what_it_has(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "ladder_offline_probe", "1.0")
    _wheel(wheels, "PyYAML", "0.1")  # installed here at another version: kept as it is
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "install", str(wheels), "--target", str(site)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert f"keeping the installed pyyaml {metadata.version('pyyaml')} (the folder's is 0.1)" in result.stdout
    assert (site / "ladder_offline_probe.py").exists() and not (site / "yaml").exists()
    assert f"export PYTHONPATH={site}" in result.stdout


def test_install_from_a_folder_without_wheels_says_how_to_make_them(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "install", str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert f"{tmp_path} holds no wheels" in result.stderr and "offline_wheels.py download" in result.stderr


def test_a_malformed_python_version_is_refused_with_the_form_it_takes():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "download", "unused", "--python-version", "312"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "--python-version '312': give X.Y, e.g. 3.12" in result.stderr
