"""bounded-domain-random (lastiter_plugins/bounds/bounded_domain.py): the formula against
an independent enumeration of its derivation, the search over the window, and
ground truth (G3 projected walk: random_batch and poisson; G2 strongly convex
quadratics: random_batch). Tightness ratios are printed (``pytest -s``).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import special

from lastiter_plugins.bounds import bounded_domain
from lastiter_plugins.bounds.bounded_domain import random_batch_rdp
from lastiter_plugins.bounds.composition import random_batch_rdp as composition_rdp
from lastiter_plugins.lower_end.exact import g2_divergence, g2_params, g3_divergence, g3_params
from lastiter_plugins.validation import DEFAULT_ORDERS
from lastiter_plugins.verification import fuzz

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])


def _bound(params, orders=ORDERS, *, diameter=None, contraction=None):
    """The registry's mapping: q = b/n, z, T, D, b, eta, C."""
    return random_batch_rdp(
        orders,
        sampling_probability=params["batch_size"] / params["dataset_size"],
        noise_multiplier=params["noise_multiplier"],
        steps=params["steps"],
        diameter=params["diameter"] if diameter is None else diameter,
        batch_size=params["batch_size"],
        learning_rate=params["learning_rate"],
        clip_norm=params["clip_norm"],
        contraction=contraction,
    )


# ------------------------------------------------------------------ the formula


def _enumerated(orders, q, z, d, steps, contraction=None):
    r"""min over R of (1/(alpha-1)) log E_u exp((alpha-1) cost_R(u)), by enumerating every
    inclusion pattern u and writing the per-sequence PABI cost directly (absorb each use
    immediately; unused before the window: start with shift 0; else remove the diameter
    with a'_j = d/R, or d c^{R+j}/S_R under contraction c)."""
    best = np.full(orders.size, np.inf)
    patterns = np.array(list(itertools.product((0, 1), repeat=steps)), dtype=float)
    k = patterns.sum(axis=1)
    weights = q**k * (1.0 - q) ** (steps - k)
    for window in range(1, steps + 1):
        prefix, tail = patterns[:, : steps - window], patterns[:, steps - window :]
        unused_before = prefix.sum(axis=1) == 0
        schedules = [np.full(window, d / window)]
        if contraction is not None:
            s_r = sum(contraction ** (2 * i) for i in range(window))
            j = np.arange(window)[::-1]  # j = T-1-t
            schedules.append(d * contraction ** (window + j) / s_r)
        for y in schedules:
            for i, a in enumerate(orders):
                cost_d = 0.5 * a * np.sum((y[None, :] + 2.0 * tail / z) ** 2, axis=1)
                cost_0 = 2.0 * a / z**2 * tail.sum(axis=1)
                cost = np.where(unused_before, cost_0, cost_d)
                value = special.logsumexp((a - 1.0) * cost, b=weights) / (a - 1.0)
                best[i] = min(best[i], value)
    return best


@pytest.mark.parametrize(
    ("q", "z", "d", "steps", "contraction"),
    [(0.5, 1.0, 0.7, 6, None), (0.2, 2.0, 3.0, 8, None), (1.0, 0.8, 0.4, 5, None), (0.3, 1.5, 2.0, 7, 0.6),
     (0.05, 0.9, 5.0, 8, 0.3)],
    ids=["half", "small-q", "q-one", "contracting", "strong-contraction"],
)  # fmt: skip
def test_formula_equals_enumeration_of_the_derivation(q, z, d, steps, contraction):
    eta, c_norm, b = 0.3, 1.7, 3
    diameter = d * eta * z * c_norm / b
    got = random_batch_rdp(ORDERS, sampling_probability=q, noise_multiplier=z, steps=steps, diameter=diameter,
                           batch_size=b, learning_rate=eta, clip_norm=c_norm, contraction=contraction)  # fmt: skip
    np.testing.assert_allclose(got, _enumerated(ORDERS, q, z, d, steps, contraction), rtol=1e-9)


def test_one_full_batch_step_is_the_gaussian_mechanism():
    # T = 1: no diameter needed, the Gaussian mechanism with sensitivity 2C
    one = random_batch_rdp(ORDERS, sampling_probability=1.0, noise_multiplier=2.0, steps=1, diameter=5.0,
                           batch_size=4, learning_rate=0.1, clip_norm=1.0)  # fmt: skip
    np.testing.assert_allclose(one, 2 * ORDERS / 4.0, rtol=1e-12)
    # q = 1 over a long run is Kong & Ribero's Theorem 2.2 minimised over the window: tests/core/bounds/test_kong_ribero.py


