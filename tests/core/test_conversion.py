"""RDP -> (epsilon, delta): grid, exact linear optimum, refinement by evaluating the bound.

The acceptance tests compare against a continuous optimum computed here,
independently of the library (dense evaluation of the conversion formula, then
bounded Brent on each smooth piece), on seeded random curves: linear ones, and
non-linear ones including the sampled Gaussian composed T times.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy import optimize

import lastiter_plugins as lp
from lastiter_plugins.bounds.sgm import sgm_rdp
from lastiter_plugins.conversion import (
    MIN_CONVERSION_ORDER,
    OrderGridWarning,
    delta_of_linear_rdp,
    epsilon_of_linear_rdp,
    rdp_to_epsilon,
    refine_epsilon,
)
from lastiter_plugins.validation import DEFAULT_ORDERS, validate_delta, validate_orders

pytestmark = pytest.mark.filterwarnings("ignore::lastiter_plugins.OrderGridWarning")

# ------------------------------------------------------------------ reference (independent of the library)


def formula(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """The improved conversion at each order, with dp-accounting's special cases, written out."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        eps = r + np.log((a - 1.0) / a) - (np.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.where(a > 1.01, eps, np.inf)
    eps = np.where(delta**2 + np.expm1(-r) > 0, 0.0, eps)  # total variation <= sqrt(1 - exp(-KL))
    return np.where(np.isfinite(r), np.maximum(eps, 0.0), np.inf)


def formula_at(order: float, rdp: float, delta: float) -> float:
    """:func:`formula` at one order, in plain floats (for the scalar minimiser)."""
    if not math.isfinite(rdp):
        return math.inf
    if delta**2 + math.expm1(-rdp) > 0:
        return 0.0
    if order <= 1.01:
        return math.inf
    return max(rdp + math.log((order - 1.0) / order) - (math.log(delta) + math.log(order)) / (order - 1.0), 0.0)


def _brent_min(fun: Callable[[float], float], lo: float, hi: float) -> float:
    res = optimize.minimize_scalar(fun, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13, "maxiter": 2000})
    return min(float(res.fun), fun(lo), fun(hi))


def linear_reference(rho: float, delta: float) -> float:
    """min over alpha > 1.01 of the conversion of rho*alpha: dense log grid of alpha - 1 up to 10/delta
    (far beyond any optimum), then Brent between the neighbours of the best point."""
    x = np.geomspace(0.01 * (1 + 1e-15), 10.0 / delta, 4000)
    values = formula(1.0 + x, rho * (1.0 + x), delta)
    i = int(np.argmin(values))
    lo, hi = math.log(x[max(i - 1, 0)]), math.log(x[min(i + 1, x.size - 1)])

    def f(u: float) -> float:
        a = 1.0 + math.exp(u)
        return formula_at(a, rho * a, delta)

    return min(float(values[i]), _brent_min(f, lo, hi))


@dataclass(frozen=True)
class Curve:
    """A non-linear RDP curve: ``rdp_at`` evaluates it; ``pieces`` are the orders between which it is smooth."""

    name: str
    rdp_at: Callable[[np.ndarray], np.ndarray]
    pieces: np.ndarray
    max_order: float = 1e4

    @property
    def orders(self) -> np.ndarray:
        """The default grid, up to the largest order the curve is defined at."""
        return DEFAULT_ORDERS[self.max_order >= DEFAULT_ORDERS]


def curve_reference(curve: Curve, delta: float, lo: float = 1.01, hi: float = 1e4) -> float:
    """min of the conversion of ``curve`` over [lo, hi]: 64 points on every smooth piece (and 4000 log-spaced
    points overall), then Brent on the (at most 3) pieces holding the 40 best points."""
    edges = np.unique(np.clip(np.concatenate([[lo, hi], curve.pieces]), lo, hi))
    dense = np.unique(np.concatenate([np.linspace(edges[:-1], edges[1:], 65).ravel(), np.geomspace(lo, hi, 4000)]))
    values = formula(dense, curve.rdp_at(dense), delta)
    best = float(values.min())
    owner = np.clip(np.searchsorted(edges, dense[np.argsort(values)[:40]], side="right") - 1, 0, edges.size - 2)
    for k in list(dict.fromkeys(owner.tolist()))[:3]:  # the pieces holding the best points, best first
        a, b = max(edges[k], np.nextafter(1.01, 2.0)), edges[k + 1]
        if a < b:
            best = min(best, _brent_min(lambda t: formula_at(t, float(curve.rdp_at(np.array([t]))[0]), delta), a, b))
    return best


