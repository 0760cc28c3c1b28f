"""Packaging: what the distribution ships, its metadata, and that it installs next to the user's stack.

The distribution ships the adapters as ``lastiter_plugins.adapters`` and never a top-level
``adapters``; ``python -m build`` makes an sdist and a wheel that ``twine check`` accepts;
the published requirements are ranges (exact test versions live in constraints/); and the
wheel with the ``opacus`` extra installs into an environment that already has torch without
touching it.
"""

from __future__ import annotations

import ast
import email
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

import lastiter_plugins as lp
from tests.support import ROOT

# Builds the sdist and the wheel and installs them into fresh environments (a minute or two):
# scripts/test_environments.sh runs it, the second step of .ci/run, not the README's test command.
pytestmark = pytest.mark.packaging

# Tested host releases that the published ranges must admit (constraints/ci.txt,
# constraints/opacus15.txt, constraints/dpa06.txt).
TESTED = {
    "opacus": ["1.5.4", "1.6.0"],
    "dp-accounting": ["0.4.3", "0.6.0"],
    "tensorflow": ["2.14.1"],
    "tensorflow-privacy": ["0.9.0"],
    "tensorflow-probability": ["0.22.1"],
    "numpy": ["1.26.4"],
}
# Exact pins allowed in the published requirements: only ones a host forces, each
# commented in pyproject.toml. None today.
FORCED_EXACT_PINS: set[str] = set()


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _python(code: str, cwd: Path, path: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(path)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=False)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _project() -> dict:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_norm(name)] = version
    return pins


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
def dists(tmp_path_factory) -> dict[str, Path]:
    """`python -m build`: the sdist, then the wheel built from it, in an isolated build environment."""
    pytest.importorskip("build", reason="needs the dev extra (build)")
    out = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)])
    (wheel,) = out.glob("lastiter_plugins-*.whl")
    (sdist,) = out.glob("lastiter_plugins-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


@pytest.fixture(scope="module")
def wheel(dists) -> Path:
    return dists["wheel"]


@pytest.fixture(scope="module")
def wheel_metadata(wheel) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_string(zf.read(name).decode())


def test_wheel_contents(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "lastiter_plugins/adapters/__init__.py" in names
    for host in ("opacus", "tf_privacy", "dp_accounting", "jax_privacy"):  # one subpackage per host
        assert f"lastiter_plugins/adapters/{host}/__init__.py" in names, host
    assert "lastiter_plugins/adapters/opacus/_internals.py" in names
    assert "lastiter_plugins/py.typed" in names
    assert "lastiter_plugins/bounds/sgm.py" in names
    assert "lastiter_plugins/lower_end/exact.py" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    top_level = {n.split("/")[0] for n in names}
    assert "adapters" not in top_level
    # every module of the source tree ships (a subpackage left out of [tool.setuptools] packages is lost)
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "lastiter_plugins").rglob("*.py")}
    assert modules - set(names) == set()
    assert not any(n.startswith(("tests/", "examples/")) for n in names)


def test_sdist_contents(dists):
    with tarfile.open(dists["sdist"]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    for needed in (
        "LICENSE",
        "README.md",
        "pyproject.toml",
        "lastiter_plugins/adapters/opacus/__init__.py",
        "lastiter_plugins/py.typed",
    ):
        assert needed in names, needed


def test_twine_check_passes(dists):
    """The metadata check PyPI's upload tool runs (long description renders, required fields present)."""
    pytest.importorskip("twine", reason="needs the dev extra (twine)")
    proc = _run([sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]), str(dists["wheel"])])
    assert proc.stdout.count("PASSED") == 2, proc.stdout


def test_release_metadata(wheel_metadata):
    md = wheel_metadata
    assert md["Name"] == "lastiter-plugins"
    assert md["License-Expression"] == "Apache-2.0"
    assert md.get_all("License-File") == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    classifiers = md.get_all("Classifier")
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX expression says it
    # No public home yet: no project URLs (placeholders would send users nowhere). Add the real ones here too.
    assert md.get_all("Project-URL") is None
    assert md["Description-Content-Type"] == "text/markdown"
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


def test_version_has_one_source_and_a_changelog_section(wheel_metadata):
    """The wheel's version is lastiter_plugins.__version__ (pyproject reads it), the installed one too, and
    the changelog's first released section is that version, dated, below an "Unreleased" section."""
    import lastiter_plugins

    assert wheel_metadata["Version"] == lastiter_plugins.__version__ == metadata.version("lastiter-plugins")
    assert "version" not in _project()
    sections = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert sections[0] == "Unreleased"
    assert re.fullmatch(rf"{re.escape(lastiter_plugins.__version__)} - \d{{4}}-\d{{2}}-\d{{2}}", sections[1]), sections[
        1
    ]


