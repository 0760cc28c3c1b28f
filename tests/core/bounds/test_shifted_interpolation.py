"""Shifted interpolation (Bok, Su & Altschuler 2024, arXiv 2403.00278): known values
from the paper and ground truth on the exact linear-Gaussian instances G1/G2.

The exact side: G2 (strongly convex quadratics) and G1 (linear losses) have
Gaussian last iterates, N(+-m_j, V) for the differing example in batch j, so the
exact GDP parameter of a fixed position is 2 m_j / sqrt(V); shuffle-once
releases the uniform mixtures over j, whose exact hockey-stick divergence is
bounded from below by P(A) - e^eps Q(A) for the union A of grid cells where the
density ratio exceeds e^eps (exact normal-CDF masses). A bound below either is
optimistic.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import special

from lastiter_plugins import profiles
from lastiter_plugins.bounds import shifted_interpolation as si
from lastiter_plugins.lower_end.exact import g2_params, g2_position_shifts


def _paper_cyclic(mu: float, c: float, per_epoch: int, epochs: int) -> float:
    """The NoisyCGD formula as written in the authors' code (jinhobok/shifted_interpolation_dp)."""
    k = c ** (per_epoch * (epochs - 1))
    return mu * math.sqrt(1 + c ** (2 * per_epoch - 2) * (1 - c**2) / (1 - c**per_epoch) ** 2 * (1 - k) / (1 + k))


# ------------------------------------------------------------------ known values (the paper's numbers)

PAPER = [(0.9999, 50, 4.34), (0.9999, 100, 5.60), (0.9999, 200, 7.58)]


@pytest.mark.parametrize(("c", "epochs", "printed"), PAPER, ids=[f"c={c},E={e}" for c, e, _ in PAPER])
def test_logistic_regression_table(c, epochs, printed):
    # l = 40 batches, z = 3 (per-step mu = 2/3), delta = 1e-5
    mu = si.cyclic_mu(step_mu=si.replace_one_step_mu(3.0), contraction=c, steps_per_epoch=40, steps=40 * epochs)
    assert profiles.gdp_epsilon(mu, 1e-5) == pytest.approx(printed, abs=0.005)


def test_full_batch_toy_example():
    mu = si.full_batch_mu(step_mu=0.1, contraction=0.95, steps=160)
    assert profiles.gdp_epsilon(mu, 1e-5) == pytest.approx(2.56, abs=0.005)


def test_cyclic_equals_the_papers_formula():
    rng = np.random.default_rng(11)
    for _ in range(200):
        c = float(1 - 10 ** rng.uniform(-6, -0.3))
        per_epoch, epochs = int(rng.integers(1, 200)), int(rng.integers(1, 500))
        mu = float(rng.uniform(0.01, 3))
        ours = si.cyclic_mu(step_mu=mu, contraction=c, steps_per_epoch=per_epoch, steps=per_epoch * epochs)
        if per_epoch == 1:
            # one batch: the optimum of the shift allocation is the (exact) full-batch value, which the
            # paper's cyclic formula (a feasible allocation through every use) does not reach
            exact = si.full_batch_mu(step_mu=mu, contraction=c, steps=epochs)
            assert ours == pytest.approx(exact, rel=1e-12)
            assert ours <= _paper_cyclic(mu, c, per_epoch, epochs) * (1 + 1e-12)
            continue
        assert ours == pytest.approx(_paper_cyclic(mu, c, per_epoch, epochs), rel=1e-9)
        # a partial last pass counts as a pass (E = ceil(T/l))
        if per_epoch > 1:
            part = si.cyclic_mu(step_mu=mu, contraction=c, steps_per_epoch=per_epoch, steps=per_epoch * epochs + 1)
            assert part == pytest.approx(_paper_cyclic(mu, c, per_epoch, epochs + 1), rel=1e-9)


def test_worst_position_shortcut_matches_all_positions():
    rng = np.random.default_rng(5)
    for _ in range(150):
        per_epoch = int(rng.integers(1, 40))
        steps = int(rng.integers(1, 600))
        c = float(rng.choice([1.0, 1 - 10 ** rng.uniform(-5, -0.2)]))
        d = None if rng.random() < 0.3 else float(10 ** rng.uniform(-2, 2))
        kw = dict(step_mu=float(rng.uniform(0.05, 2)), contraction=c, steps_per_epoch=per_epoch, steps=steps)
        every = si.cyclic_position_mus(**kw, diameter_ratio=d)
        assert si.cyclic_mu(**kw, diameter_ratio=d) == pytest.approx(every.max(), rel=1e-12)
        # a projection only adds schedules; composition sqrt(N) s is never beaten from below by more than rounding
        assert np.all(every <= si.cyclic_position_mus(**kw) * (1 + 1e-12))


