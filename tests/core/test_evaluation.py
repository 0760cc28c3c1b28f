"""lastiter_plugins.evaluation: one candidate set for ``best``, one rule, one minimum; delta at epsilon
converted as epsilon is; the lower end is a number or None with its reason, never inf, never an error
for a valid number.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import lastiter_plugins as lp
from lastiter_plugins import calibration, evaluation, host
from lastiter_plugins.api import build
from lastiter_plugins.lower_end import LowerBound

DELTA = 1e-5
PIPELINES = {
    "shuffle_once, strongly convex, projected": dict(
        dataset_size=10000, batch_size=100, noise_multiplier=4.0, clip_norm=1.05, learning_rate=1.0, epochs=100,
        sampling="shuffle_once", smoothness=0.26, strong_convexity=0.01, diameter=10.0,
        gradient_norms_within_clip=True,
    ),
    "reshuffle, no declarations": dict(dataset_size=2000, batch_size=100, noise_multiplier=1.0, epochs=20,
                                       sampling="reshuffle"),
    "poisson, add-or-remove, GLM": dict(
        dataset_size=450, batch_size=45, noise_multiplier=3.2, epochs=20, sampling="poisson",
        relation="add_or_remove_one", learning_rate=1 / 0.26, smoothness=0.26, strong_convexity=0.01,
        clipped_loss_convex_smooth=True, l2_outside_clip=True,
    ),
    "poisson, replace-one": dict(dataset_size=1000, batch_size=50, noise_multiplier=4.0, steps=400,
                                 sampling="poisson", learning_rate=1.0, smoothness=0.25, strong_convexity=0.05,
                                 gradient_norms_within_clip=True),
    "random_batch": dict(dataset_size=1000, batch_size=100, noise_multiplier=1.5, steps=2000,
                         sampling="random_batch"),
    "cyclic, add-or-remove (nothing applies)": dict(dataset_size=100, batch_size=10, noise_multiplier=1.0,
                                                   epochs=2, sampling="cyclic", relation="add_or_remove_one"),
}  # fmt: skip


@pytest.mark.parametrize("params", PIPELINES.values(), ids=PIPELINES.keys())
def test_every_caller_reads_the_one_candidate_set(params):
    config, assumptions = build(**params)
    candidates = evaluation.best_candidates(config, assumptions)
    ids = [spec.id for spec in candidates]
    # the rule, row by row, on the full evaluation
    evaluated = evaluation.evaluate_all(config, assumptions)
    assert ids == [bid for bid, e in evaluated.items() if evaluation.counts_for_best(e, config.relation)]
    assert all(spec.proof.proven for spec in candidates)
    # the API's applicable_bounds names the same rows for best
    best_row = lp.applicable_bounds(**params)[lp.BEST]
    assert best_row.applies == bool(ids)
    assert best_row.reference.startswith("minimum over " + (", ".join(ids) or "nothing"))
    # calibration searches over the same rows
    if ids:
        search = calibration._BestSearch(config, assumptions, DELTA, None, 1.0)
        assert [spec.id for spec in search._candidates] == ids
        # the host contract's rows of best too (the dp-accounting adapter's mu-GDP search and statements)
        assert [spec.id for spec in host.rows(lp.BEST, config, assumptions)] == ids
        # and best's winner is one of them
        assert lp.epsilon("best", DELTA, **params).winner in ids
    else:
        with pytest.raises(lp.NotApplicableError, match="no proven bound applies"):
            lp.epsilon("best", DELTA, **params)
        with pytest.raises(lp.NotApplicableError, match="no proven bound applies"):
            evaluation.delta_of(lp.BEST, config, assumptions, 1.0)


def test_the_candidate_rule_is_written_once():
    """No module of the product re-derives best's candidates (applies + proven [+ relation])."""
    root = Path(lp.__file__).parent
    import lastiter_plugins.adapters as adapters_package

    files = [*root.rglob("*.py"), *Path(adapters_package.__file__).parent.rglob("*.py")]
    pattern = re.compile(r"applies and \w+\.proof\.proven|proof\.proven and [^\n]*\.applies\b")
    found = [str(p) for p in files for line in p.read_text().splitlines() if pattern.search(line)]
    assert [Path(f).name for f in found] == ["evaluation.py"], found


@pytest.mark.parametrize("params", list(PIPELINES.values())[:5], ids=list(PIPELINES)[:5])
def test_delta_at_epsilon_inverts_epsilon_at_delta(params):
    """delta_of(best) at the epsilon best reports for delta is at most delta (to rounding), and for each
    candidate at most 1."""
    config, assumptions = build(**params)
    result = lp.epsilon("best", DELTA, **params)
    delta, _ = evaluation.delta_of(lp.BEST, config, assumptions, result.epsilon)
    assert delta <= DELTA * (1 + 1e-6)
    delta_winner, _ = evaluation.delta_of(result.winner, config, assumptions, result.epsilon)
    assert delta_winner <= DELTA * (1 + 1e-6)
    assert delta <= delta_winner  # best is the minimum over its candidates


def test_a_lower_end_that_cannot_be_computed_is_none_with_its_reason(monkeypatch):
    params = PIPELINES["reshuffle, no declarations"]

    def overflow(config, assumptions, delta):
        raise OverflowError("math range error")

    monkeypatch.setattr("lastiter_plugins.lower_end.lower_bound", overflow)
    result = lp.epsilon("best", DELTA, lower_bound=True, **params)
    assert result.lower_bound is None and "OverflowError" in result.lower_bound_note
    assert result.epsilon == lp.epsilon("best", DELTA, **params).epsilon

    monkeypatch.setattr("lastiter_plugins.lower_end.lower_bound", lambda c, a, d: LowerBound(float("inf"), "G1"))
    result = lp.epsilon("best", DELTA, lower_bound=True, **params)
    assert result.lower_bound is None and "beyond what can be computed" in result.lower_bound_note


HUGE_RUN = ["--dataset-size", "200", "--batch-size", "20", "--noise-multiplier", "2", "--learning-rate", "0.5",
            "--steps", "10000000000", "--sampling", "reshuffle", "--smoothness", "0.5",
            "--gradient-norms-within-clip"]  # fmt: skip


def test_a_valid_epsilon_beyond_1e7_is_printed_with_its_lower_end_or_why_none():
    """The issue's command: the lower end's search stopped at 1e7 and called the exact value inf, which
    turned a valid epsilon (5.004e7) into an error. Now the number stands; at 1e10 steps the linear
    instance is not computed (None, and why), and at 1e7 steps the lower end lies just below best."""
    params = dict(dataset_size=200, batch_size=20, noise_multiplier=2.0, learning_rate=0.5, steps=10**10,
                  sampling="reshuffle", smoothness=0.5, gradient_norms_within_clip=True)  # fmt: skip
    result = lp.epsilon("best", DELTA, lower_bound=True, **params)
    assert result.epsilon == pytest.approx(5.004e7, rel=1e-3)
    assert result.lower_bound is None and "more than 1e+08 steps" in result.lower_bound_note
    shorter = lp.epsilon("best", DELTA, lower_bound=True, **{**params, "steps": 10**7, "noise_multiplier": 0.05})
    assert shorter.epsilon > 1e7  # beyond the old search's cap
    assert shorter.lower_bound is not None and 0.99 * shorter.epsilon <= shorter.lower_bound <= shorter.epsilon
    proc = subprocess.run(
        [sys.executable, "-m", "lastiter_plugins.cli", "epsilon", "--bound", "best", "--delta", "1e-5", *HUGE_RUN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "5.004e+07" in proc.stdout
