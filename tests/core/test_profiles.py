"""Gaussian privacy profiles (lastiter_plugins.profiles): known values, the exact
Gaussian PLD of dp-accounting, inversion, mixtures and their Renyi form."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from lastiter_plugins import profiles
from lastiter_plugins.lower_end.exact import gaussian_mixture_renyi

mpmath.mp.dps = 60


def _delta_reference(mu: float, eps: float) -> float:
    """delta_mu(eps) in 60-digit arithmetic (Dong, Roth & Su 2019, Cor. 2.13)."""
    m, e = mpmath.mpf(mu), mpmath.mpf(eps)
    return float(mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2))


MUS = [1e-8, 1e-5, 1e-2, 0.3, 0.999, 1.001, 2.0, 10.0, 60.0, 1e3]


@pytest.mark.parametrize("mu", MUS, ids=[f"mu={m:g}" for m in MUS])
def test_gdp_delta_matches_high_precision(mu):
    worst = 0.0
    for k in [0.0, 0.3, 1.0, 2.0, 4.0, 8.0, 15.0, 25.0, 36.0]:
        eps = mu * mu / 2.0 + k * mu
        ref = _delta_reference(mu, eps)
        got = float(profiles.gdp_delta(mu, eps))
        if ref > 1e-300:
            worst = max(worst, abs(got / ref - 1.0))
        else:
            assert got <= 1e-290
    assert worst < 1e-10


def test_gdp_delta_special_values_and_broadcast():
    assert profiles.gdp_delta(0.0, 1.0) == 0.0
    assert profiles.gdp_delta(1.0, math.inf) == 0.0
    assert profiles.gdp_delta(math.inf, 3.0) == 1.0
    # delta(0) = 2 Phi(mu/2) - 1
    assert profiles.gdp_delta(1.0, 0.0) == pytest.approx(math.erf(0.5 / math.sqrt(2.0)), rel=1e-14)
    out = profiles.gdp_delta(np.array([0.5, 1.0]), np.array([[0.1], [1.0]]))
    assert out.shape == (2, 2)
    assert np.all(np.diff(out, axis=0) < 0)  # decreasing in eps
    assert np.all(np.diff(out, axis=1) > 0)  # increasing in mu
    with pytest.raises(ValueError):
        profiles.gdp_delta(-1.0, 1.0)


@pytest.mark.parametrize("mu", [0.05, 0.3, 0.6243294860028353, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-9])
def test_gdp_epsilon_against_dp_accounting_gaussian_pld(mu, delta):
    pld = pytest.importorskip("dp_accounting.pld")
    dp_event = pytest.importorskip("dp_accounting.dp_event")
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_event.GaussianDpEvent(noise_multiplier=1.0 / mu))
    reference = acc.get_epsilon(delta)  # pessimistic discretisation: >= the exact value, close to it
    ours = profiles.gdp_epsilon(mu, delta)
    assert ours <= reference + 1e-9
    assert ours >= reference - 2e-3


@pytest.mark.parametrize("mu", [1e-8, 1e-3, 0.5, 3.0, 100.0, 1e3])
@pytest.mark.parametrize("delta", [0.3, 1e-5, 1e-12])
def test_gdp_epsilon_is_the_smallest_valid_epsilon(mu, delta):
    eps = profiles.gdp_epsilon(mu, delta)
    assert math.isfinite(eps)
    assert float(profiles.gdp_delta(mu, eps)) <= delta  # re-checked: never optimistic
    if eps > 0:
        assert float(profiles.gdp_delta(mu, eps * (1 - 1e-9))) > delta * (1 - 1e-6)  # and not loose
    else:
        assert float(profiles.gdp_delta(mu, 0.0)) <= delta


def test_gdp_epsilon_known_values_and_edges():
    # full-batch toy example of Bok, Su & Altschuler 2024: mu = 0.1 sqrt(39 (1-0.95^160)/(1+0.95^160))
    mu = 0.1 * math.sqrt(39.0 * (1 - 0.95**160) / (1 + 0.95**160))
    assert profiles.gdp_epsilon(mu, 1e-5) == pytest.approx(2.5568357, abs=2e-7)
    assert profiles.gdp_epsilon(1.0, 0.5) == 0.0  # delta(0) = 0.383 <= 0.5
    assert profiles.gdp_epsilon(1.0, 0.0) == math.inf
    assert profiles.gdp_epsilon(0.0, 1e-5) == 0.0
    with pytest.raises(ValueError):
        profiles.gdp_epsilon(1.0, 1.5)


def test_gdp_rdp():
    np.testing.assert_allclose(profiles.gdp_rdp(0.5, [2.0, 8.0]), [0.25, 1.0])


def test_mixture_delta_is_the_weighted_sum_and_reduces_to_gdp():
    w, m = [0.2, 0.5, 0.3], [0.1, 0.7, 2.0]
    for eps in [0.0, 0.5, 3.0]:
        expected = sum(wi * float(profiles.gdp_delta(mi, eps)) for wi, mi in zip(w, m, strict=True))
        assert profiles.mixture_delta(w, m, eps) == pytest.approx(expected, rel=1e-12)
    assert profiles.mixture_epsilon([1.0], [0.8], 1e-6) == pytest.approx(profiles.gdp_epsilon(0.8, 1e-6), rel=1e-12)
    with pytest.raises(ValueError):
        profiles.mixture_delta([0.5, 0.4], [1.0, 1.0], 1.0)


def test_mixture_epsilon_rechecked_and_between_components():
    rng = np.random.default_rng(7)
    for _ in range(20):
        k = int(rng.integers(1, 30))
        w = rng.random(k)
        w /= w.sum()
        m = rng.uniform(0.01, 4.0, k)
        delta = 10 ** rng.uniform(-10, -2)
        eps = profiles.mixture_epsilon(w, m, delta)
        assert profiles.mixture_delta(w, m, eps) <= delta
        assert profiles.gdp_epsilon(m.min(), delta) <= eps <= profiles.gdp_epsilon(m.max(), delta) + 1e-12


def test_mixture_merging_only_rounds_up():
    rng = np.random.default_rng(3)
    m = rng.uniform(0.05, 2.0, 9000)  # more than 4096 distinct: merged onto a grid
    w = np.full(m.size, 1.0 / m.size)
    eps = profiles.mixture_epsilon(w, m, 1e-6)
    # the unmerged profile at the returned eps (direct weighted sum) is <= the target
    direct = float(np.sum(w * profiles.gdp_delta(m, eps)))
    assert direct <= 1e-6
    assert eps <= profiles.gdp_epsilon(2.0, 1e-6)


def test_mixture_rdp_bounds_the_exact_mixture_divergence():
    # pairs N(+-m_j, 1) are (2 m_j)-GDP; the exact divergence of the two mixtures is below mixture_rdp
    orders = np.array([1.5, 2.0, 4.0, 8.0])
    w = np.array([0.25, 0.25, 0.5])
    half_shifts = np.array([0.05, 0.3, 0.6])
    lower, _ = gaussian_mixture_renyi(orders, w, half_shifts, w, -half_shifts, 1.0, cells=4000)
    bound = profiles.mixture_rdp(w, 2 * half_shifts, orders)
    assert np.all(bound >= lower)
    single = profiles.mixture_rdp([1.0], [0.7], orders)
    np.testing.assert_allclose(single, profiles.gdp_rdp(0.7, orders), rtol=1e-12)
    # joint convexity: between the weighted mean and the maximum of the components
    assert np.all(bound <= profiles.gdp_rdp(1.2, orders) + 1e-12)
    assert np.all(bound >= np.sum(w * (orders[:, None] * (2 * half_shifts) ** 2 / 2), axis=1) - 1e-12)


def test_profile_object():
    prof = profiles.GaussianMixtureProfile.mixture([0.5, 0.25, 0.25], [1.0, 0.5, 0.5])
    assert prof.mus == (0.5, 1.0) and prof.weights == (0.5, 0.5)
    assert prof.max_mu == 1.0
    assert prof.delta(prof.epsilon(1e-5)) <= 1e-5
    g = profiles.GaussianMixtureProfile.gaussian(0.5)
    assert g.epsilon(1e-5) == profiles.gdp_epsilon(0.5, 1e-5)
    np.testing.assert_allclose(g.rdp([2.0]), [0.25])


def test_mixture_built_once_equals_the_validated_object():
    """``mixture`` builds its object from the arrays it validated (no second validation, its merged arrays
    stored): the same fields, delta and epsilon as the dataclass built from the tuples, for sorted input (the
    lattices' mixtures, no sort) and unsorted input with repeated mus (np.unique), merged onto the grid or not."""
    rng = np.random.default_rng(11)
    for size, repeats in ((30, False), (30, True), (9000, False), (9000, True)):
        m = np.sort(rng.uniform(0.01, 3.0, size))
        if repeats:
            m = rng.permutation(np.concatenate((m, m[: size // 3], [np.inf])))
        w = rng.random(m.size)
        w /= w.sum()
        built = profiles.GaussianMixtureProfile.mixture(w, m)
        plain = profiles.GaussianMixtureProfile(built.weights, built.mus)
        assert built == plain
        assert list(built.mus) == sorted(set(built.mus))
        for eps in (0.1, 2.0):
            assert built.delta(eps) == plain.delta(eps)
        assert built.epsilon(1e-6) == plain.epsilon(1e-6)
        direct = float(np.sum(w * profiles.gdp_delta(m, 0.5)))
        if size < 4096:
            assert built.delta(0.5) == pytest.approx(direct, rel=1e-9)
        else:  # more than 4096 mus: merged onto the grid, rounded up
            assert built.delta(0.5) >= direct