def test_search_over_the_window_is_within_the_family_and_near_its_minimum():
    """brute force over every R in 1..T: min of the refined form <= value <= min of the plain form."""
    q, z, d, steps = 0.02, 1.2, 40.0, 3000
    eta, c_norm, b = 0.5, 1.0, 10
    got = random_batch_rdp(ORDERS, sampling_probability=q, noise_multiplier=z, steps=steps,
                           diameter=d * eta * z * c_norm / b, batch_size=b, learning_rate=eta, clip_norm=c_norm)  # fmt: skip
    r = np.arange(1, steps + 1, dtype=float)[:, None]
    a = ORDERS[None, :]

    def log_mgf(x):  # log(1 - q + q e^{(alpha-1) x}), written independently of the module
        return np.logaddexp(math.log1p(-q), math.log(q) + (a - 1) * x)

    plain = a * d**2 / (2 * r) + r / (a - 1) * log_mgf(2 * a / z**2 + 2 * a * d / (z * r))
    log_none = (steps - r) * math.log1p(-q)
    with np.errstate(divide="ignore"):
        refined = np.logaddexp(log_none + r * log_mgf(2 * a / z**2),
                               np.log(-np.expm1(log_none)) + (a - 1) * plain) / (a - 1)  # fmt: skip
    assert np.all(got >= refined.min(axis=0) * (1 - 1e-12))
    assert np.all(got <= plain.min(axis=0) * (1 + 1e-12))
    assert np.all(got <= refined.min(axis=0) * (1 + 1e-3))


@pytest.mark.parametrize(
    ("q", "z", "d", "steps"),
    [(0.01, 1.0, 1200.0, 10**6), (0.3, 0.7, 3.0, 50), (0.001, 4.0, 1e4, 10**9), (0.5, 2.0, 0.1, 10)],
)
def test_convex_minimiser_is_where_the_derivative_turns(q, z, d, steps):
    """The convex window bound's minimiser (a grid refined 7 times) against a plain bisection written
    here on the derivative of the same function in log R, to a relative 1e-9 in R."""
    orders = np.array([1.1, 1.5, 2.0, 4.0, 8.0, 32.0, 256.0])
    am1 = orders - 1.0
    got = bounded_domain._convex_minimiser(orders, am1, d, z, q, steps)

    def derivative(log_r):  # d/dR of alpha d^2 / (2R) + R L(kappa0 + beta / R), times (alpha - 1)
        r = np.exp(log_r)
        x = 2 * orders / z**2 + 2 * orders * d / (z * r)
        ell = np.logaddexp(math.log1p(-q), math.log(q) + am1 * x)
        slope = np.exp(math.log(q) + am1 * x - ell)
        return -am1 * orders * d**2 / 2 / r**2 + ell - am1 * (2 * orders * d / z) * slope / r

    lo, hi = np.zeros(orders.size), np.full(orders.size, math.log(steps))
    for _ in range(200):
        mid = (lo + hi) / 2
        rising = derivative(mid) >= 0
        lo, hi = np.where(rising, lo, mid), np.where(rising, mid, hi)
    np.testing.assert_allclose(got, np.exp((lo + hi) / 2), rtol=1e-9)


def test_block_edges_are_each_windows_own():
    """The trapezoid's block edges, built once for all windows, against each window's own list:
    singletons, blocks over which c^j falls by e^-1/2, index doubling, the window itself."""
    for c in (0.3, 0.9, 0.975, 0.9999):
        log_c = math.log(c)
        windows = np.array([1.0, 2.0, 7.0, 8.0, 9.0, 16.0, 17.0, 100.0, 2048.0, 12345.0, 1e6])
        for window, got in zip(windows, bounded_domain._block_edges(windows, log_c), strict=True):
            edges = {float(j) for j in range(min(8, int(window)) + 1)}
            ratio = {math.ceil(k * 0.5 / -log_c) for k in range(1, 61)}
            doubling = {8.0 * 2**k for k in range(64)}
            edges |= {float(e) for e in ratio | doubling if 8 < e <= window} | {window}
            np.testing.assert_array_equal(got, sorted(edges))