# ------------------------------------------------------------------ seeded configurations


def _sgm_cumulant_curve(q: float, z: float, steps: int, max_order: int) -> Curve:
    """T * S_alpha(q, z) as the library evaluates it: exact at integers, chord of the cumulant between them."""
    ints = np.arange(1, max_order + 2, dtype=float)
    cumulant = np.zeros(ints.size)  # (alpha - 1) * RDP, exact at integers; 0 at order 1
    cumulant[1:] = steps * (ints[1:] - 1.0) * sgm_rdp(q, z, ints[1:])

    def rdp_at(orders: np.ndarray) -> np.ndarray:
        orders = np.asarray(orders, dtype=float)
        k = np.floor(orders).astype(int)
        t = orders - k
        hi = np.minimum(k + 1, max_order + 1)
        chord = (1.0 - t) * cumulant[k - 1] + t * cumulant[hi - 1]
        return np.maximum(chord / (orders - 1.0), 0.0)

    return Curve(f"sgm(q={q:.3g}, z={z:.3g}, T={steps})", rdp_at, ints, float(max_order))


@functools.cache
def linear_configurations(count: int = 1000, seed: int = 20261122) -> tuple[tuple[float, float], ...]:
    """(rho, delta): rho log-uniform in [1e-6, 1e3], delta log-uniform in [1e-12, 1e-2]."""
    rng = np.random.default_rng(seed)
    rho = 10.0 ** rng.uniform(-6, 3, count)
    delta = 10.0 ** rng.uniform(-12, -2, count)
    return tuple(zip(rho.tolist(), delta.tolist(), strict=True))


@functools.cache
def nonlinear_configurations(count: int = 1000, seed: int = 20261123, sgm_share: float = 0.2) -> tuple:
    """(Curve, delta) for five families; the sampled-Gaussian ones have their optimum below order ~300."""
    rng = np.random.default_rng(seed)
    out: list[tuple[Curve, float]] = []
    while len(out) < count:
        delta = float(10.0 ** rng.uniform(-12, -2))
        family = "sgm" if rng.random() < sgm_share else str(rng.choice(["log", "square", "shuffle", "min2"]))
        a = float(10.0 ** rng.uniform(-5, 2))
        if family == "log":
            b = float(a * 10.0 ** rng.uniform(-2, 2))
            curve = Curve(f"{a:.3g}a + {b:.3g}log a", lambda o, a=a, b=b: a * o + b * np.log(o), np.array([]))
        elif family == "square":
            c = float(a * 10.0 ** rng.uniform(-5, 0))
            curve = Curve(f"{a:.3g}a + {c:.3g}a^2", lambda o, a=a, c=c: a * o + c * o * o, np.array([]))
        elif (
            family == "shuffle"
        ):  # the Ye & Shokri shuffle form: a*alpha + log(mean_j exp((alpha-1) alpha c_j))/(alpha-1)
            c = a * rng.uniform(0, 1, 10) ** 3 * 10.0 ** rng.uniform(0, 2)

            def shuffle(o, a=a, c=c):
                o = np.asarray(o, dtype=float)
                exponents = ((o - 1.0) * o)[:, None] * c
                peak = exponents.max(axis=1)
                log_mean = peak + np.log(np.exp(exponents - peak[:, None]).mean(axis=1))
                return a * o + log_mean / (o - 1.0)

            curve = Curve(f"shuffle({a:.3g})", shuffle, np.array([]))
        elif family == "min2":  # a best-of curve: the minimum of two lines (a kink where they cross)
            a2, b2 = float(a * rng.uniform(0.05, 0.9)), float(a * 10.0 ** rng.uniform(-1, 2))
            crossing = b2 / (a - a2)
            curve = Curve(
                f"min({a:.3g}a, {a2:.3g}a + {b2:.3g})",
                lambda o, a=a, a2=a2, b2=b2: np.minimum(a * o, a2 * o + b2),
                np.array([crossing]),
            )
        else:
            q, z = float(10.0 ** rng.uniform(-3, -0.5)), float(rng.uniform(0.5, 5.0))
            steps = int(10.0 ** rng.uniform(0, 4))
            curve = _sgm_cumulant_curve(q, z, steps, 600)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", OrderGridWarning)
                order = rdp_to_epsilon(curve.orders, curve.rdp_at(curve.orders), delta)[1]
            if order >= 250:  # keep the exact reference cheap (orders up to 600)
                continue
        out.append((curve, delta))
    return tuple(out)