def test_published_requirements_are_ranges(wheel_metadata):
    """No exact pins (those belong in constraints/), no torch at all, and every tested host release admitted."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in wheel_metadata.get_all("Requires-Dist")]
    exact = {_norm(r.name) for r in reqs for s in r.specifier if s.operator in ("==", "===")}
    assert exact <= FORCED_EXACT_PINS, f"exact pins in the published requirements: {sorted(exact)}"
    assert "torch" not in {_norm(r.name) for r in reqs}, "torch comes with the user's Opacus"
    for r in reqs:
        if r.marker is not None and str(r.marker) == 'extra == "jax"':
            # tested in .venv-jax only (dp-accounting 0.6, numpy 2): constraints/jax.txt, within these ranges
            # (test_constraints_satisfy_the_published_ranges)
            continue
        for version in TESTED.get(_norm(r.name), []):
            assert r.specifier.contains(version), f"{r} excludes the tested {r.name} {version}"
    opacus = [r for r in reqs if _norm(r.name) == "opacus" and r.marker and r.marker.evaluate({"extra": "opacus"})]
    assert len(opacus) == 1


def test_opacus_range_is_what_the_adapter_version_guard_accepts(wheel_metadata):
    """The published opacus range admits exactly the minor versions the adapter's guard accepts: a later
    Opacus must be refused by pip at install time, not by the adapter at register()."""
    pytest.importorskip("opacus")
    from packaging.requirements import Requirement

    from lastiter_plugins.adapters.opacus._internals import TESTED_OPACUS, require_tested_opacus

    reqs = [Requirement(r) for r in wheel_metadata.get_all("Requires-Dist")]
    for extra in ("opacus", "all"):
        (opacus,) = [r for r in reqs if _norm(r.name) == "opacus" and r.marker.evaluate({"extra": extra})]
        for minor in [f"1.{m}" for m in range(12)] + ["2.0"]:
            for version in (f"{minor}.0", f"{minor}.9"):
                assert opacus.specifier.contains(version) == (minor in TESTED_OPACUS), (extra, str(opacus), version)
                guard_accepts = True
                try:
                    require_tested_opacus(version)
                except lp.UnsupportedHostError:
                    guard_accepts = False
                assert opacus.specifier.contains(version) == guard_accepts, (extra, str(opacus), version)


def _imported_distributions(path: Path) -> set[str]:
    """The distributions whose top-level modules ``path`` imports (stdlib and this package left out)."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    modules -= set(sys.stdlib_module_names) | {"lastiter_plugins", "__future__"}
    owners = metadata.packages_distributions()
    missing = sorted(m for m in modules if m not in owners)
    assert not missing, f"{path.name} imports modules no installed distribution provides: {missing}"
    return {_norm(dist) for m in modules for dist in owners[m]}


def _closure(requirements: list[str]) -> set[str]:
    """The installed distributions that ``requirements`` bring in (their own requirements followed)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if (req.marker and not req.marker.evaluate({"extra": ""})) or _norm(req.name) in seen:
            continue
        seen.add(_norm(req.name))
        todo += [Requirement(r) for r in metadata.requires(req.name) or []]
    return seen


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_every_example_needs_only_its_host_extra_and_examples(example):
    """`pip install "lastiter-plugins[opacus,examples]"` (tf_privacy_*: `[tf,examples]`, jax_privacy_*: `[jax]`)
    installs what each example imports: the README says so. Checked against the installed requirement graph (the
    jax_privacy example in .venv-jax: scripts/test_jax.sh)."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    host = {"opacus": "opacus", "tf": "tf", "jax": "jax"}.get(example.name.split("_")[0])
    if host == "jax" and importlib.util.find_spec("jax_privacy") is None:
        pytest.skip("needs jax_privacy installed (the jax extra's environment, .venv-jax) to resolve its imports")
    # the jax_privacy example draws its data with numpy: its extra alone (it runs in .venv-jax, without scikit-learn)
    declared = project["dependencies"] + (extras["examples"] if host != "jax" else []) + (extras[host] if host else [])
    missing = _imported_distributions(example) - _closure(declared)
    assert not missing, f"{example.name} imports {sorted(missing)}, which [{host or ''},examples] does not install"
    readme = (ROOT / "README.md").read_text()
    assert 'pip install "lastiter-plugins[opacus,examples]"' in readme


def test_constraints_satisfy_the_published_ranges():
    """Each constraints file pins every range pyproject declares (that the env installs) to a version inside it."""
    import tomllib
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    envs = {
        "ci.txt": project["dependencies"] + extras["all"] + extras["dev"],
        "opacus15.txt": project["dependencies"] + extras["opacus"],
        "dpa06.txt": project["dependencies"],
        "jax.txt": project["dependencies"] + extras["jax"],
    }
    for filename, requirements in envs.items():
        pins = _pins(ROOT / "constraints" / filename)
        for text in requirements:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate():
                continue
            assert _norm(req.name) in pins, f"constraints/{filename} does not pin {req.name}"
            assert req.specifier.contains(pins[_norm(req.name)], prereleases=True), (filename, text)
    ci = _pins(ROOT / "constraints" / "ci.txt")
    assert ci["torch"].endswith("+cpu"), "CI installs the CPU torch build"
    assert _pins(ROOT / "constraints" / "opacus15.txt")["opacus"].startswith("1.5.")


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    commands = readme.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(commands) == 2
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"cmd='{commands[1]}'" in ci
    assert "-c constraints/ci.txt" in commands[1]
    assert "-c " not in commands[0]  # the light command resolves like a user's install


