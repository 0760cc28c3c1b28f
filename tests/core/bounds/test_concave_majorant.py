"""The law of the per-pattern optimum at c = 1 (docs/derivations/concave-majorant.md#concave-majorant).

Theorem D and the recursion against every membership pattern (exact rational arithmetic and the library's
Theorem A engine); the lattice law stochastically above the exact law, and below it when the atoms are rounded
down (the check can fail); the three membership rows against the exact G1/G2 mixtures, never above their
allocation, and their values on issue 40's settings.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

import lastiter_plugins as lp
from lastiter_plugins.bounds import concave_majorant as cm
from lastiter_plugins.bounds import dominating_mixture, membership_mixtures
from lastiter_plugins.bounds import shift_schedules as ss
from lastiter_plugins.bounds._glue import SmallestProfile
from lastiter_plugins.lower_end.exact import g1_laws, g1_params, g2_laws, g2_params

EPS_GRID = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)


def _majorant_cost(uses_from_end: tuple[int, ...]) -> Fraction:
    """Phi of the walk of the memberships counted from the end, in rational arithmetic (Lemma 1 at c = 1)."""
    walk = [0, *itertools.accumulate(uses_from_end)]
    hull = [(0, 0)]
    for point in enumerate(walk):
        if point[0] == 0:
            continue
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            if (y1 - y0) * (point[0] - x0) <= (point[1] - y0) * (x1 - x0):
                hull.pop()
            else:
                break
        hull.append(point)
    return sum((Fraction((y1 - y0) ** 2, x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull)), Fraction(0))


def _pattern_law(steps: int, q: Fraction) -> dict[Fraction, Fraction]:
    law: dict[Fraction, Fraction] = defaultdict(Fraction)
    for u in itertools.product((0, 1), repeat=steps):
        k = sum(u)
        law[_majorant_cost(u)] += q**k * (1 - q) ** (steps - k)
    return dict(law)


def _cycle_law(steps: int, q: Fraction) -> dict[Fraction, Fraction]:
    """The recursion (R): L_m = (1/m) sum_l K_l * L_{m-l}, K_l the law of Bin(l, q)^2 / l."""
    laws: list[dict[Fraction, Fraction]] = [{Fraction(0): Fraction(1)}]
    for m in range(1, steps + 1):
        out: dict[Fraction, Fraction] = defaultdict(Fraction)
        for length in range(1, m + 1):
            for k in range(length + 1):
                pk = math.comb(length, k) * q**k * (1 - q) ** (length - k)
                for value, p in laws[m - length].items():
                    out[value + Fraction(k * k, length)] += pk * p / m
        laws.append(dict(out))
    return laws[steps]


@pytest.mark.parametrize(("steps", "q"), [(5, Fraction(1, 2)), (8, Fraction(3, 10)), (9, Fraction(1, 20))])
def test_theorem_d_law_of_the_majorant_is_the_cycle_recursion(steps, q):
    """Every pattern's majorant cost against the random-permutation recursion, atom by atom (exact)."""
    assert _pattern_law(steps, q) == _cycle_law(steps, q)


def test_majorant_cost_is_theorem_a_optimum_at_c_one():
    """Lemma 1 at c = 1 (the library's engine) is s^2 Phi for every pattern of 10 steps."""
    for u in itertools.product((0, 1), repeat=10):
        times = [t for t in range(10) if u[t]]
        mu = ss.schedule_mu(use_times=times, steps=10, contraction=1.0, step_mu=1.0)
        assert mu**2 == pytest.approx(float(_majorant_cost(tuple(reversed(u)))), rel=1e-12, abs=1e-15)


