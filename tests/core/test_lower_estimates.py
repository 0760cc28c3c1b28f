"""Lower estimates from a few orders (docs/derivations/lower-estimates.md#few-orders): the envelope of a Renyi curve,
the estimate of the epsilon refined from it, and `best` skipping the rows the estimate rules out."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins import conversion, evaluation, registry
from lastiter_plugins.conversion import epsilon_lower_estimate, monotone_envelope, refine_epsilon
from lastiter_plugins.validation import DEFAULT_ORDERS

SAMPLINGS = (
    dict(sampling="cyclic"),
    dict(sampling="shuffle_once"),
    dict(sampling="reshuffle"),
    dict(sampling="random_batch"),
    dict(sampling="poisson", relation="add_or_remove_one"),
    dict(sampling="poisson", relation="replace_one"),
)


def _random_pipeline(rng: np.random.Generator, i: int) -> dict:
    n = int(rng.integers(50, 100000))
    b = int(rng.integers(1, max(2, n // 4)))
    smoothness = float(np.exp(rng.uniform(np.log(0.1), np.log(10.0))))
    params = dict(
        dataset_size=n,
        batch_size=b,
        noise_multiplier=float(np.exp(rng.uniform(np.log(0.4), np.log(20.0)))),
        steps=int(np.exp(rng.uniform(0.0, np.log(2 * 10**5)))),
        smoothness=smoothness,
        learning_rate=float(rng.uniform(0.05, 1.5)) / smoothness,
        gradient_norms_within_clip=True,
        **SAMPLINGS[i % len(SAMPLINGS)],
    )
    if rng.random() < 0.6:
        params["strong_convexity"] = smoothness * float(np.exp(rng.uniform(np.log(1e-4), np.log(0.5))))
    if rng.random() < 0.6:
        params["diameter"] = float(np.exp(rng.uniform(np.log(1e-2), np.log(10.0))))
    if params["sampling"] == "poisson":
        params["learning_rate"] *= b / n
    return params


def _estimated_rows(config, assumptions):
    """The proven rows that apply and whose epsilon docs/derivations/lower-estimates.md#few-orders's estimate bounds
    (default grid)."""
    for bid, spec in registry.BOUNDS.items():
        proven_with_estimate = spec.proof.proven and evaluation._has_grid_estimate(spec, True)
        if proven_with_estimate and registry.applicability(spec, config, assumptions).applies:
            yield bid, spec


def _draws(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for i in range(count):
        params = _random_pipeline(rng, i)
        try:
            config, assumptions = lp.build(**params)
        except ValueError:
            continue
        yield params, config, assumptions, float(np.exp(rng.uniform(np.log(1e-10), np.log(0.1))))


def _estimate_and_reported(bid, spec, config, assumptions, delta):
    reported = evaluation.evaluate_bound(spec, config, assumptions, delta).result.epsilon
    estimate = epsilon_lower_estimate(
        lambda new: registry.estimate_curve(spec, config, assumptions, new), DEFAULT_ORDERS, delta, math.inf, rounds=60
    )
    return estimate, reported


@pytest.mark.filterwarnings("ignore:the optimal Renyi order")
def test_estimate_never_above_the_reported_epsilon_and_close_to_it():
    """With no bar (every piece split down to one grid step) the estimate is a lower bound on what the
    row reports; it is within 10% of it on most draws and within a factor 1.7 on all (one grid step of
    the curve is what it gives away: 2 to 3 at small orders), so a needlessly loose estimate fails too."""
    checked, close = 0, 0
    for _params, config, assumptions, delta in _draws(48, seed=22):
        for bid, spec in _estimated_rows(config, assumptions):
            estimate, reported = _estimate_and_reported(bid, spec, config, assumptions, delta)
            assert estimate <= reported, (bid, config, delta, estimate, reported)
            if math.isfinite(reported) and reported > 0:
                checked += 1
                close += estimate >= 0.9 * reported
                assert estimate >= reported / 1.7, (bid, config, delta, estimate, reported)
    assert checked >= 40, checked
    assert close >= 0.6 * checked, (close, checked)


@pytest.mark.filterwarnings("ignore:the optimal Renyi order")
def test_the_validity_check_can_fail(monkeypatch):
    """Taking h at each piece's left end (an optimistic infimum: h decreases up to 1/delta) makes the
    estimate exceed the reported epsilon on some draw, so the test above can catch a wrong estimate."""
    log_inv = {}

    def left_end(lo, hi, delta):
        log_inv["L"] = -math.log(delta)
        return np.log1p(-1.0 / lo) + (-math.log(delta) - np.log(lo)) / (lo - 1.0)

    monkeypatch.setattr(conversion, "_h_infimum", left_end)
    above = 0
    for _params, config, assumptions, delta in _draws(24, seed=22):
        for bid, spec in _estimated_rows(config, assumptions):
            estimate, reported = _estimate_and_reported(bid, spec, config, assumptions, delta)
            above += estimate > reported
    assert above > 0


def test_every_estimated_row_computes_its_curve_order_by_order():
    """The estimate's argument uses the curve at a few orders as the full curve's values there: a row whose
    value at one order depended on the other orders asked would break it."""
    rng = np.random.default_rng(5)
    checked = 0
    for _params, config, assumptions, _delta in _draws(24, seed=22):
        for _bid, spec in _estimated_rows(config, assumptions):
            full = registry.rdp_curve(spec, config, assumptions, DEFAULT_ORDERS)
            some = np.unique(rng.integers(0, DEFAULT_ORDERS.size, 7))
            np.testing.assert_array_equal(
                registry.rdp_curve(spec, config, assumptions, DEFAULT_ORDERS[some]), full[some]
            )
            checked += 1
    assert checked >= 20, checked


def test_every_estimate_curve_is_at_or_below_the_curve():
    """A row's cheaper curve for its estimate (docs/derivations/lower-estimates.md#cheaper-curve) lies at or below its
    curve at every order;
    ye-shokri-random has one, and it is not the curve itself (else the check tests nothing)."""
    checked, below = 0, 0
    for _params, config, assumptions, _delta in _draws(120, seed=7):
        for bid, spec in _estimated_rows(config, assumptions):
            if spec.estimate_curve is None:
                continue
            full = registry.rdp_curve(spec, config, assumptions, DEFAULT_ORDERS)
            cheap = registry.estimate_curve(spec, config, assumptions, DEFAULT_ORDERS)
            assert np.all(cheap <= full), (bid, config)
            checked += 1
            below += bool(np.any(cheap < full))
    assert checked >= 5 and below > 0, (checked, below)


def test_envelope_raises_a_dip_and_the_refined_orders_above_it():
    orders = np.array([1.5, 2.0, 3.0, 4.0, 8.0])
    curve = np.array([1.0, 3.0, 2.0, np.inf, 2.5])
    raised_at, raised = monotone_envelope(lambda new: np.full(np.shape(new), 0.5), orders, curve)
    np.testing.assert_array_equal(raised, [1.0, 3.0, 3.0, np.inf, 3.0])
    np.testing.assert_array_equal(raised_at(np.array([1.2, 1.7, 3.5, 9.0])), [0.5, 1.0, 3.0, 3.0])
    # unsorted user grids: raised in the order of the orders, returned in the caller's order
    _, raised = monotone_envelope(lambda new: new, orders[::-1], curve[::-1])
    np.testing.assert_array_equal(raised, [3.0, np.inf, 3.0, 3.0, 1.0])


@pytest.mark.parametrize("sampling", [s["sampling"] for s in SAMPLINGS[:4]])
def test_envelope_leaves_the_rows_numbers_unchanged_on_the_anchor_pipeline(sampling):
    """Every Renyi row is non-decreasing on the default grid up to rounding: its epsilon with the envelope
    equals the refined epsilon of its own curve to 1e-12 (benchmarks/bench_core_speed.py's pipeline)."""
    params = dict(dataset_size=60000, batch_size=600, noise_multiplier=1.0, learning_rate=0.5, steps=10**5,
                  smoothness=1.0, strong_convexity=0.05, gradient_norms_within_clip=True, diameter=1.0,
                  sampling=sampling)  # fmt: skip
    config, assumptions = lp.build(**params)
    rows = list(_estimated_rows(config, assumptions))
    assert rows
    for bid, spec in rows:
        curve = registry.rdp_curve(spec, config, assumptions, DEFAULT_ORDERS)
        own, _ = refine_epsilon(lambda new, s=spec: registry.rdp_curve(s, config, assumptions, new),
                                DEFAULT_ORDERS, curve, 1e-5)  # fmt: skip
        reported = evaluation.evaluate_bound(spec, config, assumptions, 1e-5).result.epsilon
        assert reported == pytest.approx(own, rel=1e-12, abs=0), bid


@pytest.mark.filterwarnings("ignore:the optimal Renyi order")
def test_best_with_skipping_is_the_minimum_over_every_row():
    """Skipping is exact: best's number and winner are those of computing every row, on random pipelines;
    and on these draws some row is skipped by its estimate (the test exercises the skip)."""
    skipped = 0
    for _params, config, assumptions, delta in _draws(20, seed=23):
        try:
            fast = evaluation.evaluate_for_best(config, assumptions, delta)
        except lp.NotApplicableError:
            continue
        full = evaluation.evaluate_all(config, assumptions, delta)
        a, b = evaluation.best_of(fast.values(), config.relation), evaluation.best_of(full.values(), config.relation)
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.winner, a.epsilon) == (b.winner, b.epsilon), (config, delta)
        skipped += sum(1 for e in fast.values() if e.notes and e.notes[0].startswith("not computed"))
    assert skipped >= 10, skipped