def test_full_batch_special_cases():
    assert si.full_batch_mu(step_mu=0.3, contraction=1.0, steps=50) == pytest.approx(0.3 * math.sqrt(50))
    assert si.full_batch_mu(step_mu=0.3, contraction=0.5, steps=0) == 0.0
    # constrained convex: min_m (D + m s)^2 / m, here D/s = 100 integer: 4 D s
    assert si.full_batch_mu(step_mu=0.5, contraction=1.0, steps=10**6, diameter_ratio=50.0) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        si.full_batch_mu(step_mu=0.3, contraction=1.2, steps=5)


def test_speed_at_a_million_steps():
    kw = dict(step_mu=0.5, contraction=0.9999, steps=10**6 + 7, diameter_ratio=30.0)
    calls = [
        lambda: si.cyclic_mu(steps_per_epoch=40, **kw),
        lambda: si.cyclic_mu(steps_per_epoch=10**6, **kw),
        lambda: si.full_batch_mu(**kw),
    ]
    for call in calls:
        call()
        start = time.perf_counter()
        for _ in range(10):
            call()
        assert (time.perf_counter() - start) / 10 < 0.05  # about 1 ms when the machine is idle


# ------------------------------------------------------------------ ground truth G2 / G1


def _g2_instance(rng, *, full_batch: bool = False):
    b = int(rng.integers(1, 20))
    n = b if full_batch else int(b * rng.integers(1, 8) + rng.integers(0, b))
    n = max(n, 1)
    per_epoch = -(-n // b)
    lam = float(10 ** rng.uniform(-3, 0))
    lr = float(rng.uniform(0.05, 1.0) / lam)  # eta lam in (0.05, 1): every rho_t in [0, 1)
    lr = min(lr, 1.0 / lam)
    steps = int(rng.integers(1, 8 * per_epoch + 2))
    z = float(rng.uniform(0.5, 8.0))
    params = g2_params(
        strong_convexity=lam,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=z,
        learning_rate=lr,
        steps=steps,
        sampling="cyclic",
    )
    shifts, variance = g2_position_shifts(params)
    exact = 2.0 * np.abs(shifts) / math.sqrt(variance)  # exact GDP parameter per position
    c = si.worst_batch_contraction(learning_rate=lr, strong_convexity=lam, smoothness=lam, dataset_size=n, batch_size=b)
    return dict(n=n, b=b, z=z, steps=steps, per_epoch=per_epoch, c=c), exact


def test_g2_full_batch_is_exact():
    rng = np.random.default_rng(2024)
    for _ in range(300):
        inst, exact = _g2_instance(rng, full_batch=True)
        bound = si.full_batch_mu(step_mu=2.0 / inst["z"], contraction=inst["c"], steps=inst["steps"])
        ratio = bound / exact[0]
        assert 1.0 - 1e-12 <= ratio <= 1.001, (inst, ratio)


def test_g2_cyclic_every_position_never_below_exact():
    rng = np.random.default_rng(77)
    ratios = []
    for _ in range(300):
        inst, exact = _g2_instance(rng)
        bound = si.cyclic_position_mus(
            step_mu=2.0 / inst["z"], contraction=inst["c"], steps_per_epoch=inst["per_epoch"], steps=inst["steps"]
        )
        assert np.all(bound >= exact * (1 - 1e-12)), (inst, bound, exact)
        worst = si.cyclic_mu(
            step_mu=2.0 / inst["z"], contraction=inst["c"], steps_per_epoch=inst["per_epoch"], steps=inst["steps"]
        )
        assert worst >= exact.max() * (1 - 1e-12)
        ratios.append(worst / exact.max())
    print(f"\nG2 cyclic worst position: bound/exact in [{min(ratios):.4f}, {max(ratios):.4f}]")


def test_g1_cyclic_linear_losses_never_below_exact():
    # linear losses (M = 0, c = 1): exact mu for N uses in T steps is 2 N / (z sqrt(T))
    rng = np.random.default_rng(9)
    for _ in range(300):
        per_epoch, steps, z = int(rng.integers(1, 50)), int(rng.integers(1, 2000)), float(rng.uniform(0.5, 10))
        full, rest = divmod(steps, per_epoch)
        uses = full + (np.arange(per_epoch) < rest)
        exact = 2.0 * uses / (z * math.sqrt(steps))
        bound = si.cyclic_position_mus(step_mu=2.0 / z, contraction=1.0, steps_per_epoch=per_epoch, steps=steps)
        assert np.all(bound >= exact * (1 - 1e-12))


# ------------------------------------------------------------------ exact hockey-stick of 1-D Gaussian mixtures


def _hockey_stick_lower(weights, p_means, q_means, std, eps_values, cells=12_000):
    r"""Rigorous lower bounds on sup_A P(A) - e^eps Q(A), one per eps, for P = sum w N(p_j, V),
    Q = sum w N(q_j, V): the value at A = the cells whose midpoint has p > e^eps q (exact CDF masses)."""
    lo = min(p_means.min(), q_means.min()) - 40 * std
    hi = max(p_means.max(), q_means.max()) + 40 * std
    edges = np.linspace(lo, hi, cells + 1)
    mids = 0.5 * (edges[1:] + edges[:-1])

    def masses(means):
        return weights @ np.diff(special.ndtr((edges[None, :] - means[:, None]) / std), axis=1)

    def log_density(means):
        zz = (mids[None, :] - means[:, None]) / std
        return special.logsumexp(-0.5 * zz**2, axis=0, b=weights[:, None])

    p_cells, q_cells = masses(p_means), masses(q_means)
    log_ratio = log_density(p_means) - log_density(q_means)
    return [float(np.sum((p_cells - math.exp(e) * q_cells)[log_ratio > e])) for e in eps_values]


def test_hockey_stick_helper_reproduces_the_gaussian_profile():
    # two Gaussians N(+-m, 1): exactly (2m)-GDP, so the helper must match gdp_delta (and can flag a 1% deflation)
    for m, eps in [(0.3, 0.2), (1.0, 1.0), (2.0, 3.0)]:
        (lower,) = _hockey_stick_lower(np.array([1.0]), np.array([m]), np.array([-m]), 1.0, [eps])
        exact = float(profiles.gdp_delta(2 * m, eps))
        assert lower <= exact * (1 + 1e-9)
        assert lower >= exact * (1 - 1e-4)
        assert lower > float(profiles.gdp_delta(0.99 * 2 * m, eps))  # an optimistic bound would be caught


EPS_GRID = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]