def test_contracting_block_sum_is_an_upper_bound_of_the_exact_sum():
    orders, am1 = ORDERS, ORDERS - 1.0
    q, z, d, c = 0.1, 1.5, 30.0, 0.999
    for window in (40.0, 5000.0):
        got = bounded_domain._contracting_scaled(window, am1, orders, d, z, q, c)
        j = np.arange(int(window))
        s_r = np.sum(c ** (2 * j))
        x = 2 * orders[:, None] / z**2 + 2 * orders[:, None] * d * c ** (window + j)[None, :] / (z * s_r)
        exact = am1 * orders * d**2 * c ** (2 * window) / s_r / 2 + np.sum(
            np.logaddexp(math.log1p(-q), math.log(q) + am1[:, None] * x), axis=1
        )
        assert np.all(got >= exact * (1 - 1e-12))
        assert np.all(got <= exact * (1 + 1e-3))


# ------------------------------------------------------------------ ground truth


def _g3(n, b, z, d_over_s, steps, sampling, lr=0.1, clip=1.0, x0=0.0):
    params = g3_params(diameter=d_over_s * lr * z * clip / b, dataset_size=n, batch_size=b, noise_multiplier=z,
                       steps=steps, learning_rate=lr, clip_norm=clip, sampling=sampling)  # fmt: skip
    return params, g3_divergence(ORDERS, params, x0=x0)[0]


G3_CASES = [  # (n, b, z, D / sigma_p, T): small D, small z, large q, and the no-projection-effect corner
    (1, 1, 0.5, 0.2, 4), (2, 1, 0.5, 0.2, 5), (3, 2, 1.0, 0.5, 8), (4, 4, 4.0, 3.0, 3), (5, 4, 0.7, 0.05, 3),
    (10, 1, 2.0, 1.0, 10), (2, 1, 8.0, 3.0, 6), (3, 1, 4.0, 0.2, 10),
]  # fmt: skip


@pytest.mark.parametrize("sampling", ["random_batch", "poisson"])
@pytest.mark.parametrize("case", G3_CASES, ids=[f"n{c[0]}-b{c[1]}-z{c[2]}-D{c[3]}-T{c[4]}" for c in G3_CASES])
def test_g3_targeted_instances(sampling, case):
    params, exact = _g3(*case, sampling)
    bound = _bound(params)
    assert np.all(bound >= exact.lower), (bound, exact.lower)
    print(f"\nG3 {sampling} {case}: bound/exact {np.round(bound / exact.estimate, 3)}")


def test_g3_tightest_corner_is_close():
    """q = 1, T = 1, D >> drift: the Gaussian mechanism; at orders 1.5 and 2 within 3% of the truth."""
    params, exact = _g3(1, 1, 8.0, 3.0, 1, "random_batch")
    bound = _bound(params)
    assert np.all(bound >= exact.lower)
    assert np.all(bound[:2] <= 1.03 * exact.upper[:2])


G3_FAST = {"max_nodes": 400, "fine_cells": 4000, "tolerance": 2e-3}  # coarser grid: certified, wider interval


def test_g3_randomised_sweep_has_no_violation():
    rng = np.random.default_rng(20261123)
    worst, violations, count = np.inf, [], 0
    for k in range(200):
        instance = fuzz.draw_g3(rng, ("random_batch", "poisson")[k % 2], max_steps=6)
        exact = instance.exact(ORDERS, **G3_FAST)
        bound = _bound(instance.params)
        count += 1
        if np.any(bound < exact.lower):
            violations.append(instance.describe())
        with np.errstate(divide="ignore"):
            worst = min(worst, float(np.min(bound / exact.estimate)))
    print(f"\nG3 sweep: {count} instances, min bound/exact {worst:.4g}")
    assert not violations, violations[:3]


def _g2_case(lam, lr, n, b, z, steps, clip=1.0):
    params = g2_params(strong_convexity=lam, dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps,
                       learning_rate=lr, clip_norm=clip, sampling="random_batch")  # fmt: skip
    c = abs(1.0 - lr * lam)
    # the two processes (common noise) differ by a deterministic vector given the batches, of norm
    # <= (2 eta C / b) sum_{k < tau} c^k: the W_inf bound at the window start that the projection gives
    d_eff = 2.0 * lr * clip / b * sum(c**k for k in range(max(steps - 1, 0)))
    return params, c, d_eff