# ------------------------------------------------------------------ acceptance: linear curves


def test_linear_optimum_is_within_1e9_of_the_independent_optimum_and_never_below():
    gaps = []
    for rho, delta in linear_configurations():
        eps, _ = epsilon_of_linear_rdp(rho, delta)
        ref = linear_reference(rho, delta)
        tol = 1e-12 * max(ref, 1.0)
        assert eps >= ref - tol, (rho, delta, eps, ref)  # never below the true minimum
        assert eps <= ref * (1 + 1e-9) + tol, (rho, delta, eps, ref)
        gaps.append(eps / ref - 1 if ref > 0 else 0.0)
    assert max(gaps) < 1e-9


def test_linear_epsilon_is_dp_accountings_conversion_at_the_returned_order():
    for rho, delta in linear_configurations():
        eps, order = epsilon_of_linear_rdp(rho, delta)
        theirs, their_order = compute_epsilon([order], [rho * order], delta)
        assert order > 1.01 and their_order == order
        assert eps == pytest.approx(theirs, rel=1e-12, abs=1e-300)


def test_linear_optimum_beats_the_grid_where_the_grid_is_coarse():
    # rho = 5, delta = 1e-5: the best integer order (3) loses about 4% against alpha* ~ 2.457.
    grid_eps, grid_order = rdp_to_epsilon(DEFAULT_ORDERS, 5.0 * DEFAULT_ORDERS, 1e-5)
    eps, order = epsilon_of_linear_rdp(5.0, 1e-5)
    assert grid_order == 3.0 and order == pytest.approx(2.45698, abs=1e-5)
    assert eps == pytest.approx(19.047259552, rel=1e-9) and grid_eps / eps - 1 > 0.039
    # closed form at the stationary point: rho (1 + 2x) + log(x / (1 + x)), x = alpha* - 1
    x = order - 1.0
    assert eps == pytest.approx(5.0 * (1 + 2 * x) + math.log(x / (1 + x)), rel=1e-12)


@pytest.mark.parametrize(
    ("rho", "delta", "expected"),
    [
        (0.0, 1e-5, (0.0, MIN_CONVERSION_ORDER)),  # zero RDP: the KL case of the conversion
        (1e-300, 1e-5, (0.0, MIN_CONVERSION_ORDER)),
        (1e300, 1e-5, (1.01e300, MIN_CONVERSION_ORDER)),  # optimum below 1.01: clipped to the domain
        (math.inf, 1e-5, (math.inf, MIN_CONVERSION_ORDER)),
    ],
    ids=["zero", "tiny", "huge", "inf"],
)
def test_linear_extremes(rho, delta, expected):
    eps, order = epsilon_of_linear_rdp(rho, delta)
    assert order == expected[1]
    assert eps == pytest.approx(expected[0], rel=1e-12)


def test_linear_optimum_grows_beyond_the_grid_as_rho_vanishes_but_stays_finite():
    orders = []
    for rho in (1e-8, 1e-10, 1e-12):
        eps, order = epsilon_of_linear_rdp(rho, 1e-12)
        assert math.isfinite(order) and DEFAULT_ORDERS.max() < order <= 1e12 and 0 < eps < 1e-2
        assert eps < rdp_to_epsilon(DEFAULT_ORDERS, rho * DEFAULT_ORDERS, 1e-12)[0]
        orders.append(order)
    assert orders == sorted(orders)


