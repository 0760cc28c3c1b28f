"""Tier 1: the worked examples of docs/bounds.md (appendix) and hand-derived special cases."""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

import lastiter_plugins as lp
from lastiter_plugins.bounds import sgm
from lastiter_plugins.bounds._common import log_theta, theta
from tests.support import strongly_convex

ORDERS = [2.0, 8.0, 32.0]

# (bound id, params, expected rdp at orders 2, 8, 32) - docs/bounds.md appendix, C = 1.
WORKED_EXAMPLES = [
    (
        "kong-ribero-cyclic",
        dict(
            dataset_size=10000,
            batch_size=10,
            noise_multiplier=1.0,
            learning_rate=0.1,
            steps=100000,
            smoothness=1.0,
            weak_convexity=0.5,
            sampling="cyclic",
        ),
        (449.791, 1799.16, 7196.66),
    ),
    (
        "kong-ribero-cyclic",
        dict(
            dataset_size=10000,
            batch_size=10,
            noise_multiplier=1.0,
            learning_rate=0.1,
            steps=100000,
            smoothness=1.0,
            sampling="cyclic",
            gradient_norms_within_clip=True,
        ),
        (8.8, 35.2, 140.8),
    ),
    (
        "kong-ribero-bounded",
        dict(
            dataset_size=1000,
            batch_size=10,
            noise_multiplier=2.0,
            learning_rate=0.5,
            steps=500,
            smoothness=0.5,
            diameter=0.01,
            sampling="cyclic",
        ),
        (1.30284, 5.21137, 20.8455),
    ),
    (
        "ye-shokri-shuffle",
        dict(
            dataset_size=60000,
            batch_size=600,
            noise_multiplier=2.0,
            learning_rate=0.5,
            steps=10000,
            smoothness=1.0,
            strong_convexity=0.05,
            sampling="shuffle_once",
            gradient_norms_within_clip=True,
        ),
        (0.05048, 3.36162, 15.9294),
    ),
    (
        "ye-shokri-cyclic",
        dict(
            dataset_size=60000,
            batch_size=600,
            noise_multiplier=2.0,
            learning_rate=0.5,
            steps=10000,
            smoothness=1.0,
            strong_convexity=0.05,
            sampling="cyclic",
            gradient_norms_within_clip=True,
        ),
        (1.00487, 4.0195, 16.078),
    ),
    (
        "ye-shokri-random",
        dict(
            dataset_size=1000,
            batch_size=100,
            noise_multiplier=1.5,
            learning_rate=0.2,
            steps=2000,
            smoothness=1.0,
            strong_convexity=0.5,
            sampling="random_batch",
            gradient_norms_within_clip=True,
        ),
        (4.15957, 13564.3, 56740.3),
    ),
    (
        "composition",
        dict(dataset_size=1000, batch_size=100, noise_multiplier=1.5, steps=2000, sampling="random_batch"),
        (223.68, 9157.3, 52179.9),
    ),
]


@pytest.mark.parametrize(
    ("bound", "params", "expected"),
    WORKED_EXAMPLES,
    ids=[f"{b}-{i}" for i, (b, _, _) in enumerate(WORKED_EXAMPLES)],
)
def test_worked_example_closed_forms(bound, params, expected):
    """docs/bounds.md appendix: closed forms match to the table's printed precision (~1e-5 relative)."""
    got = lp.rdp(bound, ORDERS, **params)
    np.testing.assert_allclose(got, expected, rtol=2e-5)


def test_worked_example_altschuler_talwar_not_above_reference_minimiser():
    """docs/bounds.md appendix: our minimiser may be lower than the 99-point gamma grid's, never above it."""
    got = lp.rdp(
        "altschuler-talwar",
        ORDERS,
        dataset_size=1000,
        batch_size=50,
        noise_multiplier=2.0,
        learning_rate=0.5,
        steps=5000,
        smoothness=1.0,
        diameter=0.5,
        sampling="random_batch",
        gradient_norms_within_clip=True,  # the non-expansive step needs unclipped gradients
    )
    reference = np.array([8.06049, 276.019, 1518.58])
    assert np.all(got <= reference * (1 + 1e-6))
    # ... and not absurdly lower either: it is the same family of bounds.
    assert np.all(got >= 0.99 * reference)