G2_CASES = [(0.5, 1.0, 2, 1, 1.0, 8), (0.8, 1.0, 3, 1, 0.7, 10), (1.5, 1.0, 2, 1, 2.0, 9), (0.3, 1.0, 4, 2, 1.0, 10)]


@pytest.mark.parametrize("case", G2_CASES, ids=[f"lam{c[0]}-n{c[2]}-z{c[4]}-T{c[5]}" for c in G2_CASES])
def test_g2_strongly_convex_variant_is_above_the_truth_and_used(case):
    params, c, d_eff = _g2_case(*case)
    exact = g2_divergence(ORDERS, params, cells=3000)
    bound = _bound(params, diameter=d_eff, contraction=c)
    convex_only = _bound(params, diameter=d_eff)
    assert np.all(bound >= exact.lower), (bound, exact.lower)
    assert np.any(bound < convex_only * (1 - 1e-3))  # the contracting schedule is what is tested
    print(f"\nG2 {case}: bound/exact {np.round(bound / exact.estimate, 3)}")


def test_g2_randomised_sweep_has_no_violation():
    rng = np.random.default_rng(20261124)
    for _ in range(24):
        lam = float(rng.uniform(0.1, 1.9))
        case = (lam, 1.0, int(rng.integers(1, 5)), 1, float(np.exp(rng.uniform(np.log(0.5), np.log(3.0)))),
                int(rng.integers(1, 9)))  # fmt: skip
        case = (case[0], case[1], max(case[2], case[3]), case[3], case[4], case[5])
        params, c, d_eff = _g2_case(*case)
        if d_eff == 0.0:
            d_eff = 1e-12  # T = 1: one Gaussian mechanism whatever D is
        exact = g2_divergence(ORDERS, params, cells=2000)
        bound = _bound(params, diameter=d_eff, contraction=c)
        assert np.all(bound >= exact.lower), (case, bound, exact.lower)


# ------------------------------------------------------------------ behaviour


def test_independent_of_steps_and_below_composition_for_long_runs():
    kw = dict(sampling_probability=0.01, noise_multiplier=4.0, diameter=0.05, batch_size=100, learning_rate=0.5,
              clip_norm=1.0)  # fmt: skip
    at_1e6 = random_batch_rdp(DEFAULT_ORDERS, steps=10**6, **kw)
    at_1e12 = random_batch_rdp(DEFAULT_ORDERS, steps=10**12, **kw)
    np.testing.assert_allclose(at_1e6, at_1e12, rtol=1e-9)
    composition = composition_rdp(DEFAULT_ORDERS, dataset_size=10_000, batch_size=100, noise_multiplier=4.0,
                                  steps=10**6)  # fmt: skip
    assert np.all(at_1e6 < composition)
    # never above the diameter-free R = T form T log(m0) / (alpha - 1) (a candidate of the minimum)
    for steps in (1, 7, 1000):
        m0 = np.logaddexp(math.log1p(-0.01), math.log(0.01) + (DEFAULT_ORDERS - 1) * 2 * DEFAULT_ORDERS / 16.0)
        trivial = steps * m0 / (DEFAULT_ORDERS - 1)
        assert np.all(random_batch_rdp(DEFAULT_ORDERS, steps=steps, **kw) <= trivial * (1 + 1e-12))


@pytest.mark.parametrize("contraction", [None, 0.0, 0.5, 1.0 - 1e-9])
def test_extreme_parameters_give_finite_or_inf_never_nan(contraction):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for z, q, steps, diameter in itertools.product((1e-3, 1.0, 1e3), (1e-6, 0.3, 1.0), (1, 10**6, 10**12),
                                                       (1e-9, 1.0, 1e9)):  # fmt: skip
            value = random_batch_rdp(DEFAULT_ORDERS, sampling_probability=q, noise_multiplier=z, steps=steps,
                                     diameter=diameter, batch_size=10, learning_rate=0.1, clip_norm=1.0,
                                     contraction=contraction)  # fmt: skip
            assert not np.any(np.isnan(value)) and np.all(value >= 0), (z, q, steps, diameter)