def test_g2_shuffle_once_mixture_never_below_exact():
    rng = np.random.default_rng(31)
    checked = 0
    for _ in range(40):
        inst, _ = _g2_instance(rng)
        if inst["per_epoch"] < 2:
            continue
        params = g2_params(
            strong_convexity=1.0,
            dataset_size=inst["n"],
            batch_size=inst["b"],
            noise_multiplier=inst["z"],
            learning_rate=float(1 - inst["c"]),  # eta lam r/b for the full batches: c = 1 - eta lam (lam = 1)
            steps=inst["steps"],
            sampling="shuffle_once",
        )
        shifts, variance = g2_position_shifts(params)
        c = si.worst_batch_contraction(
            learning_rate=float(1 - inst["c"]),
            strong_convexity=1.0,
            smoothness=1.0,
            dataset_size=inst["n"],
            batch_size=inst["b"],
        )
        weights, mus = si.shuffle_once_profile(
            step_mu=2.0 / inst["z"], contraction=c, dataset_size=inst["n"], batch_size=inst["b"], steps=inst["steps"]
        )
        exacts = _hockey_stick_lower(weights, shifts, -shifts, math.sqrt(variance), EPS_GRID)
        for eps, exact in zip(EPS_GRID, exacts, strict=True):
            bound = profiles.mixture_delta(weights, mus, eps)
            assert exact <= bound * (1 + 1e-9) + 1e-13, (inst, eps, exact, bound)
        checked += 1
    assert checked >= 20


def test_g1_shuffle_once_mixture_never_below_exact():
    # linear losses, c = 1: position j is used N_j times, the last iterates are N(+-a N_j, V)
    rng = np.random.default_rng(41)
    for _ in range(30):
        b = int(rng.integers(1, 6))
        n = int(b * rng.integers(2, 8) + rng.integers(0, b))
        per_epoch = -(-n // b)
        steps, z = int(rng.integers(1, 6 * per_epoch)), float(rng.uniform(0.5, 6))
        full, rest = divmod(steps, per_epoch)
        uses = (full + (np.arange(per_epoch) < rest)).astype(float)
        std = z * math.sqrt(steps)  # in units of eta C / b
        weights, mus = si.shuffle_once_profile(
            step_mu=2.0 / z, contraction=1.0, dataset_size=n, batch_size=b, steps=steps
        )
        exacts = _hockey_stick_lower(weights, uses, -uses, std, EPS_GRID)
        for eps, exact in zip(EPS_GRID, exacts, strict=True):
            assert exact <= profiles.mixture_delta(weights, mus, eps) * (1 + 1e-9) + 1e-13


def test_shuffle_once_beats_cyclic_on_the_paper_setting():
    for epochs in (50, 100, 200):
        w, m = si.shuffle_once_profile(
            step_mu=2 / 3, contraction=0.9999, dataset_size=60_000, batch_size=1500, steps=40 * epochs
        )
        shuffle = profiles.mixture_epsilon(w, m, 1e-5)
        cyclic = profiles.gdp_epsilon(
            si.cyclic_mu(step_mu=2 / 3, contraction=0.9999, steps_per_epoch=40, steps=40 * epochs), 1e-5
        )
        assert shuffle < cyclic