def test_liang_closed_forms_are_not_used_where_they_are_optimistic():
    """Audit finding (arXiv 2502.17772 eq. 12/14): T * 2 alpha q / z^2 is below the exact divergence at T = 1.

    Ground truth: one step, linear loss, add-or-remove-one, Poisson q = 0.05, z = 1. Removing the
    example makes the output N(0, s^2) vs (1-q) N(0, s^2) + q N(1, s^2) with s = z (sensitivity C),
    whose order-32 divergence is the sampled Gaussian RDP S_32(0.05, 1) = 12.91 (dp-accounting).
    """
    exact = dp_rdp._compute_rdp_poisson_subsampled_gaussian(0.05, 1.0, [32.0])[0]
    assert exact == pytest.approx(12.91, abs=0.01)
    assert exact > 1 * 2 * 32 * 0.05 / 1.0**2  # the published closed form would be optimistic
    params = dict(dataset_size=100, batch_size=5, noise_multiplier=1.0, steps=1, smoothness=0.0,
                  sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    assert lp.rdp("liang-unbounded", [32.0], **params)[0] >= exact
    assert lp.rdp("liang-bounded", [32.0], learning_rate=0.1, diameter=100.0, **params)[0] >= exact


@pytest.mark.parametrize("s", [1, 2, 7, 1000, 10**6, 10**7], ids=lambda s: f"s={s}")
def test_theta_one_is_one_over_s(s):
    assert theta(1.0, s) == pytest.approx(1.0 / s, rel=1e-15)


@pytest.mark.parametrize(
    ("lipschitz", "s"),
    [(1.5, 3), (0.5, 3), (2.0, 10), (0.9, 40), (1.0 + 1e-9, 5), (10.0, 4)],
    ids=str,
)
def test_theta_matches_definition(lipschitz, s):
    direct = lipschitz ** (2 * (s - 1)) / sum(lipschitz ** (2 * j) for j in range(s))
    assert theta(lipschitz, s) == pytest.approx(direct, rel=1e-12)


def _log_theta_exact(lipschitz: float, s: int) -> float:
    """log theta_L(s) = log(L^(2(s-1)) (L^2 - 1) / (L^(2s) - 1)) in 60-digit decimal arithmetic (L != 1), an
    oracle independent of the expm1 form under test."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        log_l2 = 2 * decimal.Decimal(lipschitz).ln()  # the double L exactly, then log(L^2)
        if log_l2 > 0:  # (1 - L^-2) / (1 - L^-2s)
            value = (1 - (-log_l2).exp()).ln() - (1 - (-s * log_l2).exp()).ln()
        else:  # L^(2(s-1)) (1 - L^2) / (1 - L^2s)
            value = (s - 1) * log_l2 + (1 - log_l2.exp()).ln() - (1 - (s * log_l2).exp()).ln()
        return float(value)


@pytest.mark.parametrize("lipschitz", [1.0 + 1e-12, 1.01, 2.0, 10.0, 0.99, 0.1], ids=str)
def test_theta_stable_for_huge_s(lipschitz):
    """s = 10^7: log theta_L(s) equals its closed form (L < 1: about 2 (s-1) log L, theta itself underflows
    to 0; L > 1: about log(1 - L^-2); L = 1 + 1e-12: about -log(s) + (s-1) log(L^2) / 2), with no
    floating-point exception."""
    s = 10**7
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):
        got = float(log_theta(lipschitz, s))
        value = float(theta(lipschitz, s))
    expected = _log_theta_exact(lipschitz, s)
    assert got == pytest.approx(expected, rel=1e-9), (got, expected)
    assert value == pytest.approx(math.exp(expected), rel=1e-8, abs=0.0)  # 0.0 exactly where exp underflows
    assert theta(lipschitz, 0) == 0


def test_theta_zero_lipschitz():
    assert theta(0.0, 1) == 1.0 and theta(0.0, 5) == 0.0


def test_one_step_full_batch_composition_is_the_gaussian_mechanism():
    """T = 1, b = n: one Gaussian mechanism, sensitivity 2C, noise zC: RDP = 2 alpha / z^2."""
    for sampling in ("cyclic", "reshuffle", "random_batch"):
        got = lp.rdp(
            "composition", ORDERS, dataset_size=50, batch_size=50, noise_multiplier=3.0, steps=1, sampling=sampling
        )
        np.testing.assert_allclose(got, 2 * np.array(ORDERS) / 9.0, rtol=1e-12)


def test_ye_shokri_one_epoch_is_the_gaussian_mechanism():
    """K = 1: G(1) = 0, so ye-shokri-cyclic is exactly one use, 2 alpha / z^2."""
    params = strongly_convex(dataset_size=100, noise_multiplier=2.0, steps=10, strong_convexity=0.5)  # l = 10: K = 1
    got = lp.rdp("ye-shokri-cyclic", ORDERS, **params)
    np.testing.assert_allclose(got, 2 * np.array(ORDERS) / 4.0)


def test_ye_shokri_random_single_step_is_mixture_formula():
    """T = 1: S_1 = q e^c + (1 - q), the sampled 'always-included' bound of eq. 149."""
    q, z, alpha = 0.1, 1.5, 4.0
    got = lp.rdp(
        "ye-shokri-random", [alpha], dataset_size=100, batch_size=10, noise_multiplier=z, learning_rate=0.2,
        steps=1, smoothness=1.0, strong_convexity=0.5, sampling="random_batch", gradient_norms_within_clip=True,
    )  # fmt: skip
    c = (alpha - 1) * 2 * alpha / z**2
    assert got[0] == pytest.approx(math.log(q * math.exp(c) + 1 - q) / (alpha - 1), rel=1e-12)


def test_ye_shokri_random_extrapolation_never_below_exact_recursion():
    """The settled-increment shortcut is an upper bound of the plain recursion."""
    from lastiter_plugins.bounds import ye_shokri

    orders = np.array([1.5, 2.0, 4.0, 16.0, 64.0])
    kwargs = dict(noise_multiplier=3.0, sampling_probability=0.05, steps=20000, contraction=0.995)
    fast = ye_shokri.random_batch_rdp(orders, **kwargs)
    exact = ye_shokri.random_batch_rdp(orders, tolerance=-1.0, max_iterations=10**9, **kwargs)  # never extrapolate
    assert np.all(fast >= exact * (1 - 1e-12))
    np.testing.assert_allclose(fast, exact, rtol=1e-6)
    # the lower end (for lower estimates only) is below the plain recursion, and within its tolerance of it
    lower = ye_shokri.random_batch_rdp(orders, tolerance=1e-2, lower_end=True, **kwargs)
    assert np.all(lower <= exact * (1 + 1e-12))
    assert np.all(lower >= exact / 1.02)
    assert np.any(lower < exact * (1 - 1e-9))  # not the exact value: the check can fail


INTEGER_ORDERS = [2, 3, 4, 5, 8, 16, 32, 64, 128, 256, 1000]


@pytest.mark.parametrize(("q", "noise"), [(0.01, 1.0), (0.001, 0.5), (0.1, 2.0), (0.5, 5.0), (0.3, 0.7)], ids=str)
def test_sgm_equals_dp_accounting_at_integer_orders(q, noise):
    ours = sgm.sgm_rdp(q, noise, np.array(INTEGER_ORDERS, dtype=float))
    theirs = dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, noise, INTEGER_ORDERS)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def _sgm_divergence_by_quadrature(q: float, noise: float, alpha: float) -> float:
    """Ground truth S_alpha(q, s) = D_alpha((1-q)N(0,s^2) + qN(1,s^2) || N(0,s^2)) by numerical integration."""
    from scipy import integrate, stats

    def integrand(x):
        ratio = 1 - q + q * math.exp((2 * x - 1) / (2 * noise**2))
        return stats.norm.pdf(x, scale=noise) * ratio**alpha

    lo, hi = -12 * noise, 12 * noise + 1 + alpha / noise**2 * 2
    value, _ = integrate.quad(integrand, lo, hi, limit=500, epsabs=0, epsrel=1e-12)
    return math.log(value) / (alpha - 1)


@pytest.mark.parametrize(("q", "noise"), [(0.01, 1.0), (0.1, 2.0), (0.5, 5.0)], ids=str)
def test_sgm_is_an_upper_bound_at_fractional_orders(q, noise):
    """Against quadrature (not dp-accounting, whose fractional series changed in 0.6)."""
    orders = np.array([1.1, 1.5, 2.5, 3.7, 10.2])
    exact = np.array([_sgm_divergence_by_quadrature(q, noise, a) for a in orders])
    assert np.all(sgm.sgm_rdp(q, noise, orders) >= exact * (1 - 1e-9))
    with_series = sgm.sgm_rdp(q, noise, orders, exact_fractional=True)
    assert np.all(with_series >= exact * (1 - 1e-6))
    assert np.all(with_series <= sgm.sgm_rdp(q, noise, orders))


def test_sgm_quadrature_agrees_at_integer_orders():
    """The quadrature ground truth itself, checked where the closed form is exact."""
    for q, noise, alpha in [(0.01, 1.0, 2), (0.1, 2.0, 5), (0.5, 5.0, 8)]:
        assert _sgm_divergence_by_quadrature(q, noise, alpha) == pytest.approx(
            sgm.sgm_rdp(q, noise, [float(alpha)])[0], rel=1e-8
        )


OPACUS_ALPHAS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


@pytest.mark.parametrize(("n", "b", "z", "steps"), [(60000, 256, 1.1, 2000), (1000, 10, 0.8, 500)], ids=str)
def test_poisson_composition_equals_opacus_and_dp_accounting(n, b, z, steps):
    """docs/bounds.md: the Poisson baseline is Opacus' RDPAccountant and dp-accounting's RdpAccountant (1e-9)."""
    opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")
    import dp_accounting

    q = b / n
    ours = lp.rdp("composition", OPACUS_ALPHAS, dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps,
                  sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    theirs = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=OPACUS_ALPHAS)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)
    acc = dp_accounting.rdp.RdpAccountant(OPACUS_ALPHAS)
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    np.testing.assert_allclose(ours, acc.rdp, rtol=1e-9)
    # epsilon: the same conversion at the order we return, never above the grid's (refined between its orders)
    result = lp.epsilon("composition", 1e-5, orders=OPACUS_ALPHAS, dataset_size=n, batch_size=b,
                        noise_multiplier=z, steps=steps, sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    eps, order = result.epsilon, result.order
    assert eps <= acc.get_epsilon(1e-5) * (1 + 1e-12)
    at_order = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=[order])
    assert eps == pytest.approx(dp_accounting.rdp.compute_epsilon([order], at_order, 1e-5)[0], rel=1e-9)


def test_random_batch_composition_uses_half_the_noise_under_replace_one():
    """docs/bounds.md: SampledWithoutReplacement(n, b, Gaussian(z/2)) under REPLACE_ONE, not Gaussian(z)."""
    import dp_accounting

    n, b, z, steps = 1000, 100, 1.5, 20
    acc = dp_accounting.rdp.RdpAccountant(ORDERS, dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(z / 2)), steps)
    ours = lp.rdp("composition", ORDERS, dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps,
                  sampling="random_batch")  # fmt: skip
    np.testing.assert_allclose(ours, acc.rdp, rtol=1e-12)


def test_epoch_composition_counts_partial_epochs():
    """ceil(T/l) uses of each example: 25 steps with l = 10 -> 3 uses -> 3 * 2 alpha / z^2."""
    got = lp.rdp("composition", [2.0], dataset_size=100, batch_size=10, noise_multiplier=1.0, steps=25,
                 sampling="cyclic")  # fmt: skip
    assert got[0] == pytest.approx(3 * 4.0)


def test_epochs_param_means_epochs_times_ceil_n_over_b_steps():
    by_epochs = lp.rdp("composition", [2.0], dataset_size=105, batch_size=10, noise_multiplier=1.0, epochs=3,
                       sampling="reshuffle")  # fmt: skip
    by_steps = lp.rdp("composition", [2.0], dataset_size=105, batch_size=10, noise_multiplier=1.0, steps=33,
                      sampling="reshuffle")  # fmt: skip
    assert by_epochs[0] == by_steps[0]


@pytest.mark.parametrize(("q", "noise"), [(0.01, 0.5), (0.1, 2.0), (0.001, 0.75), (0.5, 5.0)], ids=str)
def test_sampled_without_replacement_equals_dp_accounting(q, noise):
    orders = np.array([1.01, 1.5, 2, 2.5, 3, 4, 7.5, 10, 50, 255, 256, 257, 300, 1000, 5000.0])
    ours = sgm.sgm_without_replacement_rdp(q, noise, orders)
    theirs = dp_rdp._compute_rdp_sample_wor_gaussian(q, noise, orders)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9)


def test_near_one_contraction_does_not_divide_by_zero():
    """lam so small that rho rounds to 1: G(K) is its limit K - 1, no ZeroDivisionError."""
    params = strongly_convex(dataset_size=100, steps=50, strong_convexity=2.2e-308)  # b = 10, z = 1, cyclic
    got = lp.rdp("ye-shokri-cyclic", [2.0], **params)[0]
    # rho = 1, l = 10, h = 5, K = 5: e0(h) = 2 alpha/z^2 * 1/h, G = K - 1 = 4, plus one use
    assert got == pytest.approx(4.0 * (1 / 5) * 4 + 4.0)


@pytest.mark.parametrize("q", [1e-9, 1e-12, 1e-6])
def test_sampled_gaussian_keeps_tiny_divergences_at_tiny_sampling_rates(q):
    """A_a - 1 ~ C(a,2) q^2 (e^{1/s^2} - 1) is far below the float spacing of 1 at tiny q: summing the
    terms of A_a directly rounded it to 0 (an optimistic 0 that T = 1e12 steps turn into epsilon = 0).
    Exact value at order 2: log(1 + q^2 (e^{1/s^2} - 1)); Poisson and without-replacement composition
    must stay positive and grow with T."""
    from lastiter_plugins.bounds import sgm

    s = 1.0
    exact_two = math.log1p(q * q * math.expm1(1.0 / s**2))
    assert sgm.sgm_rdp(q, s, np.array([2.0]))[0] == pytest.approx(exact_two, rel=1e-9)
    assert sgm.sgm_rdp(q, s, np.array([2.0]), exact_fractional=True)[0] == pytest.approx(exact_two, rel=1e-9)
    assert (sgm.sgm_rdp(q, s, np.array([1.5, 2.5]), exact_fractional=True) > 0).all()
    assert (sgm.sgm_without_replacement_rdp(q, s, np.array([2.0, 3.0, 1.5])) > 0).all()
    if q < 1e-9:
        return  # below this the divergence is under delta^2 even at T = 1e12: (0, delta)-DP is the truth there
    n = round(1 / q)
    for sampling, relation in (("poisson", "add_or_remove_one"), ("random_batch", "replace_one")):
        params = dict(dataset_size=n, batch_size=1, noise_multiplier=s, sampling=sampling, relation=relation)
        eps = [lp.epsilon("composition", 1e-5, steps=t, **params).epsilon for t in (10**10, 10**12)]
        assert 0 < eps[0] < eps[1]