@pytest.mark.parametrize("rho", [1e-300, 1e-10, 0.005, 1.0, 1e5, 1e300], ids=str)
@pytest.mark.parametrize("eps", [1e30, 1e300, 1e308, 1.7976931348623157e308], ids=str)
def test_linear_delta_at_a_huge_epsilon_is_a_number_without_warnings(rho, eps):
    """issue 38: delta at epsilon 1e308 raised scipy's "f(a) and f(b) must have different signs" (the slope at
    the bracket's end rounds to <= 0) or overflowed (a RuntimeWarning); the answer is a valid delta, 0 unless
    the RDP is as huge as epsilon."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        delta, order = delta_of_linear_rdp(rho, eps)
    assert order >= MIN_CONVERSION_ORDER and 0.0 <= delta <= 1.0
    if rho <= 1e5:
        assert delta == 0.0
    # never below the truth: the RDP rho * alpha is the Gaussian mechanism's of mu = sqrt(2 rho), exact delta
    assert delta >= float(lp.profiles.gdp_delta(math.sqrt(2.0 * rho), eps))


@pytest.mark.parametrize("rho", [1e-300, 1e-20, 2.0**-54], ids=str)
def test_linear_delta_of_a_tiny_rdp_is_a_number(rho):
    """Below 2**-53 dp-accounting's KL term log1p(-exp(-rdp)) is a math domain error; the RDP is raised to
    2**-53 there (still a valid bound, loose: about 1e-8 at epsilon 0): a small delta, never below the truth.
    At rho 1e-300 and epsilon 0 the optimal order (7e149) is 500 halvings below the bracket's end (3.5e299)."""
    for eps in (0.0, 1.0):
        delta, _ = delta_of_linear_rdp(rho, eps)
        assert float(lp.profiles.gdp_delta(math.sqrt(2.0 * rho), eps)) <= delta < 1e-7


@pytest.mark.parametrize("bad", [-1.0, math.nan, "1", True])
def test_linear_refuses_invalid_rho(bad):
    with pytest.raises(ValueError, match="rho"):
        epsilon_of_linear_rdp(bad, 1e-5)


# ------------------------------------------------------------------ acceptance: non-linear curves


def test_reference_curve_is_the_librarys_sampled_gaussian():
    # The sampled-Gaussian reference curve (chord of the cumulant) is the library's curve, fractional orders included.
    curve = _sgm_cumulant_curve(0.02, 1.3, 500, 600)
    orders = np.array([1.05, 1.5, 2.0, 2.37, 7.9, 31.5, 99.99, 250.4])
    np.testing.assert_allclose(curve.rdp_at(orders), 500 * sgm_rdp(0.02, 1.3, orders), rtol=1e-10)


def test_refined_epsilon_is_within_0_1_percent_of_the_continuous_optimum_and_never_below():
    gaps, calls = [], []
    for curve, delta in nonlinear_configurations():
        orders = curve.orders
        counter = []

        def rdp_at(new, curve=curve, counter=counter):
            counter.append(new.size)
            return curve.rdp_at(new)

        eps, _ = refine_epsilon(rdp_at, orders, curve.rdp_at(orders), delta)
        ref = curve_reference(curve, delta, hi=float(orders.max()))
        tol = 1e-12 * max(ref, 1.0)
        assert eps >= ref - tol, (curve.name, delta, eps, ref)
        assert eps <= ref * (1 + 1e-3) + tol, (curve.name, delta, eps, ref)
        gaps.append(eps / ref - 1 if ref > 0 else 0.0)
        calls.append(counter)
    assert max(len(c) for c in calls) <= 3 and max(max(c, default=0) for c in calls) <= 3 * 15
    assert all(max(c[1:], default=0) <= 15 for c in calls)  # only the first call surveys several basins
    assert max(gaps) < 1e-6  # measured: 1.4e-7 (benchmarks/bench_conversion.py); the grid loses up to 5%


def test_refined_epsilon_is_dp_accountings_conversion_of_the_bound_at_the_returned_order():
    for curve, delta in nonlinear_configurations()[:300]:
        orders = curve.orders
        eps, order = refine_epsilon(curve.rdp_at, orders, curve.rdp_at(orders), delta)
        theirs, _ = compute_epsilon([order], curve.rdp_at(np.array([order])), delta)
        assert eps == pytest.approx(theirs, rel=1e-12, abs=1e-300)
        assert eps <= rdp_to_epsilon(orders, curve.rdp_at(orders), delta)[0]  # never worse than the grid


def test_refinement_never_interpolates_between_grid_values():
    # A curve that is rho*alpha on the grid and much larger everywhere else: evaluating the bound finds
    # nothing better than the grid; interpolating the grid values would report the (invalid) linear optimum.
    on_grid = set(DEFAULT_ORDERS.tolist())

    def spiky(orders):
        return np.array([5.0 * a if a in on_grid else 5.0 * a + 1.0 for a in np.asarray(orders).tolist()])

    grid = rdp_to_epsilon(DEFAULT_ORDERS, spiky(DEFAULT_ORDERS), 1e-5)
    refined = refine_epsilon(spiky, DEFAULT_ORDERS, spiky(DEFAULT_ORDERS), 1e-5)
    assert refined == grid
    assert refined[0] > epsilon_of_linear_rdp(5.0, 1e-5)[0] * 1.03


