"""The random-allocation rows (docs/derivations/random-allocation.md) against exact instances, known values and
their properties.

* The whole release of `t = 2` steps per epoch, certified: with the other examples' gradients 0 (the worst case)
  the release of E epochs is exactly the Gaussian allocation pair composed E times (add-or-remove) or a
  `sqrt(2E)/z`-GDP pair (replace-one: the privacy loss is `s (y_1 + y_2)`); the row is never below it.
* Every allocation enumerated: n = 3 examples, t = 2, the release projected on the last iterate of a linear model
  (a finite Gaussian mixture over the 2^(3E) allocations, its profile certified) is below the row.
* PLD_accounting's optimistic distribution (a lower bound on the exact pair) is below the row.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from scipy import integrate, special

import lastiter_plugins as lp
from lastiter_plugins import baselines
from lastiter_plugins.bounds import random_allocation as ra
from lastiter_plugins.lower_end.exact import gaussian_mixture_hockey_stick
from lastiter_plugins.profiles import GaussianMixtureProfile

ROW, ROW_REPLACE = "composition-pld-random-allocation", "composition-pld-random-allocation-replace-one"
ADD_OR_REMOVE, REPLACE_ONE = "add_or_remove_one", "replace_one"


def _profile(relation: str, *, n: int, b: int, z: float, epochs: int, k: int = 1):
    cfg, a = lp.build(
        dataset_size=n,
        batch_size=b,
        noise_multiplier=z,
        epochs=epochs,
        sampling="random_allocation",
        relation=relation,
        allocations_per_epoch=k,
    )
    return lp.BOUNDS[ROW if relation == ADD_OR_REMOVE else ROW_REPLACE].profile(cfg, a)


# ---------------------------------------------------------------- t = 2, the whole release certified

_CDF_ERROR = 1e-12  # allowance on each value of the loss's distribution function (quad's error is about 1e-14)


@functools.lru_cache(maxsize=4)
def _loss_cells(s: float, step: float, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Edges of the privacy loss L = log((e^(s y1) + e^(s y2))/2) - s^2/2 of one epoch (t = 2, remove direction)
    and the masses of its cells under Q = N(0, I_2): the distribution function is a 1-D integral,
    P_Q(L <= l) = int phi(y) Phi(log(c - e^(s y))/s) dy over e^(s y) < c = 2 e^(l + s^2/2). The two outer cells
    (below lo, above hi) are the last entries."""
    edges = np.arange(lo, hi + step / 2, step)

    def cdf(ell: float) -> float:
        c = 2.0 * math.exp(ell + s * s / 2.0)
        top = math.log(c) / s

        def integrand(y: float) -> float:
            return math.exp(-y * y / 2.0) / math.sqrt(2.0 * math.pi) * special.ndtr(math.log(c - math.exp(s * y)) / s)

        value, _ = integrate.quad(integrand, -np.inf, top, epsabs=1e-15, epsrel=1e-13, limit=400)
        return value

    values = np.array([cdf(float(e)) for e in edges])
    inner = np.diff(values)
    return edges, np.concatenate((inner, [values[0], 1.0 - values[-1]]))


def _compose(masses: np.ndarray, epochs: int) -> np.ndarray:
    out = masses
    for _ in range(epochs - 1):
        out = np.convolve(out, masses)  # direct sums of non-negative products
    return out