def test_best_skips_the_losing_renyi_rows_of_a_random_batch_pipeline():
    """benchmarks/bench_core_speed.py's random-batch pipeline: the random-batch mixture wins, and the three
    Renyi rows that lose are not computed, each saying why."""
    params = dict(dataset_size=60000, batch_size=600, noise_multiplier=1.0, learning_rate=0.5, steps=10**4,
                  smoothness=1.0, strong_convexity=0.05, gradient_norms_within_clip=True, diameter=1.0,
                  sampling="random_batch")  # fmt: skip
    config, assumptions = lp.build(**params)
    rows = evaluation.evaluate_for_best(config, assumptions, 1e-5)
    assert evaluation.best_of(rows.values(), config.relation).winner == "shifted-interpolation-random-batch"
    for bid in ("bounded-domain-random", "ye-shokri-random", "composition"):
        assert rows[bid].result is None and "not computed" in rows[bid].notes[0], bid


def test_calibration_skips_rows_whose_estimate_is_above_the_target():
    """calibrate_noise("best") skips the rows whose estimate is above the target (the random-batch rows
    of the test above): the noise multiplier it returns meets the target with best, and one 2 rtol below
    misses it, so nothing is lost by skipping."""
    params = dict(dataset_size=60000, batch_size=600, learning_rate=0.5, steps=10**4, smoothness=1.0,
                  strong_convexity=0.05, gradient_norms_within_clip=True, diameter=1.0, sampling="random_batch")  # fmt: skip
    z = lp.calibrate_noise("best", 1.0, 1e-5, **params).noise_multiplier
    assert lp.epsilon("best", 1e-5, noise_multiplier=z, **params).epsilon <= 1.0
    assert lp.epsilon("best", 1e-5, noise_multiplier=z / (1 + 2e-4), **params).epsilon > 1.0
