"""The `lastiter` command line: JSON contract, one-line errors with exit status 2."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from conftest import cli_flags, strongly_convex

import lastiter_plugins as lp
from lastiter_plugins.cli import main

KWARGS = strongly_convex(sampling="shuffle_once")
PARAMS = cli_flags(KWARGS)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rdp_json(capsys):
    code, out, err = run(capsys, "rdp", "--bound", "ye-shokri-shuffle", "--orders", "2,4,8", *PARAMS, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["bound"] == "ye-shokri-shuffle" and data["orders"] == [2, 4, 8] and data["relation"] == "replace_one"
    assert data["rdp"] == pytest.approx(lp.rdp("ye-shokri-shuffle", [2, 4, 8], **KWARGS).tolist(), rel=1e-12)


def test_epsilon_json_names_the_winner(capsys):
    code, out, _ = run(capsys, "epsilon", "--bound", "best", "--delta", "1e-5", *PARAMS, "--json")
    assert code == 0
    data = json.loads(out)
    assert {"epsilon", "order", "delta", "relation", "bound", "winner"} <= set(data)
    assert data["bound"] == "best" and data["winner"] == "shifted-interpolation-shuffle"
    assert data["proof"] == "proven" and data["kind"] == "gdp"
    assert data["epsilon"] == pytest.approx(lp.epsilon("best", 1e-5, **KWARGS)[0])
    assert data["protects"] == "the final model only"


def test_epsilon_text_mentions_relation_and_threat_model(capsys):
    code, out, _ = run(capsys, "epsilon", "--bound", "ye-shokri-cyclic", "--delta", "1e-5", *PARAMS)
    assert code == 0 and "replace_one" in out and "final model only" in out


def test_bounds_table_and_json(capsys):
    code, out, _ = run(capsys, "bounds", *PARAMS, "--delta", "1e-5")
    assert code == 0
    assert "ye-shokri-shuffle" in out and "sampling must be one of poisson for liang-bounded" in out
    code, out, _ = run(capsys, "bounds", *PARAMS, "--delta", "1e-5", "--json")
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert set(rows) == set(lp.BOUND_IDS)
    assert rows["liang-bounded"]["applies"] is False and rows["liang-bounded"]["epsilon"] is None
    assert rows["ye-shokri-shuffle"]["epsilon"] == pytest.approx(lp.epsilon("ye-shokri-shuffle", 1e-5, **KWARGS)[0])


def test_calibrate(capsys):
    args = [a for a in PARAMS]
    i = args.index("--noise-multiplier")
    del args[i : i + 2]
    code, out, _ = run(
        capsys, "calibrate", "--bound", "best", "--target-epsilon", "3", "--delta", "1e-5", *args, "--json"
    )
    assert code == 0
    z = json.loads(out)["noise_multiplier"]
    assert lp.epsilon("best", 1e-5, **{**KWARGS, "noise_multiplier": z})[0] <= 3.0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["epsilon", "--bound", "nope", "--delta", "1e-5", *PARAMS], "invalid choice: 'nope'"),
        (["epsilon", "--bound", "best", "--delta", "2", *PARAMS], "delta must be in (0, 1). Found 2.0."),
        (["epsilon", "--bound", "best", "--delta", "1e-5"], "the following arguments are required"),
        (["epsilon", "--bound", "liang-bounded", "--delta", "1e-5", *PARAMS], "sampling must be one of poisson"),
        (["rdp", "--bound", "best", "--orders", "0.5,2", *PARAMS], "orders must be finite and > 1. Found 0.5."),
        (["rdp", "--bound", "best", "--orders", "a,b", *PARAMS], "orders must be comma-separated numbers"),
        (["rdp", "--bound", "best", "--orders", "2", *PARAMS, "--batch-size", "5000"], "batch_size must be <= dataset_size"),
        (["epsilon", "--bound", "best", "--delta", "1e-5", *PARAMS, "--noise-multiplier", "nan"],
         "noise_multiplier must be a finite number > 0. Found nan."),
        (["epsilon", "--bound", "best", "--delta", "1e-5", *PARAMS, "--steps", "1.5"], "invalid int value"),
        (["frobnicate"], "invalid choice"),
        ([], "required"),
    ],
    ids=lambda v: str(v)[:30],
)  # fmt: skip
def test_user_errors_exit_2_with_one_line(capsys, argv, fragment):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lastiter: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in err


def test_json_never_contains_nan_or_infinity(capsys):
    # a huge-RDP case whose epsilon may be infinite must still give strict JSON
    code, out, _ = run(
        capsys, "rdp", "--bound", "kong-ribero-curvature-free", "--orders", "2,10000", "--dataset-size", "10",
        "--batch-size", "10", "--noise-multiplier", "1e-300", "--steps", "10", "--sampling", "cyclic", "--json",
    )  # fmt: skip
    assert code == 0
    assert "NaN" not in out and "Infinity" not in out
    values = json.loads(out)["rdp"]
    assert all(v is None or math.isfinite(v) for v in values)


def test_console_script_entry_point_runs():
    proc = subprocess.run(
        [sys.executable, "-m", "lastiter_plugins.cli", "epsilon", "--bound", "best", "--delta", "1e-5", *PARAMS],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "final model only" in proc.stdout


def test_rdp_json_says_what_the_number_protects(capsys):
    code, out, err = run(capsys, "rdp", "--bound", "composition", "--orders", "2", *PARAMS, "--json")
    assert code == 0, err
    assert json.loads(out)["protects"] == "every iterate"
    code, out, _ = run(capsys, "rdp", "--bound", "ye-shokri-shuffle", "--orders", "2", *PARAMS, "--json")
    assert json.loads(out)["protects"] == "the final model only" and json.loads(out)["proof"] == "proven"


def test_renamed_clipping_flag_is_refused_naming_the_new_one(capsys):
    argv = [a for a in PARAMS if a != "--gradient-norms-within-clip"]
    code, _, err = run(capsys, "epsilon", "--bound", "best", "--delta", "1e-5", *argv, "--no-clipping")
    assert code == 2 and "--gradient-norms-within-clip" in err and err.count("\n") == 1


def test_unproven_bound_is_marked_in_the_bounds_table(capsys):
    argv = ["--dataset-size", "1000", "--batch-size", "10", "--noise-multiplier", "1", "--steps", "500",
            "--learning-rate", "0.5", "--smoothness", "1", "--diameter", "0.5", "--gradient-norms-within-clip",
            "--sampling", "random_batch"]  # fmt: skip
    code, out, err = run(capsys, "bounds", "--delta", "1e-5", *argv, "--json")
    assert code == 0, err
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert rows["altschuler-talwar"]["proof"].startswith("unproven: ") and rows["altschuler-talwar"]["epsilon"] is None
    assert rows["best"]["winner"] != "altschuler-talwar"
    code, out, _ = run(capsys, "bounds", "--delta", "1e-5", *argv, "--json", "--unproven", "altschuler-talwar")
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert rows["altschuler-talwar"]["epsilon"] is not None
