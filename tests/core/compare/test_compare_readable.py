"""`lastiter compare` as a person reads it (issue 21, requirement 2).

Short lines, the first failed condition of each row that does not apply, the citations
once, "> 1e4" for an epsilon too large to mean anything (JSON and CSV keep the number),
host-library log output only with --verbose, one marker per plotted row, and a first run
that ends by saying how to go on. CLI tests run the installed console script.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lastiter_plugins import api, compare, evaluation, plot, registry, scenarios
from lastiter_plugins.cli import NEXT_STEPS
from lastiter_plugins.compare.rows import STANDARD
from tests.support import ROOT

LASTITER = Path(sys.executable).with_name("lastiter")  # installed by `pip install -e .` next to the interpreter
SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.toml"))
POISSON = next(p for p in SCENARIOS if p.stem == "poisson-opacus-smooth-network")
MAX_LINE = 250


def lastiter(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    assert LASTITER.is_file(), f"the console script is not installed next to {sys.executable}"
    return subprocess.run([str(LASTITER), *map(str, argv)], capture_output=True, text=True, check=False, env=env)


@pytest.fixture(scope="module")
def first_run() -> subprocess.CompletedProcess:
    proc = lastiter("compare")
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def builtin() -> compare.Comparison:
    name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    return compare.compare(delta, name=name, **params)


@pytest.fixture(scope="module")
def poisson() -> compare.Comparison:
    name, params, delta = scenarios.split_scenario(scenarios.load_scenario(POISSON))
    return compare.compare(delta, name=name, **params)


def _long_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > MAX_LINE]


# ---------------------------------------------------------------- short lines


def test_first_run_has_no_line_over_250_characters(first_run):
    assert not _long_lines(first_run.stdout + first_run.stderr)


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_example_scenario_has_no_line_over_250_characters(path):
    proc = lastiter("compare", "--config", path)
    assert proc.returncode == 0, proc.stderr
    assert not _long_lines(proc.stdout + proc.stderr)


# ---------------------------------------------------------------- numbers too large to mean anything


def test_epsilon_above_1e4_is_shown_as_such_in_table_and_markdown(builtin):
    huge = [r for r in builtin.rows if r.epsilon is not None and r.epsilon > 1e4]
    assert {"kong-ribero-bounded", "kong-ribero-curvature-free"} <= {r.id for r in huge}
    table, markdown = compare.format_table(builtin, explain=True), compare.format_markdown(builtin)
    for i, row in enumerate(builtin.rows, start=1):
        if row in huge:
            line = next(x for x in table.splitlines() if x.startswith(f"{row.id} [{i}] "))
            assert "> 1e4" in line and f"{row.epsilon:.4g}" not in line, line
            md = next(x for x in markdown.splitlines() if x.startswith(f"| `{row.id}`"))
            assert "> 1e4" in md and f"{row.epsilon:.4g}" not in md, md
    assert "e+0" not in table  # no number in scientific notation left for a person to decode


def test_json_and_csv_keep_the_real_number(builtin):
    huge = {r.id: r.epsilon for r in builtin.rows if r.epsilon is not None and r.epsilon > 1e4}
    assert huge
    rows = {r["id"]: r for r in json.loads(compare.format_comparison(builtin, "json"))["rows"]}
    for row_id, eps in huge.items():
        assert rows[row_id]["epsilon"] == eps
    for record in csv.DictReader(io.StringIO(compare.format_csv(builtin))):
        if record["id"] in huge:
            assert float(record["epsilon"]) == huge[record["id"]]


# ---------------------------------------------------------------- one line per row that does not apply


def _first_unmet(comparison: compare.Comparison, bound: str) -> registry.Unmet:
    config, assumptions = api.build(**comparison.params)
    found = evaluation.evaluate_bound(registry.get_spec(bound), config, assumptions, under_own_relation=True)
    assert not found.applies and found.unmet
    return found.unmet[0]


@pytest.mark.parametrize("which", ["builtin", "poisson"])
def test_a_row_that_does_not_apply_is_one_line_naming_its_first_failed_condition(request, which):
    comparison = request.getfixturevalue(which)
    # --all: every row listed (by default the bounds that do not apply are counted in one line)
    lines = compare.format_table(comparison, every_row=True, explain=True).split("\nReferences:\n")[0].splitlines()
    checked = 0
    for i, row in enumerate(comparison.rows, start=1):
        if row.valid or row.id not in registry.BOUNDS:
            continue
        first = _first_unmet(comparison, row.id)
        mine = [x for x in lines if x.strip().startswith(f"[{i}] {row.id}:")]
        assert mine == [f"  [{i}] {row.id}: {first.short}"], mine
        assert len(mine[0]) <= 130
        checked += 1
    assert checked >= 10


def test_the_first_failed_condition_is_the_first_not_all_of_them(poisson):
    table = compare.format_table(poisson, every_row=True, explain=True).split("\nReferences:\n")[0]
    at = next(x for x in table.splitlines() if re.match(r"\s*\[\d+\] altschuler-talwar: ", x))
    # clipping is the first failed condition here; the step-size limit, also violated, is in JSON only
    assert "gradient_norms_within_clip or clipped_loss_convex_smooth (found " in at
    assert "learning_rate" not in at
    assert any("learning_rate must be <=" in w for w in poisson.row("altschuler-talwar").why_not)
    kr = next(x for x in table.splitlines() if re.match(r"\s*\[\d+\] kong-ribero-cyclic: ", x))
    assert kr.endswith("kong-ribero-cyclic: sampling must be one of cyclic, shuffle_once (found poisson)")


def test_full_error_messages_keep_the_explanation():
    config, assumptions = api.build(**dict(scenarios.split_scenario(scenarios.load_scenario(POISSON))[1]))
    reason = registry.applicability(registry.get_spec("ye-shokri-convex"), config, assumptions).reason
    assert "gradient_norms_within_clip or clipped_loss_convex_smooth" in reason
    assert "does not hold for clipped gradients in general" in reason and "arXiv 2203.05363" in reason


# ---------------------------------------------------------------- citations once


def _shown(comparison: compare.Comparison, every_row: bool) -> list[compare.Row]:
    """The rows the table lists: by default the bounds that do not apply are only counted."""
    return [r for r in comparison.rows if every_row or r.valid or r.kind == STANDARD]


@pytest.mark.parametrize("every_row", [False, True], ids=["default", "all"])
@pytest.mark.parametrize("which", ["builtin", "poisson"])
def test_references_block_lists_each_citation_once(request, which, every_row):
    comparison = request.getfixturevalue(which)
    table = compare.format_table(comparison, every_row=every_row, explain=True)
    shown = _shown(comparison, every_row)
    assert every_row or len(shown) < len(comparison.rows)
    assert "\nReferences:\n" in table
    flat = " ".join(table.split())  # references are wrapped
    for reference in {r.reference for r in shown}:
        assert flat.count(" ".join(reference.split())) == 1, reference
    references = table.split("\nReferences:\n", 1)[1]
    numbers = [int(m) for m in re.findall(r"^  \[(\d+)\] ", references, flags=re.M)]
    assert numbers == list(range(1, len(shown) + 1))


@pytest.mark.parametrize("every_row", [False, True], ids=["default", "all"])
def test_markdown_lists_each_citation_once(builtin, every_row):
    markdown = compare.format_markdown(builtin, every_row=every_row)
    for reference in {r.reference for r in _shown(builtin, every_row)}:
        assert markdown.count(reference.replace("|", "\\|")) == 1, reference


def test_json_and_csv_conditions_do_not_repeat_the_reference(poisson):
    """Each row cites its reference once, in its own field; its conditions say what failed, not the theorem."""
    rows = json.loads(compare.format_comparison(poisson, "json"))["rows"]
    failing = [r for r in rows if r["why_not"] and r["id"] in registry.BOUNDS]
    assert len(failing) >= 10 and any(len(r["why_not"]) >= 2 for r in failing)
    for row in failing:
        assert row["reference"] == registry.BOUNDS[row["id"]].reference
        assert all(row["reference"] not in condition and " for " + row["id"] not in condition
                   for condition in row["why_not"]), row  # fmt: skip
    records = {r["id"]: r for r in csv.DictReader(io.StringIO(compare.format_csv(poisson)))}
    for row in failing:
        assert records[row["id"]]["why_not"] == " ".join(row["why_not"])


# ---------------------------------------------------------------- host library log output

# A host library logging through absl while compare runs: dp-accounting's ``compute_epsilon`` (every
# RDP conversion of the library calls it) is made to log one line per call, so the test exercises the
# real logging path (absl -> Python logging) through the console script. (The hook used to wrap the
# fractional-order series, which dp-accounting >= 0.5 logs about when it does not converge; the library
# now sums that series itself, vectorised, so the series is no longer dp-accounting's to log.)
_SITECUSTOMIZE = """
from absl import logging
from dp_accounting.rdp import rdp_privacy_accountant as _rdp

