"""The `lastiter` command line: JSON contract, one-line errors with exit status 2."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import lastiter_plugins as lp
from lastiter_plugins import compare, scenarios
from lastiter_plugins.cli import build_parser, main
from tests.support import ROOT, cli_flags, strongly_convex

# a projection: a strongly convex loss with every gradient within the clip exists only on a bounded domain
# (lam D / 2 = 0.5 <= C = 1; lastiter_plugins.feasibility)
KWARGS = strongly_convex(sampling="shuffle_once", diameter=10.0)
PARAMS = cli_flags(KWARGS)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rdp_json(capsys):
    code, out, err = run(
        capsys, "rdp", "--bound", "ye-shokri-shuffle", "--orders", "2,4,8", *PARAMS, "--format", "json"
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["bound"] == "ye-shokri-shuffle" and data["orders"] == [2, 4, 8] and data["relation"] == "replace_one"
    assert data["rdp"] == pytest.approx(lp.rdp("ye-shokri-shuffle", [2, 4, 8], **KWARGS).tolist(), rel=1e-12)


def test_epsilon_json_names_the_winner(capsys):
    code, out, _ = run(capsys, "epsilon", "--bound", "best", "--delta", "1e-5", *PARAMS, "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert {"epsilon", "order", "delta", "relation", "bound", "winner"} <= set(data)
    assert data["bound"] == "best" and data["winner"] == "shifted-interpolation-shuffle"
    assert data["proof"] == "proven" and data["kind"] == "gdp"
    assert data["epsilon"] == pytest.approx(lp.epsilon("best", 1e-5, **KWARGS).epsilon)
    assert data["protects"] == "the final model only"


def test_epsilon_text_mentions_relation_and_threat_model(capsys):
    code, out, _ = run(capsys, "epsilon", "--bound", "ye-shokri-cyclic", "--delta", "1e-5", *PARAMS)
    assert code == 0 and "replace_one" in out and "final model only" in out


def test_bounds_table_and_json(capsys):
    code, out, _ = run(capsys, "bounds", *PARAMS, "--delta", "1e-5")
    assert code == 0
    assert "ye-shokri-shuffle" in out
    liang = next(line for line in out.splitlines() if line.startswith("liang-bounded ["))
    assert liang.endswith("sampling must be poisson (found shuffle_once)")  # short, without the theorem
    assert liang.split()[-1] == "shuffle_once)" and "provenance" not in liang
    for reference in {spec.reference for spec in lp.BOUNDS.values()}:  # each cited once, at the end
        assert " ".join(out.split()).count(" ".join(reference.split())) == 1, reference
    code, out, _ = run(capsys, "bounds", *PARAMS, "--delta", "1e-5", "--format", "json")
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert set(rows) == set(lp.BOUND_IDS)
    assert rows["liang-bounded"]["applies"] is False and rows["liang-bounded"]["epsilon"] is None
    reason = rows["liang-bounded"]["reason"]  # in full (why a condition is needed), without the theorem
    assert reason == "sampling must be poisson (found shuffle_once)"  # in full, without the theorem
    assert "Liang" not in reason
    assert rows["liang-bounded"]["reference"] == lp.BOUNDS["liang-bounded"].reference
    assert rows["ye-shokri-shuffle"]["epsilon"] == pytest.approx(
        lp.epsilon("ye-shokri-shuffle", 1e-5, **KWARGS).epsilon
    )


def test_calibrate(capsys):
    args = [a for a in PARAMS]
    i = args.index("--noise-multiplier")
    del args[i : i + 2]
    code, out, _ = run(
        capsys, "calibrate", "--bound", "best", "--target-epsilon", "3", "--delta", "1e-5", *args, "--format", "json"
    )
    assert code == 0
    z = json.loads(out)["noise_multiplier"]
    assert lp.epsilon("best", 1e-5, **{**KWARGS, "noise_multiplier": z}).epsilon <= 3.0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["epsilon", "--bound", "nope", "--delta", "1e-5", *PARAMS], "argument --bound: must be one of kong-ribero"),
        (["calibrate", "--bound", "nope", "--target-epsilon", "1", *PARAMS], "Found 'nope'."),
        (["advise", "--top", "0", *PARAMS], "argument --top: must be an integer >= 1. Found '0'."),
        (["advise", "--top", "-1", *PARAMS], "argument --top: must be an integer >= 1. Found '-1'."),
        (["advise", "--top", "-2", *PARAMS], "argument --top: must be an integer >= 1. Found '-2'."),
        (["advise", "--top", "two", *PARAMS], "argument --top: must be an integer >= 1. Found 'two'."),
        (["calibrate", "--target-epsilon", "0", *PARAMS], "target_epsilon"),
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


#: issue 38: argparse answered "expected one argument" for a value that starts with '-' unless it looks like -3
_NEGATIVE = [
    ("--noise-multiplier", "-inf", "noise_multiplier must be a finite number > 0. Found -inf."),
    ("--sigma", "-1e-5", "noise_multiplier must be a finite number > 0. Found -1e-05."),
    ("--delta", "-1e-5", "delta must be in (0, 1). Found -1e-05."),
    ("--delta", "-inf", "delta must be in (0, 1). Found -inf."),
    ("--learning-rate", "-3", "learning_rate must be a finite number > 0. Found -3.0."),
    ("--dataset-size", "-3", "dataset_size must be an integer >= 1. Found -3."),
    ("--diameter", "-1e-5", "diameter must be a finite number > 0. Found -1e-05."),
    ("--strong-convexity", "-inf", "strong_convexity must be a finite number >= 0. Found -inf."),
]
_SUBCOMMANDS = {  # each subcommand with what it needs besides the pipeline
    "rdp": ["--orders", "2,4"],
    "epsilon": [],
    "bounds": ["--delta", "1e-5"],
    "calibrate": ["--target-epsilon", "1"],
    "advise": [],
    "compare": [],
}


@pytest.mark.parametrize("command", _SUBCOMMANDS)
@pytest.mark.parametrize(("flag", "value", "message"), _NEGATIVE, ids=[f"{f}{v}" for f, v, _ in _NEGATIVE])
def test_negative_values_reach_the_librarys_check_on_every_subcommand(capsys, command, flag, value, message):
    if flag == "--delta" and command == "rdp":
        pytest.skip("rdp has no --delta")
    if flag in ("--noise-multiplier", "--sigma") and command == "calibrate":
        pytest.skip("calibrate finds the noise multiplier: a given one is not used")
    code, out, err = run(capsys, command, *_SUBCOMMANDS[command], *PARAMS, flag, value)  # the last one counts
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0] == f"lastiter: error: {message}"


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["rdp", "--orders", "-2,4"], "orders must be finite and > 1. Found -2."),
     (["calibrate", "--target-epsilon", "-1e-5"], "target_epsilon must be a finite number > 0. Found -1e-05."),
     (["advise", "--top", "-3"], "argument --top: must be an integer >= 1. Found '-3'."),
     (["epsilon", "--gradient-norms-within-clip", "-3"], "ignored explicit argument '-3'")],
    ids=["orders", "target-epsilon", "top", "boolean-flag"],
)  # fmt: skip
def test_negative_values_of_the_subcommands_own_options_name_the_value(capsys, argv, message):
    code, out, err = run(capsys, *argv, *PARAMS)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and message in lines[0], err


def test_json_never_contains_nan_or_infinity(capsys):
    # a huge-RDP case whose epsilon may be infinite must still give strict JSON
    code, out, _ = run(
        capsys, "rdp", "--bound", "kong-ribero-curvature-free", "--orders", "2,10000", "--dataset-size", "10",
        "--batch-size", "10", "--noise-multiplier", "1e-300", "--steps", "10", "--sampling", "cyclic", "--format", "json",
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
    code, out, err = run(capsys, "rdp", "--bound", "composition", "--orders", "2", *PARAMS, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["protects"] == "every iterate"
    code, out, _ = run(capsys, "rdp", "--bound", "ye-shokri-shuffle", "--orders", "2", *PARAMS, "--format", "json")
    assert json.loads(out)["protects"] == "the final model only" and json.loads(out)["proof"] == "proven"


def test_renamed_clipping_flag_is_refused_naming_the_new_one(capsys):
    argv = [a for a in PARAMS if a != "--gradient-norms-within-clip"]
    code, _, err = run(capsys, "epsilon", "--bound", "best", "--delta", "1e-5", *argv, "--no-clipping")
    assert code == 2 and "--gradient-norms-within-clip" in err and err.count("\n") == 1


def test_unproven_bound_is_marked_in_the_bounds_table(capsys):
    argv = ["--dataset-size", "1000", "--batch-size", "10", "--noise-multiplier", "1", "--steps", "500",
            "--learning-rate", "0.5", "--smoothness", "1", "--diameter", "0.5", "--gradient-norms-within-clip",
            "--sampling", "random_batch"]  # fmt: skip
    code, out, err = run(capsys, "bounds", "--delta", "1e-5", *argv, "--format", "json")
    assert code == 0, err
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert rows["altschuler-talwar"]["proof"].startswith("unproven: ") and rows["altschuler-talwar"]["epsilon"] is None
    assert rows["best"]["winner"] != "altschuler-talwar"
    code, out, _ = run(
        capsys, "bounds", "--delta", "1e-5", *argv, "--format", "json", "--unproven", "altschuler-talwar"
    )
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert rows["altschuler-talwar"]["epsilon"] is not None


# ---------------------------------------------------------------- parity with the API (the installed console script)

LASTITER = Path(sys.executable).with_name("lastiter")  # installed by `pip install -e .` next to the interpreter
SCENARIO_DIR = ROOT / "examples" / "scenarios"
GLM_SCENARIO = SCENARIO_DIR / "random-batch-projected-glm.toml"
# a file whose best needs no membership profile: each lastiter process builds its own (~30 s on 2 cores for the
# GLM file, whose numbers tests/core/compare/test_compare.py checks)
SHUFFLE_SCENARIO = SCENARIO_DIR / "shuffle-once-logistic-regression.toml"


def lastiter(*argv: str) -> subprocess.CompletedProcess:
    """Run the installed ``lastiter`` console script."""
    assert LASTITER.is_file(), f"the console script is not installed next to {sys.executable}"
    return subprocess.run([str(LASTITER), *map(str, argv)], capture_output=True, text=True, check=False)


def assert_one_line_error(proc: subprocess.CompletedProcess, fragment: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lastiter: error: "), proc.stderr
    assert fragment in lines[0], lines[0]


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_version_is_the_package_version():
    proc = lastiter("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"lastiter {lp.__version__}"
    assert lp.__version__ == importlib.metadata.version("lastiter-plugins")


@pytest.mark.parametrize("command", ["rdp", "epsilon", "bounds", "calibrate", "compare"])
def test_every_subcommand_takes_config_and_every_api_parameter(command):
    parser = _subcommands()[command]
    dests = {action.dest for action in parser._actions}
    assert {"config", *lp.PARAMETERS} <= dests, sorted({"config", *lp.PARAMETERS} - dests)
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for key in lp.PARAMETERS:
        assert "--" + key.replace("_", "-") in flags, key
    for key in ("gradient_norms_within_clip", "clipped_loss_convex_smooth"):  # a file's true can be overridden
        assert "--no-" + key.replace("_", "-") in flags, key


def test_every_option_has_help_text():
    hidden = {"--no-clipping"}  # the renamed flag: refused with the new name, not advertised
    parsers = {"lastiter": build_parser(), **_subcommands()}
    for name, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction) or set(action.option_strings) & hidden:
                continue
            assert action.help and action.help != argparse.SUPPRESS, (name, action.option_strings or action.dest)
    proc = lastiter("epsilon", "--help")
    assert proc.returncode == 0 and "--clipped-loss-convex-smooth" in proc.stdout and "--config" in proc.stdout


def test_epsilon_from_a_config_equals_compare_on_the_same_file():
    proc = lastiter("epsilon", "--bound", "best", "--config", SHUFFLE_SCENARIO, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    eps = json.loads(proc.stdout)
    proc = lastiter("compare", "--config", SHUFFLE_SCENARIO, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)["best"][0]
    assert eps["epsilon"] == pytest.approx(best["epsilon"], rel=1e-12) and eps["winner"] == best["winner"]
    assert eps["delta"] == 1e-5  # the file's delta


def test_flags_override_the_config_file():
    _, params, _ = scenarios.split_scenario(scenarios.load_scenario(GLM_SCENARIO))
    proc = lastiter("epsilon", "--bound", "composition", "--config", GLM_SCENARIO, "--epochs", "10",
                    "--delta", "1e-6", "--noise-multiplier", "3", "--format", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = lp.epsilon("composition", 1e-6, **(params | {"epochs": 10, "noise_multiplier": 3.0}))
    assert json.loads(proc.stdout)["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)
    # a boolean the file sets to true is switched off by the flag: ye-shokri-random then refuses
    proc = lastiter("epsilon", "--bound", "ye-shokri-random", "--config", GLM_SCENARIO)
    assert proc.returncode == 0, proc.stderr
    proc = lastiter(
        "epsilon", "--bound", "ye-shokri-random", "--config", GLM_SCENARIO, "--no-gradient-norms-within-clip"
    )
    assert_one_line_error(proc, "gradient_norms_within_clip or clipped_loss_convex_smooth")


def test_clipped_loss_convex_smooth_flag_is_the_api_parameter():
    kwargs = strongly_convex(sampling="shuffle_once", gradient_norms_within_clip=False)
    argv = ["epsilon", "--bound", "best", "--delta", "1e-5", *cli_flags(kwargs), "--format", "json"]
    with_flag = lastiter(*argv, "--clipped-loss-convex-smooth")
    without = lastiter(*argv)
    assert with_flag.returncode == 0 and without.returncode == 0, with_flag.stderr + without.stderr
    expected = lp.epsilon("best", 1e-5, **kwargs, clipped_loss_convex_smooth=True)
    data = json.loads(with_flag.stdout)
    assert data["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12) and data["winner"] == expected.winner
    assert json.loads(without.stdout)["winner"] != expected.winner
    assert json.loads(without.stdout)["epsilon"] > 2 * expected.epsilon


def test_calibrate_reports_winner_relation_delta_protects_and_achieved_epsilon():
    kwargs = strongly_convex(sampling="shuffle_once")
    del kwargs["noise_multiplier"]
    argv = ["calibrate", "--bound", "best", "--target-epsilon", "3", "--delta", "1e-5", *cli_flags(kwargs)]
    proc = lastiter(*argv, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    achieved = lp.epsilon("best", 1e-5, **kwargs, noise_multiplier=data["noise_multiplier"])
    assert data["target_epsilon"] == 3 and data["delta"] == 1e-5 and data["bound"] == "best"
    assert data["epsilon"] == pytest.approx(achieved.epsilon, rel=1e-12) and data["epsilon"] <= 3
    assert data["winner"] == achieved.winner == "shifted-interpolation-shuffle"
    assert data["relation"] == "replace_one" and data["protects"] == "the final model only"
    assert data["proof"] == "proven"
    proc = lastiter(*argv)
    assert proc.returncode == 0, proc.stderr
    for text in (f"{data['noise_multiplier']:.6g}", f"epsilon = {achieved.epsilon:.6g} <= 3", "1e-05", "replace_one",
                 "shifted-interpolation-shuffle", "the final model only"):  # fmt: skip
        assert text in proc.stdout, text


def test_subcommands_need_the_pipeline_from_flags_or_a_config(tmp_path):
    proc = lastiter("epsilon", "--bound", "best", "--config", SHUFFLE_SCENARIO, "--delta", "1e-5")
    assert proc.returncode == 0, proc.stderr
    partial = tmp_path / "no-delta.toml"
    partial.write_text(
        "dataset_size = 1000\nbatch_size = 10\nnoise_multiplier = 1.0\nsteps = 50\nsampling = 'cyclic'\n"
    )
    proc = lastiter("epsilon", "--config", partial, "--format", "json")  # delta and bound: compare's defaults
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["delta"] == scenarios.DEFAULT_DELTA and json.loads(proc.stdout)["bound"] == "best"
    proc = lastiter("bounds", "--config", partial, "--format", "json")  # bounds needs no delta
    assert proc.returncode == 0, proc.stderr
    assert_one_line_error(lastiter("calibrate", "--bound", "best", "--delta", "1e-5", "--config", partial),
                          "--target-epsilon")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["compare", "--unproven", "nope"], "--unproven: must name an unproven bound (altschuler-talwar). Found 'nope'."),
        (["bounds", *PARAMS, "--unproven", "composition"], "--unproven: must name an unproven bound"),
        (["epsilon", "--bound", "best", "--config", "NOT_UTF8"], "config must be a UTF-8 TOML file"),
        (["compare", "--config", "NOT_UTF8"], "config must be a UTF-8 TOML file"),
        (["compare", "--config", "DIR"], "config must be a readable TOML file"),
        (["compare", "--plot", "DIR/x.png"], "plot path must be a file we can write"),
        (["compare", "--plot", "DIR/eps.txt"], "plot path must end in .png"),
        (["rdp", "--bound", "best", "--orders", "2", "--config", "DIR/missing.toml"], "config must be a readable TOML file"),
        (["epsilon", *PARAMS, "--delta", "-1e-5"], "delta must be in (0, 1). Found -1e-05."),
    ],
    ids=["unknown-unproven", "proven-as-unproven", "non-utf8-epsilon", "non-utf8-compare", "config-is-a-folder",
         "plot-onto-a-folder", "plot-suffix", "missing-config", "negative-delta"],
)  # fmt: skip
def test_user_errors_of_the_console_script_exit_2_with_one_line(tmp_path, argv, fragment):
    (tmp_path / "x.png").mkdir()  # a folder where the plot file should go
    not_utf8 = tmp_path / "latin1.toml"
    not_utf8.write_bytes('name = "sc\u00e9nario"\ndataset_size = 1000\n'.encode("latin-1"))
    names_the_file = "NOT_UTF8" in argv
    argv = [str(not_utf8) if a == "NOT_UTF8" else a.replace("DIR", str(tmp_path)) for a in argv]
    proc = lastiter(*argv)
    assert_one_line_error(proc, fragment)
    if names_the_file:
        assert str(not_utf8) in proc.stderr


def test_unwritable_plot_path_is_refused_before_the_comparison_runs(capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")

    def must_not_run(*args, **kwargs):
        raise AssertionError("the comparison ran before the plot path was checked")

    monkeypatch.setattr(compare, "compare", must_not_run)
    monkeypatch.setattr(compare, "epsilon_curves", must_not_run)
    (tmp_path / "x.png").mkdir()
    code, out, err = run(capsys, "compare", "--plot", str(tmp_path / "x.png"))
    assert code == 2 and out == "" and err.count("\n") == 1 and "plot path must be a file we can write" in err
    if os.geteuid() != 0:  # root writes into read-only folders
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        code, out, err = run(capsys, "compare", "--plot", str(locked / "eps.png"))
        assert code == 2 and "plot path must be a file we can write" in err and err.count("\n") == 1
        assert not (locked / "eps.png").exists()


def test_plot_message_names_the_file_actually_written(tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "out"
    target.mkdir()  # `--plot DIR`: matplotlib writes DIR.png, and the message must say so
    proc = lastiter("compare", "--config", SCENARIO_DIR / "cyclic-clipping-kong-ribero.toml", "--epochs", "2",
                    "--plot", target)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "out.png"
    assert written.read_bytes()[:4] == b"\x89PNG"
    assert proc.stdout.rstrip().endswith(f"Plot written to {written}")
    assert not any(target.iterdir())


# ---------------------------------------------------------------- a light parser, the same defaults everywhere

#: What `lastiter --help` must not import: the numerics, and the package's modules that load them.
HEAVY = ("numpy", "scipy", "dp_accounting", "matplotlib", "torch", "tensorflow", "lastiter_plugins.api",
         "lastiter_plugins.compare", "lastiter_plugins.plot", "lastiter_plugins.registry")  # fmt: skip
SUBCOMMANDS = ("rdp", "epsilon", "bounds", "calibrate", "advise", "compare")


def test_help_imports_no_numerics():
    """`lastiter --help` and every subcommand's help are answered by argparse alone (issue 31: 1.7 s of CPU
    before, about 0.05 s after)."""
    script = (
        "import sys\n"
        "from lastiter_plugins.cli import main\n"
        f"for argv in [['--help'], ['--version'], *[[c, '--help'] for c in {SUBCOMMANDS!r}]]:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code == 0, (argv, exc.code)\n"
        f"print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert "last-iterate privacy accountants" in proc.stdout.lower() and "Renyi-DP accountants" not in proc.stdout


#: The public API (docs/api.md): one name per job. A name added or removed must be added or removed here too.
PUBLIC_NAMES = (
    # the pipeline
    "TrainingConfig", "LossAssumptions", "Sampling", "Relation", "Update", "Parameters", "PARAMETERS", "DEFAULT_ORDERS",
    "build",
    # what it gives
    "epsilon", "rdp", "applicable_bounds", "calibrate_noise", "advise", "baseline_note", "is_standard_baseline",
    "EpsilonResult", "BoundEvaluation", "Suggestion", "CalibrationResult", "impossible_declaration",
    # the answer first (the outputs' first lines; the adapters' reports render theirs with it)
    "Answer", "HostNumber", "answer_lines",
    # the table of bounds
    "BEST", "BOUNDS", "BOUND_IDS", "BoundSpec", "Kind", "Proof", "Protects",
    # errors and warnings
    "NotApplicableError", "CalibrationError", "PipelineChangedError", "UnsupportedHostError", "OrderGridWarning",
    "UnprovenBoundWarning",
    "ImpossibleDeclarationWarning",
)  # fmt: skip


def test_importing_the_package_imports_no_numerics_and_every_public_name_resolves():
    script = f"import sys, lastiter_plugins as lp; print(sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stdout + proc.stderr
    assert sorted(lp.__all__) == sorted(lp._EXPORTS) == sorted(PUBLIC_NAMES)  # docs/api.md lists the same
    for name in lp.__all__:
        assert getattr(lp, name) is getattr(importlib.import_module(f"lastiter_plugins.{lp._EXPORTS[name]}"), name)
    assert lp.profiles.__name__ == "lastiter_plugins.profiles"  # submodules as attributes, as before
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        lp.nope  # noqa: B018


def test_parameter_flags_are_the_api_parameters_in_order():
    from lastiter_plugins.cli import PARAMETER_FLAGS

    assert tuple(PARAMETER_FLAGS) == lp.PARAMETERS


def test_every_subcommand_has_the_same_defaults():
    parsers = _subcommands()
    assert set(parsers) == set(SUBCOMMANDS)
    for name, parser in parsers.items():
        defaults = {action.dest: action.default for action in parser._actions}
        if "bound" in defaults:
            assert defaults["bound"] == lp.BEST, name
        if "delta" in defaults:  # None: the --config file's, else DEFAULT_DELTA (the help says which)
            assert defaults["delta"] is None, name
            action = next(a for a in parser._actions if a.dest == "delta")
            assert f"else {scenarios.DEFAULT_DELTA:g}" in action.help, name
    assert {"bound"} <= {a.dest for a in parsers["epsilon"]._actions}


def test_epsilon_defaults_are_compares(capsys):
    code, out, err = run(capsys, "epsilon", *PARAMS, "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    expected = lp.epsilon("best", scenarios.DEFAULT_DELTA, **KWARGS)
    assert (data["bound"], data["delta"], data["winner"]) == ("best", scenarios.DEFAULT_DELTA, expected.winner)
    assert data["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)
    code, out, err = run(capsys, "bounds", *PARAMS, "--format", "json")  # numbers at the default delta
    assert code == 0, err
    rows = {r["bound"]: r for r in json.loads(out)["bounds"]}
    assert rows["best"]["epsilon"] == pytest.approx(expected.epsilon, rel=1e-12)


# ---------------------------------------------------------------- files the command line cannot write


@pytest.mark.parametrize(
    ("path", "fragment"),
    [("", "plot path must name a file, e.g. eps.png. Found ''."),
     ("   ", "plot path must name a file"),
     ("/proc/lastiter.png", "plot path must be a file we can write. Found '/proc/lastiter.png'")],
    ids=["empty", "blank", "proc"],
)  # fmt: skip
def test_plot_path_that_cannot_be_written_is_refused_in_one_line(capsys, path, fragment):
    pytest.importorskip("matplotlib")
    if path.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc on this system")
    code, out, err = run(capsys, "compare", "--plot", path)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert fragment in err and "Traceback" not in err
    assert not Path(path.strip() or ".png").with_suffix(".png").exists() or path.startswith("/proc")


def test_plot_check_leaves_no_file_behind(tmp_path):
    pytest.importorskip("matplotlib")
    from lastiter_plugins import plot

    assert plot.check_can_plot(tmp_path / "eps") == tmp_path / "eps.png"
    assert list(tmp_path.iterdir()) == []  # the trial file is removed
    kept = tmp_path / "kept.png"
    kept.write_bytes(b"old")
    plot.check_can_plot(kept)
    assert kept.read_bytes() == b"old"  # opened for appending: unchanged


def test_plot_write_error_is_one_line(capsys, monkeypatch, tmp_path):
    """A write that fails after the check (disk full, folder removed during the sweep): one line, status 2."""
    matplotlib_figure = pytest.importorskip("matplotlib.figure")

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib_figure.Figure, "savefig", full_disk)
    code, out, err = run(capsys, "compare", *TINY, "--plot", str(tmp_path / "eps.png"))
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "plot path must be a file we can write" in err and "no space left on device" in err


# ---------------------------------------------------------------- a closed output pipe


#: A pipeline whose comparison is quick (two epochs of ten steps).
TINY = [
    "--dataset-size",
    "100",
    "--batch-size",
    "10",
    "--noise-multiplier",
    "2",
    "--epochs",
    "2",
    "--sampling",
    "cyclic",
]


def _into_closed_pipe(*argv: str) -> subprocess.CompletedProcess:
    """Run the console script with stdout a pipe whose reading end is already closed (`lastiter ... | true`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [str(LASTITER), *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, check=False, timeout=300
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    ("argv", "status"),
    [(["bounds", *PARAMS], 141), (["compare", *TINY, "--format", "csv"], 141), (["--help"], 0)],
    ids=["bounds", "compare-csv", "help"],
)
def test_output_into_a_closed_pipe_ends_quietly(argv, status):
    proc = _into_closed_pipe(*argv)
    assert proc.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    # 141 = 128 + SIGPIPE, as shells report for a tool whose reader went away; argparse itself ignores a
    # failed write of its help and exits 0
    assert proc.returncode == status


def test_shell_pipe_into_true_ends_quietly():
    """The command of issue 29: `true` exits before lastiter writes (its imports take longer)."""
    proc = subprocess.run(["sh", "-c", f"{LASTITER} bounds {' '.join(PARAMS)} | true"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


BUILTIN_FLAGS = ["--dataset-size", "10000", "--batch-size", "100", "--noise-multiplier", "4", "--clip-norm", "1.05",
                 "--learning-rate", "1", "--epochs", "100", "--sampling", "shuffle_once", "--smoothness", "0.26",
                 "--strong-convexity", "0.01", "--diameter", "10", "--gradient-norms-within-clip"]  # fmt: skip


def test_epsilon_says_where_the_proof_comes_from_and_what_published_theorems_give(capsys):
    code, out, _ = run(capsys, "epsilon", *BUILTIN_FLAGS)
    assert code == 0
    params = dict(dataset_size=10000, batch_size=100, noise_multiplier=4.0, clip_norm=1.05, learning_rate=1.0,
                  epochs=100, sampling="shuffle_once", smoothness=0.26, strong_convexity=0.01, diameter=10.0,
                  gradient_norms_within_clip=True)  # fmt: skip
    published = lp.epsilon("best", 1e-5, published_only=True, **params)
    lines = out.splitlines()
    assert lines[0].startswith("epsilon = 1.359 at delta = 1e-05 for the final model only") and len(lines) <= 10
    assert "derived here (docs/derivations/shifted-interpolation.md#si-shuffle-once; checked)" in out
    assert f"Published theorems only: {published.epsilon:.4g} ({published.winner})" in out
    code, out, _ = run(capsys, "epsilon", "--explain", *BUILTIN_FLAGS)
    assert "Proof: derived here: docs/derivations/shifted-interpolation.md#si-shuffle-once" in out  # behind --explain
    code, out, _ = run(capsys, "epsilon", "--published-only", *BUILTIN_FLAGS)
    assert code == 0 and f"epsilon = {published.epsilon:.4g} at delta = 1e-05" in out
    assert "published (Kong & Ribero" in out
    assert "derived here" not in out
    code, out, err = run(capsys, "epsilon", "--published-only", "--bound", "shifted-interpolation-shuffle",
                         *BUILTIN_FLAGS)  # fmt: skip
    assert code == 2 and "this library's derivation" in err
    code, out, _ = run(capsys, "calibrate", "--published-only", "--target-epsilon", "5", *BUILTIN_FLAGS[:4],
                       *BUILTIN_FLAGS[6:])  # fmt: skip
    assert code == 0 and "via kong-ribero-cyclic" in out


# ------------------------------------------------------------------ the hosts' dialect (issue 36, item 3)

#: A small Poisson pipeline as Opacus states it: n, the loader's sample rate 1/L and sigma (L = 100: b = 10).
POISSON_HOST = ["--dataset-size", "1000", "--sample-rate", repr(1 / 100), "--sigma", "1", "--steps", "200",
                "--sampling", "poisson", "--relation", "add_or_remove_one"]  # fmt: skip
POISSON_CORE = ["--dataset-size", "1000", "--batch-size", "10", "--noise-multiplier", "1", "--steps", "200",
                "--sampling", "poisson", "--relation", "add_or_remove_one"]  # fmt: skip
#: Each subcommand with what it needs besides the pipeline.
EXTRA = {"rdp": ["--orders", "2,8"], "calibrate": ["--target-epsilon", "2"], "advise": ["--top", "1"]}


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_takes_the_hosts_spellings_and_format_json(capsys, command):
    """--format json everywhere; --sigma is --noise-multiplier and --sample-rate 1/L is --batch-size ceil(n/L):
    the same output, and no warning (the relation is given)."""
    argv = [command, *EXTRA.get(command, []), "--format", "json"]
    if command == "calibrate":  # the noise multiplier is the unknown
        host = [a for i, a in enumerate(POISSON_HOST) if a != "--sigma" and POISSON_HOST[i - 1] != "--sigma"]
        core = [a for i, a in enumerate(POISSON_CORE) if a != "--noise-multiplier" and POISSON_CORE[i - 1] != "--noise-multiplier"]  # fmt: skip
    else:
        host, core = POISSON_HOST, POISSON_CORE
    code, out, err = run(capsys, *argv, *host)
    assert code == 0 and err == "", err
    code, same, err = run(capsys, *argv, *core)
    assert code == 0 and err == "" and json.loads(same) == json.loads(out)
    assert '"add_or_remove_one"' in out  # every output names the relation


@pytest.mark.parametrize("command", [c for c in SUBCOMMANDS if c != "compare"])
def test_json_is_a_deprecated_spelling_of_format_json(capsys, command):
    argv = [
        command,
        *EXTRA.get(command, []),
        *(POISSON_CORE if command != "calibrate" else POISSON_CORE[:4] + POISSON_CORE[6:]),
    ]
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0
    assert (
        err == "lastiter: warning: --json is deprecated: use --format json (--json goes in lastiter-plugins 0.4.0).\n"
    )
    assert run(capsys, *argv, "--format", "json") == (0, out, "")
    code, text, _ = run(capsys, *argv)  # the default stays text
    assert code == 0 and text != out


def test_sample_rate_is_poisson_only_and_replaces_the_batch_size(capsys):
    pipeline = ["--dataset-size", "1000", "--sigma", "1", "--relation", "add_or_remove_one"]
    code, out, _ = run(capsys, "epsilon", "--format", "json", "--sample-rate", repr(1 / 100), "--epochs", "2",
                       "--sampling", "poisson", *pipeline)  # fmt: skip
    assert code == 0 and json.loads(out)["steps"] == 200  # two epochs of 100 batches: the run's own steps
    for argv, fragment in [
        (["--sample-rate", "0.01", "--sampling", "cyclic", "--steps", "5"], "--sample-rate needs --sampling poisson"),
        (["--sample-rate", "0.3", "--sampling", "poisson", "--epochs", "2"], "sample_rate must be 1/L for an integer L"),
        (["--sample-rate", "0.9999", "--sampling", "poisson", "--steps", "5"], "sample_rate must be 1 or at most"),
        (["--sample-rate", "0", "--sampling", "poisson", "--steps", "5"], "argument --sample-rate: must be a number in (0, 1]"),
        (["--sample-rate", "0.01", "--batch-size", "10", "--sampling", "poisson", "--steps", "5"],
         "argument --batch-size: not allowed with argument --sample-rate"),
    ]:  # fmt: skip
        code, out, err = run(capsys, "epsilon", *argv, *pipeline)
        assert code == 2 and out == "" and fragment in err, (argv, err)


def test_sample_rate_overrides_the_config_file_s_batch_size(capsys, tmp_path):
    scenario = tmp_path / "poisson.toml"
    scenario.write_text('dataset_size = 1000\nbatch_size = 50\nnoise_multiplier = 1.0\nsteps = 200\n'
                        'sampling = "poisson"\nrelation = "add_or_remove_one"\n')  # fmt: skip
    code, out, _ = run(capsys, "epsilon", "--format", "json", "--config", str(scenario), "--sample-rate", "0.01")
    expected = lp.epsilon("best", 1e-5, dataset_size=1000, batch_size=10, noise_multiplier=1.0, steps=200,
                          sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    assert code == 0 and json.loads(out)["epsilon"] == expected.epsilon


def test_a_poisson_relation_left_out_is_add_or_remove_and_warns_once_in_the_command_line_s_spelling(capsys):
    without = [a for i, a in enumerate(POISSON_CORE) if "relation" not in a and "relation" not in POISSON_CORE[i - 1]]
    code, out, err = run(capsys, "epsilon", "--format", "json", *without)
    assert code == 0 and json.loads(out)["relation"] == "add_or_remove_one"
    (line,) = err.splitlines()  # once, though the command builds the pipeline more than once
    assert line.startswith("lastiter: warning: --relation left out with sampling='poisson': accounted under "
                           "add_or_remove_one")  # fmt: skip
    assert "Pass --relation replace_one to keep the 0.2.0 number" in line
    code, out, err = run(capsys, "epsilon", "--format", "json", *without, "--relation", "replace_one")
    assert code == 0 and err == "" and json.loads(out)["relation"] == "replace_one"
    help_text = next(a.help for a in _subcommands()["epsilon"]._actions if a.dest == "relation")
    assert (
        "add_or_remove_one for poisson, random_allocation; replace_one for cyclic, shuffle_once, reshuffle, random_batch"
        in help_text
    )


def test_compare_takes_published_only(capsys):
    """best over published theorems only, every row still shown (the built-in scenario's best is this
    library's derivation)."""
    code, out, _ = run(capsys, "compare", "--format", "json")
    plain = json.loads(out)
    code, out, _ = run(capsys, "compare", "--format", "json", "--published-only")
    assert code == 0
    published = json.loads(out)
    assert published["published_only"] and not plain["published_only"]
    assert [r["id"] for r in published["rows"]] == [r["id"] for r in plain["rows"]]
    _, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    expected = lp.epsilon("best", delta, published_only=True, **params)
    assert published["best"][0]["epsilon"] == expected.epsilon and published["best"][0]["winner"] == expected.winner
    assert plain["best"][0]["winner"] != expected.winner  # the flag changed the answer
    assert all(
        r["provenance"].startswith("published") for r in published["rows"] if r["counted"]
    )  # only published rows are counted
    code, text, _ = run(capsys, "compare", "--published-only", "--explain")
    assert "per neighbouring relation (over published theorems only: --published-only):" in text
