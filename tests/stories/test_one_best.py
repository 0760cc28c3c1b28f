"""One best everywhere: every entry point reports the same number for the same pipeline.

The issue's examples: a reshuffling pipeline (n = 60000, b = 1500, z = 3, E = 100), where compare
said 46-50 via dp-accounting's PLD while the API said 52.58 via RDP composition, and Opacus' default
Poisson pipeline, where compare said 1.64 and the API 1.80. Now compare's baselines are the
registry's rows and its best line is the registry's best: one number (49.88, 1.64), by construction.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest

import lastiter_plugins as lp
from lastiter_plugins import compare
from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent
from lastiter_plugins.cli import main
from tests.support import cli_flags

DELTA = 1e-5
RESHUFFLE = dict(dataset_size=60000, batch_size=1500, noise_multiplier=3.0, epochs=100, sampling="reshuffle")
POISSON = dict(dataset_size=60000, batch_size=256, noise_multiplier=1.1, epochs=30, sampling="poisson",
               relation="add_or_remove_one")  # fmt: skip
PIPELINES = {
    "reshuffle": (RESHUFFLE, 49.8837, "composition-gdp-epochs"),
    "poisson": (POISSON, 1.63851, "composition-pld-poisson"),
}


@pytest.fixture(scope="module", params=sorted(PIPELINES))
def case(request):
    params, value, winner = PIPELINES[request.param]
    best = lp.epsilon("best", DELTA, **params)
    assert best.winner == winner and best.epsilon == pytest.approx(value, rel=1e-4)
    return params, best


def _run(capsys, *argv) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_compare_best_line_is_best(case):
    params, best = case
    result = compare.compare(DELTA, **params)
    line = next(b for b in result.best if b.declared)
    assert (line.epsilon, line.winner, line.relation, line.protects) == (
        best.epsilon,
        best.winner,
        best.relation.value,
        best.protects.value,
    )
    assert result.row(best.winner).epsilon == best.epsilon and result.row(best.winner).counted


def test_cli_epsilon_and_compare_json_give_best(case, capsys):
    params, best = case
    flags = cli_flags(params)
    epsilon = _run(capsys, "epsilon", "--bound", "best", "--delta", "1e-5", *flags, "--format", "json")
    assert (epsilon["epsilon"], epsilon["winner"], epsilon["relation"]) == (
        best.epsilon,
        best.winner,
        best.relation.value,
    )
    table = _run(capsys, "compare", *flags, "--delta", "1e-5", "--format", "json")
    declared = next(b for b in table["best"] if b["declared"])
    assert (declared["epsilon"], declared["winner"], declared["relation"]) == (
        best.epsilon,
        best.winner,
        best.relation.value,
    )


def test_calibration_inverts_the_same_best(case, capsys):
    params, best = case
    pipeline = {k: v for k, v in params.items() if k != "noise_multiplier"}
    z = lp.calibrate_noise("best", best.epsilon, DELTA, **pipeline).noise_multiplier
    assert z == pytest.approx(params["noise_multiplier"], rel=2e-4)  # the same epsilon(z), inverted
    assert lp.epsilon("best", DELTA, **{**params, "noise_multiplier": z}).epsilon <= best.epsilon
    flags = cli_flags(pipeline)
    out = _run(capsys, "calibrate", "--bound", "best", "--target-epsilon", repr(best.epsilon), "--delta", "1e-5",
               *flags, "--format", "json")  # fmt: skip
    assert out["noise_multiplier"] == z


def test_dp_accounting_accountant_answers_a_run_with_best(case):
    params, best = case
    config, _ = lp.build(**params)
    relation = (
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
        if config.relation is lp.Relation.ADD_OR_REMOVE_ONE
        else dp_accounting.NeighboringRelation.REPLACE_ONE
    )
    event = LastIterateDpSgdEvent(config.sampling.value, config.dataset_size, config.batch_size,
                                  config.noise_multiplier, config.steps, None)  # fmt: skip
    accountant = LastIterateAccountant(neighboring_relation=relation).compose(event)
    assert accountant.get_epsilon(DELTA) == best.epsilon
    assert accountant.get_delta(best.epsilon) <= DELTA * (1 + 1e-9)


def test_opacus_report_prints_best(case):
    pytest.importorskip("opacus")
    from lastiter_plugins import host
    from lastiter_plugins.adapters.opacus._declaration import Registration
    from lastiter_plugins.adapters.opacus._report import build_report

    params, best = case
    config, assumptions = lp.build(**params)
    reg = Registration("run", lp.BEST, config.sampling, config.relation, config.dataset_size, config.learning_rate,
                       assumptions)  # fmt: skip
    report = build_report(reg, host.account(reg.declaration(), config, assumptions, DELTA), DELTA, None)
    row = next(r for r in report.rows if r.bound == lp.BEST)
    assert (row.epsilon, row.reasons) == (best.epsilon, (f"via {best.winner}",))
    assert report.best == str(best)


def test_keras_statement_prints_best():
    pytest.importorskip("tensorflow_privacy")
    from lastiter_plugins.adapters.tf_privacy import compute_last_iterate_privacy_statement

    best = lp.epsilon("best", DELTA, **RESHUFFLE)
    text = compute_last_iterate_privacy_statement(
        number_of_examples=60000, batch_size=1500, num_epochs=100, noise_multiplier=3.0, delta=DELTA,
        l2_norm_clip=1.0, learning_rate=0.1, sampling="reshuffle",
    )  # fmt: skip
    assert f"{'best':<28}{best.epsilon:12.3f}   (via {best.winner};" in text
    assert math.isfinite(best.epsilon)