def _exact_law(steps: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    law = _pattern_law(steps, Fraction(q))
    values = np.array([float(v) for v in law])
    probs = np.array([float(p) for p in law.values()])
    order = np.argsort(values)
    return values[order], probs[order]


def _survival_gap(steps: int, q: float) -> float:
    """min over x of S_lattice(x) - S_exact(x) for Phi (positive: the lattice law is stochastically larger)."""
    cm.majorant_law.cache_clear()
    weights, nus = cm.majorant_law(steps, q)
    values, probs = _exact_law(steps, q)
    lattice_values = nus**2
    gaps = []
    for x in np.unique(np.concatenate([values, values - 1e-9, lattice_values[np.isfinite(lattice_values)]])):
        gaps.append(weights[lattice_values > x].sum() - probs[values > x].sum())
    return float(min(gaps))


@pytest.mark.parametrize(("steps", "q"), [(6, 0.5), (10, 0.3), (12, 0.1), (12, 0.9)])
def test_lattice_law_is_stochastically_larger_than_the_exact_law(steps, q):
    assert _survival_gap(steps, q) >= -1e-15


def test_rounding_down_is_caught(monkeypatch):
    """The dominance check can fail: atoms rounded down instead of up give a smaller law."""
    monkeypatch.setattr(cm, "_cells", lambda values, h: np.floor(values / h))
    try:
        assert _survival_gap(10, 0.3) < -1e-6
    finally:
        cm.majorant_law.cache_clear()


def test_lattice_is_close_to_the_exact_law():
    """The rounding costs little: the lattice mean within 2 cells per expected cycle of the exact mean."""
    steps, q = 12, 0.3
    weights, nus = cm.majorant_law(steps, q)
    values, probs = _exact_law(steps, q)
    finite = np.isfinite(nus)
    exact_mean = float(values @ probs)
    assert exact_mean == pytest.approx(q * (1 - q) * sum(1 / j for j in range(1, steps + 1)) + q * q * steps)
    assert weights[~finite].sum() < 1e-8
    assert exact_mean <= float(weights[finite] @ nus[finite] ** 2) <= exact_mean + 0.02


def test_special_cases_and_refusals():
    assert cm.majorant_law(7, 0.0) == (pytest.approx([1.0]), pytest.approx([0.0]))
    weights, nus = cm.majorant_law(7, 1.0)
    assert list(weights) == [1.0] and nus[0] == pytest.approx(math.sqrt(7))  # one face: Phi = T
    with pytest.raises(ValueError, match="steps <= 2048"):
        cm.majorant_law(cm.MAX_STEPS + 1, 0.1)
    assert cm.worth_computing(1000, 1.0) and cm.worth_computing(2000, 0.9999)
    assert not cm.worth_computing(2000, 0.99) and not cm.worth_computing(cm.MAX_STEPS + 1, 1.0)


def test_binomial_pmf_is_as_accurate_as_assumed():
    rng = np.random.default_rng(40)
    for _ in range(60):
        length = int(rng.integers(1, cm.MAX_STEPS + 1))
        q = float(rng.uniform(0.001, 0.999))
        k = int(rng.integers(0, length + 1))
        exact = mpmath.binomial(length, k) * mpmath.mpf(q) ** k * (1 - mpmath.mpf(q)) ** (length - k)
        if exact < cm._DROP:
            continue
        computed = stats.binom.pmf(k, length, q)
        assert abs(computed - exact) <= cm._PMF_RELATIVE / 10 * exact, (length, k, q)


def test_entry_error_bound_holds_with_room():
    """Every cell of the transform's result against a direct real-space recursion (non-negative sums), within
    the bound without its margin."""
    steps, q = 60, 0.2
    atoms = cm._atoms(steps, q)
    h, _ = cm._unit(atoms, steps, q)
    transforms, input_error = cm._transforms(atoms, h)
    computed = np.fft.irfft(cm._recursion(transforms), cm.CELLS)
    kernels = []
    for length in range(1, steps + 1):
        values, probs = atoms[length]
        index = cm._cells(values, h).astype(np.int64)
        dense = np.zeros(cm.CELLS)
        np.add.at(dense, index[index < cm.CELLS], probs[index < cm.CELLS])
        kernels.append(dense)
    laws = [np.eye(1, cm.CELLS)[0]]
    for m in range(1, steps + 1):
        total = np.zeros(cm.CELLS)
        for length in range(1, m + 1):
            conv = np.convolve(kernels[length - 1], laws[m - length])
            total += conv[: cm.CELLS]
            total[: conv.size - cm.CELLS] += conv[cm.CELLS :]  # folded, as the transform does
        laws.append(total / m)
    error = np.abs(computed - laws[steps]).max()
    assert error <= cm._entry_error(steps, input_error) / cm._ERROR_MARGIN, error
    assert input_error < 1e-13


def _rows():
    return [
        ("shifted-interpolation-random-batch", "random_batch", "replace_one"),
        ("shifted-interpolation-poisson", "poisson", "add_or_remove_one"),
        ("shifted-interpolation-poisson-replace-one", "poisson", "replace_one"),
    ]


@pytest.mark.parametrize(("bound", "sampling", "relation"), _rows())
def test_rows_never_below_the_exact_linear_mixture(bound, sampling, relation):
    """G1 (linear losses, c = 1, where the rows compute the majorant): never below the exact mixture."""
    rng = np.random.default_rng(len(bound))
    for _ in range(6):
        b = int(rng.integers(1, 6))
        params = g1_params(
            dataset_size=b * int(rng.integers(2, 12)),
            batch_size=b,
            noise_multiplier=float(rng.uniform(0.3, 3.0)),
            steps=int(rng.integers(1, 300)),
            sampling=sampling,
            relation=relation,
        )
        assert lp.applicable_bounds(**params)[bound].applies, params
        profile = lp.BOUNDS[bound].profile(*lp.build(**params))
        assert isinstance(profile, SmallestProfile)  # the majorant is computed here
        lower, _ = g1_laws(params).hockey_stick().delta(np.array(EPS_GRID))
        for eps, low in zip(EPS_GRID, lower, strict=True):
            assert low <= profile.delta(eps) * (1 + 1e-9) + 1e-13, (params, eps, low)


@pytest.mark.parametrize(("bound", "sampling", "relation"), _rows())
def test_rows_never_below_the_exact_quadratic_mixture(bound, sampling, relation):
    """G2 (l2 term, every pattern enumerated), contraction weak enough for the majorant to be computed."""
    rng = np.random.default_rng(7 + len(bound))
    for _ in range(8):
        b = int(rng.integers(1, 5))
        steps = int(rng.integers(1, 11))
        lam = float(rng.uniform(0.01, 0.9)) / steps
        params = g2_params(
            strong_convexity=lam,
            dataset_size=b * int(rng.integers(2, 6)),
            batch_size=b,
            noise_multiplier=float(rng.uniform(0.4, 3.0)),
            steps=steps,
            learning_rate=1.0,
            clip_norm=float(rng.uniform(0.2, 3.0)),
            sampling=sampling,
            relation=relation,
            **({"l2_outside_clip": True} if sampling == "poisson" else {}),
        )
        profile = lp.BOUNDS[bound].profile(*lp.build(**params))
        assert isinstance(profile, SmallestProfile), params
        lower, _ = g2_laws(params).hockey_stick().delta(np.array(EPS_GRID))
        for eps, low in zip(EPS_GRID, lower, strict=True):
            assert low <= profile.delta(eps) * (1 + 1e-9) + 1e-13, (params, eps, low)


def test_an_optimistic_law_is_caught():
    """The check above can fail: the majorant's law scaled down by 30% falls below a G1 mixture."""
    params = g1_params(
        dataset_size=8, batch_size=2, noise_multiplier=0.5, steps=40, sampling="poisson", relation="replace_one"
    )
    cfg, _ = lp.build(**params)
    weights, nus = cm.majorant_law(cfg.steps, cfg.sampling_probability)
    scaled = dominating_mixture.DominatingMixtureProfile.of(weights, 0.7 * nus / 0.5, reflected=True)
    lower, _ = g1_laws(params).hockey_stick().delta(np.array(EPS_GRID))
    assert any(low > scaled.delta(eps) * 1.01 for eps, low in zip(EPS_GRID, lower, strict=True))


_CONVEX = dict(
    dataset_size=50000,
    batch_size=500,
    noise_multiplier=0.8,
    steps=1000,
    gradient_norms_within_clip=True,
    learning_rate=1.0,
    smoothness=1.0,
)


@pytest.mark.parametrize(
    ("sampling", "relation", "bound", "before", "now"),
    [
        ("poisson", "add_or_remove_one", "shifted-interpolation-poisson", 4.046, 2.85),
        ("random_batch", "replace_one", "shifted-interpolation-random-batch", 23.80, 15.3),
    ],
)
def test_issue_40_convex_settings(sampling, relation, bound, before, now):
    """Issue 40's convex settings at delta 1e-6: the row falls from its allocation's value to the majorant's,
    and the Poisson row is now best, within 1.5x of the lower end 1.909."""
    params = dict(_CONVEX, sampling=sampling, relation=relation)
    cfg, a = lp.build(**params)
    allocation = (
        membership_mixtures.random_batch_allocation(cfg, a)
        if sampling == "random_batch"
        else dominating_mixture.poisson_allocation(cfg, a, reflected=False)
    )
    assert allocation.epsilon(1e-6) == pytest.approx(before, abs=0.01)
    row = lp.epsilon(bound, 1e-6, **params).epsilon
    assert row == pytest.approx(now, abs=0.02)
    if sampling == "poisson":
        assert lp.epsilon("best", 1e-6, **params).epsilon <= 1.5 * 1.909


def test_rows_never_above_their_allocation():
    """The row is the smaller of two valid profiles: never above the allocation at any epsilon."""
    for sampling, relation, bound, _, _ in [
        ("random_batch", "replace_one", "shifted-interpolation-random-batch", 0, 0),
        ("poisson", "replace_one", "shifted-interpolation-poisson-replace-one", 0, 0),
    ]:
        params = dict(_CONVEX, steps=300, sampling=sampling, relation=relation)
        cfg, a = lp.build(**params)
        row = lp.BOUNDS[bound].profile(cfg, a)
        allocation = (
            membership_mixtures.random_batch_allocation(cfg, a)
            if sampling == "random_batch"
            else dominating_mixture.poisson_allocation(cfg, a, reflected=True)
        )
        for eps in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0):
            assert row.delta(eps) <= allocation.delta(eps)


def test_strongly_contracting_runs_keep_the_allocation_alone():
    params = dict(_CONVEX, strong_convexity=0.01, sampling="random_batch")
    assert not isinstance(lp.BOUNDS["shifted-interpolation-random-batch"].profile(*lp.build(**params)), SmallestProfile)