def _exact_t2(z: float, epochs: int, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Certified lower and upper bounds on max(delta_remove, delta_add) of (P_{2,1}, Q_2)^E at each epsilon.

    The Q-law of one epoch's loss L in cells [l_i, l_i + h); the P-law is e^L dQ, so a cell's P-mass lies in
    [e^(l_i) Q_i, e^(l_i + h) Q_i]. delta_remove = E_P[(1 - e^(eps - L))_+] grows with L, delta_add =
    E_Q[(1 - e^(eps + L))_+] falls with it: rounding every epoch's L down (up) and the masses to their lower ends
    gives a lower bound; the other way round, with the outer cells at their worst, an upper bound."""
    s, h = 1.0 / z, 0.01
    edges, cells = _loss_cells(s, h, -6.0 - 3.0 * s * s, 4.0 + 3.0 * s * s)
    q_in, below, above = cells[:-2], cells[-2], cells[-1]
    q_low, q_up = np.maximum(q_in - 2 * _CDF_ERROR, 0.0), q_in + 2 * _CDF_ERROR
    left = edges[:-1]
    p_low, p_up = np.exp(left) * q_low, np.exp(left + h) * q_up
    lows, ups = [], []
    for e in eps:
        # remove: sum of E losses; lower: cells at their left edges; the E-fold sums lie on a grid of step h
        p_sum_low, q_sum_low = _compose(p_low, epochs), _compose(q_low, epochs)
        p_sum_up, q_sum_up = _compose(p_up, epochs), _compose(q_up, epochs)
        sums_left = epochs * left[0] + h * np.arange(p_sum_low.size)
        rem_low = float(np.sum(p_sum_low * np.maximum(-np.expm1(e - sums_left), 0.0)))
        add_low = float(np.sum(q_sum_low * np.maximum(-np.expm1(e + sums_left + epochs * h), 0.0)))
        # upper: cells at their right (remove) / left (add) edges, the outer cells' mass counted in full
        outer = 1.0 - (1.0 - (below + above + 4 * _CDF_ERROR)) ** epochs
        rem_up = float(np.sum(p_sum_up * np.maximum(-np.expm1(e - sums_left - epochs * h), 0.0))) + outer * math.exp(
            10.0 * epochs
        )
        add_up = float(np.sum(q_sum_up * np.maximum(-np.expm1(e + sums_left), 0.0))) + outer
        lows.append(max(rem_low, add_low))
        ups.append(min(1.0, max(rem_up, add_up)))
    return np.array(lows), np.array(ups)


@pytest.mark.parametrize(("z", "epochs"), [(1.0, 1), (1.0, 3), (2.0, 1), (2.0, 3)])
def test_add_or_remove_row_is_above_the_certified_exact_release_of_two_steps_per_epoch(z, epochs):
    eps = np.array([0.25, 0.5, 1.0, 2.0, 3.0, 4.0])
    lower, upper = _exact_t2(z, epochs, eps)
    profile = _profile(ADD_OR_REMOVE, n=4, b=2, z=z, epochs=epochs)
    row = np.array([profile.delta(float(e)) for e in eps])
    assert np.all(row >= lower), (row, lower)
    # tight: the exact value is certified to within the cells' width, and the row is within a few percent of it
    informative = lower > 1e-9
    assert np.all(row[informative] <= 1.1 * upper[informative] + 1e-12), (row, upper)


@pytest.mark.parametrize(("z", "epochs"), [(1.0, 1), (1.0, 3), (2.0, 5), (2.0, 20)])
def test_replace_one_row_is_above_the_exact_release_of_two_steps_per_epoch(z, epochs):
    """t = 2, replace-one: the privacy loss of (P°, Q°) is s (y_1 + y_2), N(s^2, 2 s^2) under P°: exactly
    sqrt(2E)/z-GDP over E epochs (docs/derivations/random-allocation.md#ra-ground-truth)."""
    exact = GaussianMixtureProfile.gaussian(math.sqrt(2.0 * epochs) / z)
    profile = _profile(REPLACE_ONE, n=4, b=2, z=z, epochs=epochs)
    for eps in (0.5, 1.0, 2.0, 4.0):
        assert profile.delta(eps) >= exact.delta(eps)
    for delta in (1e-3, 1e-5):
        assert exact.epsilon(delta) <= profile.epsilon(delta) <= 1.25 * exact.epsilon(delta)
    # the epoch row (no amplification) is valid too, and the allocation's row is below it
    cfg, a = lp.build(dataset_size=4, batch_size=2, noise_multiplier=z, epochs=epochs, sampling="random_allocation",
                      relation=REPLACE_ONE)  # fmt: skip
    epoch_row = lp.BOUNDS["composition-gdp-epochs"].profile(cfg, a)
    assert exact.epsilon(1e-5) <= profile.epsilon(1e-5) <= epoch_row.epsilon(1e-5)


# ---------------------------------------------------------------- every allocation enumerated


def _projected_mixture(grads: np.ndarray, steps_per_epoch: int, epochs: int, weights: np.ndarray):
    """Weights and means of sum_tau w_tau (the batch sum at step tau) over every allocation of every example to one
    step of each epoch (all equally likely)."""
    means = []
    for choice in itertools.product(range(steps_per_epoch), repeat=grads.size * epochs):
        alloc = np.array(choice).reshape(epochs, grads.size)
        means.append(
            sum(weights[e * steps_per_epoch + alloc[e, i]] * grads[i] for e in range(epochs) for i in range(grads.size))
        )
    values, counts = np.unique(np.round(np.array(means), 12), return_counts=True)
    return counts / counts.sum(), values


@pytest.mark.parametrize("relation", [ADD_OR_REMOVE, REPLACE_ONE])
@pytest.mark.parametrize("epochs", [1, 2])
def test_rows_are_above_every_allocation_of_three_examples_projected_on_the_last_iterate(relation, epochs):
    z, others, contraction = 1.0, [0.5, -0.3], 0.7
    steps = 2 * epochs
    w = contraction ** np.arange(steps - 1, -1, -1)  # the last iterate weighs the noisy sum of step tau by c^(T-1-tau)
    other = -1.0 if relation == REPLACE_ONE else 0.0
    pw, pm = _projected_mixture(np.array([1.0, *others]), 2, epochs, w)
    qw, qm = _projected_mixture(np.array([other, *others]), 2, epochs, w)
    exact = gaussian_mixture_hockey_stick(pw, pm, qw, qm, z * z * float(np.sum(w * w)), cells=20_000, reach=12.0)
    profile = _profile(relation, n=3, b=2, z=z, epochs=epochs)
    for eps in (0.0, 0.5, 1.0, 2.0):
        lower, _ = exact.delta(eps)
        assert profile.delta(eps) >= lower[0], (eps, profile.delta(eps), lower[0])


# ---------------------------------------------------------------- PLD_accounting's lower bound


@pytest.mark.parametrize(("steps", "interval"), [(2, 0.005), pytest.param(3, 0.01, marks=pytest.mark.slow)])
def test_add_or_remove_row_is_above_pld_accountings_optimistic_distribution(steps, interval):
    lower = ra.allocation_lower_pld(1.0, steps, interval).self_compose(2, tail_mass_truncation=0.0)
    profile = _profile(ADD_OR_REMOVE, n=steps, b=1, z=1.0, epochs=2)
    for delta in (1e-2, 1e-5, 1e-8):
        below = lower.get_epsilon_for_delta(delta)
        assert below <= profile.epsilon(delta) <= below * 1.02 + 0.01


# ---------------------------------------------------------------- known values, properties, refusals

ANCHOR = dict(dataset_size=60000, batch_size=1500, sampling="random_allocation", delta=1e-5)


@pytest.mark.parametrize(
    ("relation", "z", "epochs", "expected"),
    [
        (ADD_OR_REMOVE, 1.5, 50, 3.6160),
        (ADD_OR_REMOVE, 1.5, 200, 8.2197),
        (REPLACE_ONE, 3.0, 50, 3.3299),
        (REPLACE_ONE, 3.0, 200, 7.6725),
    ],
    ids=["anchor-add-remove-E50", "anchor-add-remove-E200", "z3-replace-one-E50", "z3-replace-one-E200"],
)
def test_anchor_values(relation, z, epochs, expected):
    """docs/derivations/random-allocation.md#ra-what-it-gives (PLD_accounting 2.0; dp-accounting 0.4.3 and 0.6)."""
    found = lp.epsilon("best", noise_multiplier=z, epochs=epochs, relation=relation, **ANCHOR)
    assert found.winner == (ROW if relation == ADD_OR_REMOVE else ROW_REPLACE)
    assert found.protects is lp.Protects.EVERY_ITERATE and found.relation.value == relation
    assert found.epsilon == pytest.approx(expected, rel=2e-3)


def test_anchor_is_within_one_percent_above_pld_accountings_own_upper_bound():
    """The issue's target on one setting (the benchmark measures all three): the row at most 1% above
    PLD_accounting's E-epoch call at its loss budget 0.01 (here it is below it)."""
    lib = ra._pld_accounting()
    theirs = lib.gaussian_allocation_pld(
        params=lib.PrivacyParams(sigma=1.5, num_steps=40, num_selected=1, num_epochs=50),
        config=lib.AllocationSchemeConfig(loss_discretization=0.01, convolution_method=lib.ConvolutionMethod.FFT),
        bound_type=lib.BoundType.DOMINATES,
    ).get_epsilon_for_delta(1e-5)
    assert theirs == pytest.approx(3.882, abs=1e-3)
    ours = lp.epsilon(ROW, noise_multiplier=1.5, epochs=50, relation=ADD_OR_REMOVE, **ANCHOR).epsilon
    assert ours <= 1.01 * theirs


@pytest.mark.parametrize("relation", [ADD_OR_REMOVE, REPLACE_ONE])
def test_monotone_in_epochs_and_in_noise(relation):
    params = dict(dataset_size=600, batch_size=60, sampling="random_allocation", relation=relation, delta=1e-5)
    by_epochs = [lp.epsilon(ROW if relation == ADD_OR_REMOVE else ROW_REPLACE, noise_multiplier=2.0, epochs=e,
                            **params).epsilon for e in (1, 3, 10)]  # fmt: skip
    by_noise = [lp.epsilon(ROW if relation == ADD_OR_REMOVE else ROW_REPLACE, noise_multiplier=z, epochs=5,
                           **params).epsilon for z in (1.0, 2.0, 4.0)]  # fmt: skip
    assert by_epochs == sorted(by_epochs) and len(set(by_epochs)) == 3
    assert by_noise == sorted(by_noise, reverse=True) and len(set(by_noise)) == 3


def test_k_of_t_is_at_most_its_groups_and_at_least_one_allocation():
    """k = 2 of t = 20 is bounded by two allocations of 10 (docs/derivations/random-allocation.md#ra-k-of-t): the row
    composes exactly those; it is above one allocation of 20 (the record is used twice as often)."""
    two = _profile(ADD_OR_REMOVE, n=200, b=20, z=2.0, epochs=3, k=2).first  # the distribution's profile
    assert (two.steps_per_epoch, two.allocations, two.epochs) == (20, 2, 3)
    assert two.epsilon(1e-5) == pytest.approx(baselines.RandomAllocationPldProfile(2.0, 10, 1, 6).epsilon(1e-5))
    assert ra.composed(2.0, 10, 1, 6).get_epsilon_for_delta(1e-5) == pytest.approx(two.epsilon(1e-5), rel=1e-6)
    one = _profile(ADD_OR_REMOVE, n=200, b=10, z=2.0, epochs=3).first
    assert one.steps_per_epoch == 20 and one.epsilon(1e-5) < two.epsilon(1e-5)


def test_groups_split_the_steps_of_an_epoch():
    assert ra.groups(40, 1, 5) == ((40, 5),)
    assert ra.groups(41, 2, 3) == ((20, 3), (21, 3))
    assert ra.groups(40, 3, 2) == ((13, 4), (14, 2))


_BASE = dict(dataset_size=100, batch_size=10, noise_multiplier=1.0, steps=100, sampling="random_allocation",
             relation=REPLACE_ONE)  # fmt: skip


@pytest.mark.parametrize(
    ("params", "unmet"),
    [
        (dict(batch_size=100), "ceil(dataset_size / batch_size) (the steps of an epoch) must be >= 2"),  # t = 1
        (dict(batch_size=80, allocations_per_epoch=2), "must be >= 4 (twice allocations_per_epoch)"),  # t = 3
        (dict(steps=2_000_000), "steps must be <= 1e+06"),
    ],
    ids=["full-batch", "groups-of-one", "long-run"],
)
def test_rows_refuse_what_they_do_not_compute(params, unmet):
    found = lp.applicable_bounds(**{**_BASE, **params})
    for bound in (ROW, ROW_REPLACE):
        assert not found[bound].applies and unmet in found[bound].reason, found[bound].reason


@pytest.mark.parametrize(("relation", "factor"), [(ADD_OR_REMOVE, 1.0), (REPLACE_ONE, 2.0)])
def test_below_the_smallest_noise_the_rows_are_the_gaussian_mechanism_without_amplification(relation, factor):
    """No precondition depends on the noise multiplier (calibration relies on it): below MIN_NOISE the distribution
    is not computed and the row is mu = sqrt(kE)/z (add-or-remove) or 2 sqrt(kE)/z (replace-one)."""
    z = 0.9 * ra.MIN_NOISE
    profile = _profile(relation, n=100, b=10, z=z, epochs=3, k=2)
    assert profile.epsilon(1e-5) == GaussianMixtureProfile.gaussian(factor * math.sqrt(6.0) / z).epsilon(1e-5)
    above = _profile(relation, n=100, b=10, z=ra.MIN_NOISE, epochs=3, k=2)  # the smaller of the two profiles
    unamplified = GaussianMixtureProfile.gaussian(factor * math.sqrt(6.0) / ra.MIN_NOISE)
    assert above.epsilon(1e-5) <= unamplified.epsilon(1e-5) < profile.epsilon(1e-5)
    assert above.delta(2.0) <= unamplified.delta(2.0)


def test_rows_apply_from_two_steps_per_epoch():
    for relation, bound in ((ADD_OR_REMOVE, ROW), (REPLACE_ONE, ROW_REPLACE)):
        found = lp.applicable_bounds(**{**_BASE, "batch_size": 60, "relation": relation})  # t = ceil(100/60) = 2
        assert found[bound].applies, found[bound].reason


def test_existing_epoch_rows_count_k_uses_per_epoch():
    """composition-gdp-epochs and composition cover random allocation under replace-one with k uses per epoch
    (docs/derivations/random-allocation.md#ra-rows)."""
    for k in (1, 3):
        cfg, a = lp.build(dataset_size=300, batch_size=30, noise_multiplier=2.0, epochs=4,
                          sampling="random_allocation", allocations_per_epoch=k, relation=REPLACE_ONE)  # fmt: skip
        mu = lp.BOUNDS["composition-gdp-epochs"].profile(cfg, a)
        assert mu.epsilon(1e-5) == pytest.approx(
            GaussianMixtureProfile.gaussian(2 * math.sqrt(4 * k) / 2.0).epsilon(1e-5)
        )
        rdp = lp.rdp("composition", [2.0], config=cfg, assumptions=a)
        assert rdp[0] == pytest.approx(4 * k * 2 * 2.0 / 4.0)