def test_wheel_installs_and_imports(wheel, tmp_path):
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)])
    assert not (target / "adapters").exists()
    proc = _python(
        "import lastiter_plugins, lastiter_plugins.adapters as a; print(lastiter_plugins.__file__); print(a.__file__)",
        cwd=tmp_path,
        path=[str(target)],
    )
    assert proc.returncode == 0, proc.stderr
    for line in proc.stdout.split():
        assert line.startswith(str(target)), line


# What the user's environment must not lose: their torch. Left out of the overlay: what
# the test installs (opacus, this package) and what would shadow the new environment.
_NOT_OVERLAID = re.compile(r"^(opacus|lastiter_plugins|__editable__|_lastiter|pip|_distutils_hack|__pycache__)|\.pth$")


def test_opacus_extra_keeps_the_installed_torch(wheel, tmp_path):
    """pip install WHEEL[opacus] into an environment that has torch but no Opacus keeps that torch.

    The environment is a fresh venv that sees this one's packages (torch, numpy, scipy,
    dp-accounting, ...; not Opacus, not this package) through a .pth file, as a user's
    environment with their own torch build. The newest torch on the index is another
    release (a multi-GB CUDA build on Linux): the resolver must keep the installed one.
    A dry run with a report comes first, so a regression fails without downloading torch.
    """
    try:
        torch_dist = metadata.distribution("torch")
    except metadata.PackageNotFoundError:
        pytest.skip("needs torch installed (the opacus extra's environment)")
    site = Path(torch_dist.locate_file("")).resolve()
    overlay = tmp_path / "user-stack"
    overlay.mkdir()
    for entry in site.iterdir():
        if not _NOT_OVERLAID.search(entry.name):
            (overlay / entry.name).symlink_to(entry)

    env = tmp_path / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env)])
    python = str(env / "bin" / "python")
    purelib = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(purelib, "user-stack.pth").write_text(f"{overlay}\n")
    probe = (
        "import importlib.metadata as m, importlib.util as u; print(m.version('torch'), u.find_spec('opacus') is None)"
    )
    assert _run([python, "-c", probe], cwd=tmp_path).stdout.split() == [torch_dist.version, "True"]

    # Opacus at the tested CI release (reproducible); torch deliberately unconstrained.
    constraints = tmp_path / "opacus.txt"
    constraints.write_text(f"opacus=={_pins(ROOT / 'constraints' / 'ci.txt')['opacus']}\n")
    pip_env = {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV")}
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "-c", str(constraints)]
    requirement = f"lastiter-plugins[opacus] @ {wheel.as_uri()}"

    report = tmp_path / "dry-run.json"
    _run([*pip, "--dry-run", "--report", str(report), requirement], env=pip_env, cwd=tmp_path)
    planned = {
        _norm(item["metadata"]["name"]): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "torch" not in planned, f"pip would replace the installed torch {torch_dist.version}: {planned}"
    assert not any(n.startswith(("nvidia-", "triton")) for n in planned), planned
    assert {"lastiter-plugins", "opacus"} <= set(planned), planned

    _run([*pip, requirement], env=pip_env, cwd=tmp_path)
    assert not list(Path(purelib).glob("torch*")), "torch was installed into the environment"
    proc = _run(
        [
            python,
            "-c",
            "import torch, opacus, lastiter_plugins.adapters.opacus as a; print(torch.__version__, torch.__file__, a.__name__)",
        ],
        cwd=tmp_path,
    )
    version, torch_file, adapter = proc.stdout.split()
    assert version == torch_dist.version
    assert torch_file.startswith(str(overlay)), torch_file
    assert adapter == "lastiter_plugins.adapters.opacus"


def test_all_extra_is_the_union_of_the_host_extras():
    """`all` is spelled out (pip cannot resolve a self-referencing extra with -e ".[all,dev]"): keep it in sync."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras["all"]) == set(extras["opacus"]) | set(extras["tf"]) | set(extras["plot"]) | set(
        extras["examples"]
    )
    # jax_privacy needs dp-accounting >= 0.6 and numpy 2, which TF Privacy 0.9 forbids: never in `all`
    assert (
        not {r.split(">")[0].split("<")[0] for r in extras["jax"]}
        & {"jax-privacy", "jax", "keras"}
        & {r.split(">")[0].split("<")[0] for r in extras["all"]}
    )
