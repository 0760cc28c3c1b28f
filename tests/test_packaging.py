"""The distribution ships the adapters as ``lastiter_plugins.adapters`` and never a top-level ``adapters``."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, cwd: Path, path: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def test_installed_package_imports_adapters_as_subpackage(tmp_path):
    """From outside the checkout (so the repo folder is not on sys.path): the installed (editable) package."""
    proc = _python(
        "import importlib.util, lastiter_plugins.adapters as a; "
        "print(a.__name__); print(importlib.util.find_spec('adapters') is None)",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["lastiter_plugins.adapters", "True"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("lastiter_plugins-*.whl")
    return path


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "lastiter_plugins/adapters/__init__.py" in names
    assert "lastiter_plugins/py.typed" in names
    assert "lastiter_plugins/bounds/sgm.py" in names
    assert "lastiter_plugins/verification/exact.py" in names
    top_level = {n.split("/")[0] for n in names}
    assert "adapters" not in top_level
    assert not any(n.startswith(("tests/", "examples/")) for n in names)


def test_wheel_installs_and_imports(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert not (target / "adapters").exists()
    proc = _python(
        "import lastiter_plugins, lastiter_plugins.adapters as a; print(lastiter_plugins.__file__); print(a.__file__)",
        cwd=tmp_path,
        path=[str(target)],
    )
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.split():
        assert line.startswith(str(target)), line


def test_all_extra_is_the_union_of_the_host_extras():
    """`all` is spelled out (pip cannot resolve a self-referencing extra with -e ".[all,dev]"): keep it in sync."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["all"]) == set(extras["opacus"]) | set(extras["tf"]) | set(extras["plot"])