def test_refinement_of_a_linear_curve_reaches_the_exact_optimum_in_one_call():
    calls = []

    def line(orders):
        calls.append(orders.size)
        return 5.0 * orders

    grid = line(DEFAULT_ORDERS)
    calls.clear()
    eps, _ = refine_epsilon(line, DEFAULT_ORDERS, grid, 1e-5)
    assert eps == pytest.approx(epsilon_of_linear_rdp(5.0, 1e-5)[0], rel=1e-12)
    assert len(calls) == 3 and max(calls) <= 15


def test_rounds_and_points_bound_the_work():
    calls = []

    def curve(orders):
        calls.append(orders.size)
        return 0.3 * orders + 2.0 * np.log(orders)

    args = (DEFAULT_ORDERS, curve(DEFAULT_ORDERS), 1e-6)
    calls.clear()
    assert refine_epsilon(curve, *args, rounds=0) == rdp_to_epsilon(*args)
    assert calls == []
    refine_epsilon(curve, *args, points=4, rounds=2)
    assert len(calls) == 2 and max(calls) <= 4 + 3
    for bad in ({"points": 0}, {"rounds": -1}, {"points": 2.5}):
        with pytest.raises(ValueError):
            refine_epsilon(curve, *args, **bad)


# ------------------------------------------------------------------ robustness


@pytest.mark.parametrize("convert", ["grid", "refine"])
def test_non_finite_and_extreme_values(convert):
    def run(rdp, orders=DEFAULT_ORDERS):
        rdp = np.asarray(rdp, dtype=float)
        if convert == "grid":
            return rdp_to_epsilon(orders, rdp, 1e-5)
        return refine_epsilon(lambda o: np.interp(o, orders, rdp), orders, rdp, 1e-5)

    n = DEFAULT_ORDERS.size
    assert run(np.full(n, np.inf)) == (math.inf, float(DEFAULT_ORDERS[0]))  # nothing finite
    assert run(np.zeros(n)) == (0.0, float(DEFAULT_ORDERS[0]))  # zero RDP: epsilon 0
    partly = 2.0 * DEFAULT_ORDERS
    partly[DEFAULT_ORDERS < 3] = np.inf  # inf orders are skipped, the rest used
    eps, order = run(partly)
    assert math.isfinite(eps) and order >= 3
    for huge in (1e300, 1e308):
        eps, _ = run(np.full(n, huge))
        assert not math.isnan(eps) and eps > 1e299
    with pytest.raises(ValueError, match=">= 0"):
        run(-np.ones(n))


def test_refine_skips_infinite_values_returned_by_the_bound():
    def curve(orders):
        out = 3.0 * orders
        return np.where(np.floor(orders) != orders, np.inf, out)  # the bound fails off integers

    eps, order = refine_epsilon(curve, DEFAULT_ORDERS, curve(DEFAULT_ORDERS), 1e-5)
    assert (eps, order) == rdp_to_epsilon(DEFAULT_ORDERS, curve(DEFAULT_ORDERS), 1e-5)


def test_refine_rejects_a_bound_returning_the_wrong_shape():
    with pytest.raises(ValueError, match="one value per order"):
        refine_epsilon(lambda o: np.ones(1), DEFAULT_ORDERS, 3.0 * DEFAULT_ORDERS, 1e-5)


def test_edge_warning_is_kept_by_both_conversions():
    orders = np.array([2.0, 3.0])
    with pytest.warns(OrderGridWarning, match="edge of the order grid"):
        rdp_to_epsilon(orders, 0.01 * orders, 1e-5)
    with pytest.warns(OrderGridWarning, match="edge of the order grid"):
        _, order = refine_epsilon(lambda o: 0.01 * o, orders, 0.01 * orders, 1e-5)
    assert order == 3.0  # the search stays within the grid's range
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refine_epsilon(lambda o: 1.0 * o, DEFAULT_ORDERS, 1.0 * DEFAULT_ORDERS, 1e-5)


def test_validators_are_unchanged():
    assert validate_delta(1e-5) == 1e-5
    for bad in (0.0, 1.0, True, "0.1"):
        with pytest.raises(ValueError, match="delta"):
            validate_delta(bad)
    np.testing.assert_array_equal(validate_orders(None), lp.DEFAULT_ORDERS)
    np.testing.assert_array_equal(validate_orders(2.5), [2.5])
    with pytest.raises(ValueError, match="> 1"):
        validate_orders([1.0])