_original = _rdp.compute_epsilon


def compute_epsilon(orders, rdp, delta):
    logging.warning("compute_epsilon called by the host hook with %d orders", len(orders))
    return _original(orders, rdp, delta)


_rdp.compute_epsilon = compute_epsilon
"""
# A custom comparison (cheap: one epoch); its RDP rows convert through dp-accounting's compute_epsilon.
_CUSTOM = (
    "compare",
    "--dataset-size", "1000000",
    "--batch-size", "10",
    "--noise-multiplier", "0.8",
    "--sampling", "shuffle_once",
    "--epochs", "1",
)  # fmt: skip


@pytest.fixture(scope="module")
def logging_env(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("hook")
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))}


def test_host_log_is_hidden_by_default_and_shown_with_verbose(logging_env):
    quiet = lastiter(*_CUSTOM, env=logging_env)
    assert quiet.returncode == 0, quiet.stderr
    assert "called by the host hook" not in quiet.stdout + quiet.stderr
    hidden = re.search(r"\((\d+) host library log records hidden; --verbose shows them\.\)", quiet.stdout)
    assert hidden and int(hidden.group(1)) > 0, quiet.stdout[-500:]
    loud = lastiter(*_CUSTOM, "--verbose", env=logging_env)
    assert loud.returncode == 0, loud.stderr
    records = [x for x in loud.stdout.splitlines() if "compute_epsilon called by the host hook" in x]
    assert len(records) == int(hidden.group(1))
    assert all(x.startswith("  WARNING absl: ") for x in records)
    assert "called by the host hook" not in loud.stderr


def test_host_log_capture_restores_the_root_logger():
    import logging

    root = logging.getLogger()
    before = root.handlers[:]
    with compare.host_log() as lines:
        logging.getLogger("absl").warning("from a host")
        with compare.host_log() as inner:
            logging.getLogger("opacus").warning("nested")
    assert root.handlers == before
    assert inner is lines and lines == ["WARNING absl: from a host", "WARNING opacus: nested"]


# ---------------------------------------------------------------- plot markers


def test_every_plotted_row_has_its_own_marker():
    pytest.importorskip("matplotlib")
    config, _ = api.build(**scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)[1])
    epochs = np.arange(1.0, 6.0)
    curves = [
        plot.Curve(
            f"row-{k}",
            "replace_one",
            "the final model only" if k % 2 else "every iterate",
            k % 3 != 0,  # valid and NOT valid rows both get markers
            "last-iterate bound" if k % 2 else "composition",
            (k + 1.0) * epochs,
        )
        for k in range(30)
    ]
    fig = plot.figure_epsilon_vs_epochs(epochs, curves, config=config, delta=1e-5)
    markers = [str(line.get_marker()) for line in fig.axes[0].get_lines()]
    assert len(markers) == len(curves)
    assert "None" not in markers and len(set(markers)) == len(markers), markers


# ---------------------------------------------------------------- how to go on


def test_first_run_ends_with_how_to_compare_your_own_pipeline(first_run):
    last = first_run.stdout.rstrip("\n").splitlines()[-1:]
    assert last == list(NEXT_STEPS)
    assert "--config" in last[0] and "examples/scenarios/" in last[0] and "--dataset-size" in last[0]
    assert "docs/choosing.md" in last[0]
    assert ROOT.joinpath("docs", "choosing.md").is_file()


def test_a_custom_comparison_does_not_repeat_the_first_run_hint():
    proc = lastiter("compare", "--config", POISSON)
    assert proc.returncode == 0, proc.stderr
    assert NEXT_STEPS[0] not in proc.stdout


# ---------------------------------------------------------------- the answer first (issue 41)


def test_the_first_screen_is_the_answer(builtin):
    screen = compare.format_table(builtin).splitlines()
    assert len(screen) <= 28, "\n".join(screen)
    answer = next(i for i, line in enumerate(screen) if line.startswith("epsilon = "))
    assert answer <= 6 and screen[answer].startswith("epsilon = 1.359 at delta = 1e-05 for the final model only")
    head = "\n".join(screen[answer : answer + 8])
    assert "From shifted-interpolation-shuffle: derived here (docs/derivations/" in head
    assert "Published theorems only: 4.728 (kong-ribero-cyclic)" in head
    assert "opacus-rdp 1.035" in head and "NOT VALID here" in head  # the host's number, and that it is not valid
    for jargon in (r"\border\b", "mu-GDP", r"\bG4\b", "joint convexity", r"\bours\b", "UNPROVEN"):
        assert not re.search(jargon, "\n".join(screen)), jargon
    proof_words = {line.split("  ")[-1].split(" (")[0].strip() for line in screen if " [" in line.split("  ")[0]}
    assert proof_words <= {"published", "derived here", "unproven"}, proof_words
    assert "derived here (a)" in "\n".join(screen)  # the reason a published theorem is derived here, with the row
    assert any(
        line.startswith("(a) a published theorem, derived here: this pipeline has a projection") for line in screen
    )
    explained = compare.format_table(builtin, explain=True)
    assert explained.startswith("\n".join(screen[: answer + 3])) and "\nReferences:\n" in explained
    assert "ye-shokri-shuffle [2]: derived here (a projection the theorem does not have" in explained


def test_every_row_has_a_provenance_in_one_vocabulary(builtin, poisson):
    for comparison in (builtin, poisson):
        for row in comparison.rows:
            assert row.provenance.split(" ")[0].rstrip(":") in {"published", "derived", "unproven"}, row
            assert registry.provenance_word(row.provenance, row.proof == "proven") in {
                "published", "derived here", "unproven"
            }  # fmt: skip
    gdp = builtin.row("opacus-gdp")
    assert gdp.provenance.startswith("unproven: ") and "approximation" in gdp.provenance
