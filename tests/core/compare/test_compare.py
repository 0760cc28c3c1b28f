"""`lastiter compare`: the side-by-side table, its formats, the scenarios and the plot.

The PLD rows (~0.5 s per new q, z, T) dominate the run time; the tests reuse a few
scenarios so those results are cached.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins import compare, plot, scenarios
from lastiter_plugins.cli import main
from lastiter_plugins.compare.rows import STANDARD
from tests.support import ROOT

SCENARIOS = sorted((ROOT / "examples" / "scenarios").glob("*.toml"))
POISSON_ONLY = {"opacus-rdp", "opacus-prv", "opacus-gdp", "dp-accounting-rdp-poisson", "dp-accounting-pld-poisson"}
HAS_OPACUS = compare.host_versions()["opacus"] is not None
SHUFFLE_PARAMS = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)[1]


def run(capsys, *argv):
    code = main(["compare", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _no_nan(token):
    raise AssertionError(f"JSON must not contain {token}")


@pytest.fixture(scope="module")
def builtin() -> compare.Comparison:
    name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    return compare.compare(delta, name=name, **params)


@pytest.fixture(scope="module")
def scenario_results() -> dict[str, compare.Comparison]:
    out = {}
    for path in SCENARIOS:
        name, params, delta = scenarios.split_scenario(scenarios.load_scenario(path))
        out[path.stem] = compare.compare(delta, name=name, **params)
    return out


# ---------------------------------------------------------------- the table


def test_table_is_reproducible(builtin):
    name, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    again = compare.compare(delta, name=name, **params)
    assert again.to_dict() == builtin.to_dict()
    assert compare.format_table(again) == compare.format_table(builtin)


def test_builtin_rows_match_the_api(builtin):
    _, params, delta = scenarios.split_scenario(scenarios.BUILTIN_SCENARIO)
    for bound in ("ye-shokri-shuffle", "ye-shokri-cyclic", "kong-ribero-cyclic", "composition"):
        row = builtin.row(bound)
        result = lp.epsilon(bound, delta, **params)
        eps, order = result.epsilon, result.order
        assert row.valid and row.counted
        assert (row.epsilon, row.order) == pytest.approx((eps, order), rel=1e-12)
    # every registry bound has a row; a bound that does not apply has no number
    ids = {r.id for r in builtin.rows}
    assert set(lp.BOUNDS) <= ids
    for spec_id in lp.BOUNDS:
        row = builtin.row(spec_id)
        assert row.valid == (row.epsilon is not None), row
        if not row.valid:
            assert row.why_not and not row.counted
    assert builtin.row("altschuler-talwar").why_not[0].startswith("sampling must be one of random_batch, poisson")
    assert builtin.row("ye-shokri-shuffle").protects == compare.FINAL_MODEL
    assert builtin.row("composition").protects == compare.EVERY_ITERATE


def test_builtin_last_iterate_wins_by_a_large_factor(builtin):
    (best,) = builtin.best
    assert best.relation == "replace_one" and best.declared
    assert best.winner == "shifted-interpolation-shuffle" and best.protects == compare.FINAL_MODEL
    standard = min(r.epsilon for r in builtin.rows if r.kind != "last-iterate bound" and r.counted)
    assert standard / best.epsilon > 20
    assert (best.every_iterate_epsilon, best.every_iterate_winner) == (standard, "composition-gdp-epochs")
    assert "every iterate: 33.1 (composition-gdp-epochs)" in compare.format_table(builtin)  # in the answer
    assert "24.4x below the best valid every-iterate accountant" in compare.format_table(builtin, explain=True)


def test_epoch_baselines_are_registry_rows(builtin):
    """The exact per-epoch Gaussian composition (once compare's dp-accounting-pld-epoch row) is a registry
    row; its number is pinned in tests/core/test_baselines.py. The RDP composition of the same mechanism is above it."""
    gdp, rdp = builtin.row("composition-gdp-epochs"), builtin.row("composition")
    assert gdp.valid and gdp.counted and gdp.relation == "replace_one" and gdp.protects == compare.EVERY_ITERATE
    assert gdp.epsilon == pytest.approx(lp.epsilon("composition-gdp-epochs", 1e-5, **SHUFFLE_PARAMS).epsilon, rel=0)
    assert gdp.epsilon < rdp.epsilon  # the exact Gaussian beats its RDP conversion
    ids = {r.id for r in builtin.rows}
    assert not ids & {"dp-accounting-rdp-epoch", "dp-accounting-pld-epoch", "dp-accounting-rdp-swor"}


@pytest.mark.parametrize("sampling", ["cyclic", "shuffle_once", "reshuffle", "random_batch", "random_allocation"])
def test_poisson_only_accountants_are_flagged_with_their_number(sampling):
    rows = compare.compare_rows(
        *lp.build(dataset_size=1000, batch_size=100, noise_multiplier=2.0, epochs=3, sampling=sampling),
        delta=1e-5,
    )
    flagged = [r for r in rows if r.id in POISSON_ONLY]
    expected = POISSON_ONLY if HAS_OPACUS else {i for i in POISSON_ONLY if not i.startswith("opacus")}
    assert {r.id for r in flagged} == expected
    for row in flagged:
        assert not row.valid and not row.counted
        assert row.epsilon is not None and row.epsilon > 0
        assert f"Found {sampling}" in " ".join(row.why_not)
        assert row.relation == "add_or_remove_one" and row.protects == compare.EVERY_ITERATE
    table = compare.format_table(compare.Comparison("t", {}, 1e-5, 30, 10, rows, (), {}), explain=True)
    rows_part = table.split("\naccountant ", 1)[1]  # after the answer, whose host line says NOT VALID once
    assert rows_part.count("NOT VALID") == sum(1 for r in rows if not r.valid and r.epsilon is not None) >= len(flagged)


def test_poisson_pipeline_counts_the_registry_rows_and_keeps_relations_apart():
    params = dict(dataset_size=1000, batch_size=100, noise_multiplier=2.0, epochs=3, sampling="poisson",
                  relation="replace_one")  # fmt: skip
    result = compare.compare(1e-5, **params)
    for row_id in ("composition-pld-poisson-replace-one", "composition-pld-poisson", "composition"):
        assert result.row(row_id).valid and result.row(row_id).counted
    # dp-accounting's Poisson accountants are the registry rows here: no second row for them
    assert not {"dp-accounting-rdp-poisson", "dp-accounting-pld-poisson"} & {r.id for r in result.rows}
    if HAS_OPACUS:  # valid, shown, never counted
        for row_id in ("opacus-rdp", "opacus-prv"):
            assert result.row(row_id).valid and not result.row(row_id).counted
        gdp = result.row("opacus-gdp")
        assert not gdp.valid and not gdp.counted and "central-limit" in gdp.why_not[0]
    # each relation's line is the registry's best for that relation, never a minimum across relations
    declared, other = result.best
    assert declared.declared and declared.relation == "replace_one"
    assert declared.winner == "composition-pld-poisson-replace-one"
    assert declared.epsilon == lp.epsilon("best", 1e-5, **params).epsilon
    assert other.relation == "add_or_remove_one" and not other.declared
    aor = lp.epsilon("best", 1e-5, **{**params, "relation": "add_or_remove_one"})
    assert (other.epsilon, other.winner) == (aor.epsilon, aor.winner) == (other.epsilon, "composition-pld-poisson")
    assert result.row(other.winner).relation == "add_or_remove_one"


def test_random_allocation_pipeline_counts_its_rows_beside_the_hosts_poisson_numbers():
    """Issue 39: on a random-allocation pipeline the registry's random-allocation rows are counted, one per relation;
    the hosts' Poisson numbers beside them are NOT VALID (their sampling is not the pipeline's)."""
    params = dict(dataset_size=1000, batch_size=100, noise_multiplier=2.0, epochs=3, sampling="random_allocation",
                  relation="add_or_remove_one")  # fmt: skip
    result = compare.compare(1e-5, lower_bound=False, **params)
    declared, other = result.best
    assert (declared.relation, declared.winner) == ("add_or_remove_one", "composition-pld-random-allocation")
    assert (other.relation, other.winner) == ("replace_one", "composition-pld-random-allocation-replace-one")
    assert declared.epsilon == lp.epsilon("best", 1e-5, **params).epsilon
    for row_id in ("composition-pld-random-allocation", "composition-pld-random-allocation-replace-one"):
        row = result.row(row_id)
        assert row.valid and row.counted and row.protects == compare.EVERY_ITERATE
    hosts = [r for r in result.rows if r.id in POISSON_ONLY]
    assert hosts and all(not r.valid and not r.counted and r.epsilon is not None for r in hosts)
    assert all("Found random_allocation" in " ".join(r.why_not) for r in hosts)


def test_a_relation_without_a_valid_bound_says_so():
    params = dict(dataset_size=1000, batch_size=100, noise_multiplier=2.0, epochs=3, sampling="random_batch",
                  relation="add_or_remove_one")  # fmt: skip
    (declared, *others) = compare.compare(1e-5, **params).best
    assert declared.declared and declared.epsilon is None and declared.how == "no valid accountant"
    assert [b.relation for b in others] == ["replace_one"]
    assert "no valid accountant" in compare.format_table(compare.compare(1e-5, **params))


def test_best_line_is_a_minimum_within_one_relation(scenario_results):
    for result in scenario_results.values():
        for best in result.best:
            if best.epsilon is None:
                continue
            same = [r for r in result.rows if r.counted and r.relation == best.relation]
            assert best.epsilon <= min(r.epsilon for r in same) * (1 + 1e-12)
            others = [r for r in result.rows if r.relation != best.relation]
            assert best.winner not in {r.id for r in others}


def test_random_batch_baseline_is_sampling_without_replacement(scenario_results):
    """Fixed-size random batches keep the RDP of sampling without replacement (pinned to dp-accounting's
    RdpAccountant in tests/core/bounds/test_known_values.py); no epoch or Poisson baseline applies
    (docs/derivations/baselines.md#random-batch-pair)."""
    result = scenario_results["random-batch-projected-glm"]
    comp = result.row("composition")
    assert comp.valid and comp.counted and comp.relation == "replace_one"
    for row_id in ("composition-gdp-epochs", "composition-pld-poisson", "composition-pld-poisson-replace-one"):
        assert not result.row(row_id).valid and result.row(row_id).epsilon is None
    assert "sampling must be one of cyclic, shuffle_once, reshuffle" in result.row("composition-gdp-epochs").why_not[0]


# ---------------------------------------------------------------- scenarios


def test_there_are_three_to_five_scenarios_and_the_builtin_is_one_of_them():
    assert 3 <= len(SCENARIOS) <= 6
    builtin = scenarios.load_scenario(SCENARIOS[0].parent / "shuffle-once-logistic-regression.toml")
    assert builtin == scenarios.BUILTIN_SCENARIO | {"description": builtin["description"]}


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_scenario_file_runs(capsys, path):
    code, out, err = run(capsys, "--config", str(path), "--format", "json")
    assert code == 0, err
    data = json.loads(out, parse_constant=_no_nan)
    assert data["best"] and data["best"][0]["declared"]
    assert data["scenario"] == scenarios.load_scenario(path)["name"]


def _ratio_best_to(result, row_id):
    (best,) = (b for b in result.best if b.declared)
    return result.row(row_id).epsilon / best.epsilon, best


@pytest.mark.parametrize(
    "stem, winner, reference, factor",
    [
        ("shuffle-once-logistic-regression", "shifted-interpolation-shuffle", "composition-gdp-epochs", 20),
        ("reshuffle-small-projection", "kong-ribero-bounded", "composition-gdp-epochs", 5),
        ("random-batch-projected-glm", "shifted-interpolation-random-batch", "composition", 2.0),
        ("random-batch-long-run-small-domain", "bounded-domain-random", "composition", 3.5),
    ],
)
def test_scenarios_where_a_last_iterate_bound_wins(scenario_results, stem, winner, reference, factor):
    ratio, best = _ratio_best_to(scenario_results[stem], reference)
    assert best.winner == winner and best.protects == compare.FINAL_MODEL
    assert ratio > factor


def test_scenario_where_composition_wins(scenario_results):
    result = scenario_results["poisson-opacus-smooth-network"]
    best, other = result.best
    assert best.declared and best.relation == "add_or_remove_one" and best.protects == compare.EVERY_ITERATE
    assert best.winner == "composition-pld-poisson"
    assert best.epsilon < result.row("composition").epsilon  # the PLD beats the RDP of the same mechanism
    assert (other.relation, other.winner) == ("replace_one", "composition-pld-poisson-replace-one")
    assert result.row("liang-bounded").valid and result.row("liang-bounded").epsilon > 2 * best.epsilon
    # with sensitivity C under add-or-remove, liang-unbounded is exactly Poisson composition
    unbounded, composition = result.row("liang-unbounded"), result.row("composition")
    assert unbounded.valid and unbounded.epsilon == pytest.approx(composition.epsilon, rel=1e-9)
    assert unbounded.epsilon >= best.epsilon


def test_scenario_where_clipping_makes_the_cyclic_bound_useless(scenario_results):
    result = scenario_results["cyclic-clipping-kong-ribero"]
    kr, comp = result.row("kong-ribero-cyclic"), result.row("composition")
    assert kr.valid and kr.epsilon > comp.epsilon
    # theta -> 1 - 1/L^2 = 1/2, so the RDP grows like E: 4a/z^2 (1 + E/2) at every order
    _, params, _ = scenarios.split_scenario(
        scenarios.load_scenario(SCENARIOS[0].parent / "cyclic-clipping-kong-ribero.toml")
    )
    orders = np.array([2.0, 8.0])
    rdp_e, rdp_2e = (lp.rdp("kong-ribero-cyclic", orders, **(params | {"epochs": e})) for e in (100, 200))
    z = params["noise_multiplier"]
    assert rdp_e == pytest.approx(4 * orders / z**2 * (1 + 100 / 2), rel=1e-6)
    # theta_L(l) = 1/2 up to L^(-2l) for L = sqrt(2) (clipping may be active): (1 + 200/2) / (1 + 100/2)
    assert rdp_2e / rdp_e == pytest.approx(101 / 51 * np.ones(2), rel=1e-6)
    # declaring clipping inactive changes the picture (a different, stronger assumption)
    unclipped = compare.compare(1e-5, **(params | {"gradient_norms_within_clip": True}))
    assert unclipped.best[0].winner == "shifted-interpolation-cyclic"
    assert unclipped.row("composition").epsilon / unclipped.best[0].epsilon > 5


# ---------------------------------------------------------------- formats and the CLI


def test_default_command_prints_the_builtin_table(capsys, builtin):
    code, out, err = run(capsys)
    assert code == 0, err
    table, hint = out.strip().split("\nYour pipeline: ", 1)  # a first run ends by saying how to go on
    assert table == compare.format_table(builtin)
    assert "--config" in hint and "docs/choosing.md" in hint
    assert "ye-shokri-shuffle" in out and "NOT VALID" in out and "final model only" in out


def test_json_parses_without_nan(capsys, builtin):
    code, out, _ = run(capsys, "--format", "json")
    assert code == 0
    data = json.loads(out, parse_constant=_no_nan)
    assert [r["id"] for r in data["rows"]] == [r.id for r in builtin.rows]
    assert data["delta"] == 1e-5 and data["steps"] == 10000 and data["epochs"] == 100
    row = next(r for r in data["rows"] if r["id"] == "ye-shokri-shuffle")
    assert row["epsilon"] == pytest.approx(builtin.row("ye-shokri-shuffle").epsilon, rel=1e-12)
    assert {"valid", "why_not", "covers", "relation", "assumptions", "order", "protects"} <= set(row)


def test_json_writes_infinite_epsilons_as_null():
    row = compare.Row("x", "x", "standard accountant", True, (), (), "replace_one", "", math.inf, None, "", "", True)
    text = compare.format_comparison(compare.Comparison("t", {}, 1e-5, 1, 1, (row,), (), {}), "json")
    assert json.loads(text, parse_constant=_no_nan)["rows"][0]["epsilon"] is None


def test_csv_parses(capsys, builtin):
    code, out, _ = run(capsys, "--format", "csv")
    assert code == 0
    records = list(csv.DictReader(io.StringIO(out)))
    assert len(records) == len(builtin.rows) + len(builtin.best)
    assert list(records[0]) == list(compare.CSV_FIELDS)
    for rec in records:
        if rec["epsilon"]:
            float(rec["epsilon"])
    by_id = {rec["id"]: rec for rec in records}
    assert float(by_id["ye-shokri-shuffle"]["epsilon"]) == builtin.row("ye-shokri-shuffle").epsilon
    assert (
        by_id["best-replace_one"]["kind"] == "best"
        and by_id["best-replace_one"]["reference"] == "shifted-interpolation-shuffle"
    )
    assert by_id["altschuler-talwar"]["valid"] == "false" and by_id["altschuler-talwar"]["epsilon"] == ""


def test_markdown_is_a_table(capsys, builtin):
    code, out, _ = run(capsys, "--format", "markdown")
    assert code == 0
    table = [line for line in out.splitlines() if line.startswith("|")]
    hidden = [r for r in builtin.rows if not r.valid and r.kind != STANDARD]
    assert hidden and len(table) == 2 + len(builtin.rows) - len(hidden)  # the bounds that do not apply: counted
    assert f"{len(hidden)} more bounds do not apply" in out and "--all lists them" in out
    assert {line.count(" | ") for line in table if not line.startswith("|--")} == {8}  # no stray pipes in cells
    assert "**NOT VALID**" in out
    code, out, _ = run(capsys, "--format", "markdown", "--all")
    assert code == 0
    assert len([line for line in out.splitlines() if line.startswith("|")]) == 2 + len(builtin.rows)
    assert "more bounds do not apply" not in out


def test_flags_override_the_config_and_delta(capsys):
    path = SCENARIOS[0].parent / "cyclic-clipping-kong-ribero.toml"
    code, out, err = run(capsys, "--config", str(path), "--epochs", "10", "--delta", "1e-6", "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert data["epochs"] == 10 and data["delta"] == 1e-6 and data["params"]["noise_multiplier"] == 8.0
    comp = next(r for r in data["rows"] if r["id"] == "composition")
    assert comp["epsilon"] == pytest.approx(lp.epsilon("composition", 1e-6, **data["params"]).epsilon, rel=1e-12)


@pytest.mark.parametrize(
    "content, message",
    [
        ("dataset_size = 1000\nbatch_size = 10\nnoise_multiplier = 1.0\nepochs = 1\nsampling = 'cyclic'\nsigma = 2\n",
         "unknown scenario key 'sigma'"),
        ("dataset_size = 1000\nbatch_size = \n", "config must be valid TOML"),
        ("dataset_size = 1000\nbatch_size = 10\nnoise_multiplier = -1.0\nepochs = 1\nsampling = 'cyclic'\n",
         "noise_multiplier must be a finite number > 0"),
        ("dataset_size = 1000\nbatch_size = 10\nnoise_multiplier = 1.0\nepochs = 1\nsampling = 'cyclic'\ndelta = 2\n",
         "delta must be in (0, 1)"),
        ("dataset_size = 1000\nbatch_size = 10\nnoise_multiplier = 1.0\nsampling = 'cyclic'\n",
         "exactly one of steps and epochs"),
        ("name = 3\n", "name must be a string"),
    ],
    ids=["unknown-key", "bad-toml", "bad-value", "bad-delta", "missing-steps", "bad-name"],
)  # fmt: skip
def test_bad_config_exits_with_status_2(capsys, tmp_path, content, message):
    path = tmp_path / "scenario.toml"
    path.write_text(content)
    code, out, err = run(capsys, "--config", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_missing_config_file_and_incomplete_flags_exit_with_status_2(capsys, tmp_path):
    code, _, err = run(capsys, "--config", str(tmp_path / "nope.toml"))
    assert code == 2 and "config must be a readable TOML file" in err
    code, _, err = run(capsys, "--dataset-size", "100", "--batch-size", "10")
    assert code == 2 and "--noise-multiplier is required" in err and "do not modify the built-in" in err
    code, _, err = run(capsys, "--epochs", "10")  # no silent mix with the built-in scenario's assumptions
    assert code == 2 and "--dataset-size is required" in err
    code, _, err = run(capsys, "--format", "yaml")
    assert code == 2 and err.count("\n") == 1


# ---------------------------------------------------------------- the plot

SMALL = dict(dataset_size=1000, batch_size=100, noise_multiplier=2.0, learning_rate=0.5, epochs=6, sampling="cyclic",
             smoothness=1.0, gradient_norms_within_clip=True)  # fmt: skip


def test_sweep_epochs():
    assert compare.sweep_epochs(1) == [1]
    assert compare.sweep_epochs(6, points=25) == [1, 2, 3, 4, 5, 6]
    grid = compare.sweep_epochs(100, points=25)
    assert grid[0] == 1 and grid[-1] == 100 and len(grid) == 25
    with pytest.raises(ValueError, match="points must be an integer >= 2"):
        compare.sweep_epochs(10, points=1)


def test_progress_bar_when_asked(capsys):
    pytest.importorskip("tqdm")
    compare.epsilon_curves(SMALL, 1e-5, points=2, progress=True)
    assert "epsilon sweep" in capsys.readouterr().err
    compare.epsilon_curves(SMALL, 1e-5, points=2)  # stderr is not a terminal under pytest: no bar
    assert capsys.readouterr().err == ""


def test_epsilon_curves_end_at_the_table():
    epochs, curves = compare.epsilon_curves(SMALL, 1e-5, points=3)
    assert epochs.tolist() == [1.0, 4.0, 6.0]  # 1, round(3.5) = 4, 6
    table = compare.compare(1e-5, **SMALL)
    by_id = {c.id: c for c in curves}
    assert "opacus-gdp" not in by_id
    for row in table.rows:
        if row.epsilon is not None and row.id in by_id:
            assert by_id[row.id].epsilon[-1] == pytest.approx(row.epsilon, rel=1e-12)
            assert by_id[row.id].valid == row.valid
    comp = by_id["composition"].epsilon
    assert (np.diff(comp) > 0).all()  # composition grows with the epochs


def test_plot_is_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = compare.write_plot(SMALL, 1e-5, tmp_path / "eps.png", points=3, title="test", progress=False)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    code, out, err = run(capsys, "--config", str(SCENARIOS[0].parent / "cyclic-clipping-kong-ribero.toml"),
                         "--epochs", "3", "--plot", str(tmp_path / "cli.png"))  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "cli.png").read_bytes()[:4] == b"\x89PNG" and "Plot written to" in out


def test_plot_without_matplotlib_says_how_to_install(monkeypatch, tmp_path, capsys):
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(ImportError, match=r"pip install 'lastiter-plugins\[plot\]'"):
        compare.write_plot(SMALL, 1e-5, tmp_path / "x.png")
    code, _, err = run(capsys, "--config", str(SCENARIOS[0]), "--plot", str(tmp_path / "x.png"))
    assert code == 2 and "lastiter-plugins[plot]" in err and err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_plot_refuses_an_old_matplotlib(monkeypatch, tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    monkeypatch.setattr(matplotlib, "__version__", "3.5.1")
    with pytest.raises(plot.PlotDependencyError, match=r"matplotlib >= 3\.7\. Found 3\.5\.1"):
        compare.write_plot(SMALL, 1e-5, tmp_path / "x.png")


def test_plot_into_a_missing_folder_exits_with_status_2(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = run(capsys, "--plot", str(tmp_path / "no" / "such" / "x.png"))
    assert code == 2 and "plot path must be in an existing folder" in err


def test_a_bounds_own_warnings_reach_its_row():
    """An optimal order at the edge of the grid is noted on the row of the bound it concerns."""
    params = dict(dataset_size=1000, batch_size=10, noise_multiplier=0.3, epochs=2, sampling="cyclic",
                  learning_rate=0.1, smoothness=1.0, gradient_norms_within_clip=True)  # fmt: skip
    result = compare.compare(1e-5, orders=[2.0, 3.0], **params)
    assert any("edge of the order grid" in note for note in result.row("composition").notes)
