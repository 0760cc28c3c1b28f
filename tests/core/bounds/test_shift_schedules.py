"""Schedule mixtures (docs/derivations/schedule-mixtures.md#schedule-mixtures): the exact per-schedule optimum of the
shift allocation of shifted interpolation (Bok, Su & Altschuler 2024, arXiv 2403.00278),
and the reshuffle bound built on it.

Ground truth: (1) the optimum is checked against a generic convex QP solver on random
schedules with per-step contractions and restarts; (2) the reshuffle profile is checked
against the exact mixture over every sequence of positions, first with the per-schedule
optimum (the relaxation step), then against the exact laws of strongly convex quadratics
(G2, Gaussian mixtures) and of the projected 1-D walk (G3, density evolution).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize

import lastiter_plugins as lp
from lastiter_plugins import profiles
from lastiter_plugins.bounds import shift_schedules as ss
from lastiter_plugins.bounds import shifted_interpolation as si
from lastiter_plugins.lower_end.exact import g2_laws, g2_params, g3_divergence, g3_params

EPS_GRID = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]


# ------------------------------------------------------------------ the per-schedule optimum


def _qp_optimum(steps, use_times, contraction, step_mu, diameter_ratio):
    """min sum a_t^2 over Theorem A's allocations, by a generic solver (SLSQP, several starts),
    over the start at 0 and every restart after a use; inf where the solver never converged."""
    inj = np.zeros(steps)
    inj[use_times] = step_mu
    starts = [(0, 0.0)]
    if diameter_ratio is not None:
        starts += [(t + 1, diameter_ratio) for t in use_times if t + 1 < steps]
    best = math.inf
    for tau, z0 in starts:

        def shifts(a, tau=tau, z0=z0):
            z = [z0]
            for t in range(tau, steps):
                z.append(contraction[t] * z[-1] + inj[t] - a[t - tau])
            return np.array(z)

        constraints = [
            {"type": "ineq", "fun": lambda a, f=shifts: f(a)[1:-1]},
            {"type": "eq", "fun": lambda a, f=shifts: f(a)[-1]},
        ]
        m = steps - tau
        for x0 in (np.full(m, 1.0), np.full(m, 0.1), np.linspace(0.1, 2.0, m)):
            res = optimize.minimize(
                lambda a: a @ a,
                x0,
                jac=lambda a: 2 * a,
                bounds=[(0, None)] * m,
                constraints=constraints,
                method="SLSQP",
                options={"ftol": 1e-14, "maxiter": 1000},
            )
            z = shifts(res.x)
            if res.success and z[1:].min() >= -1e-9 and abs(z[-1]) <= 1e-9:
                best = min(best, float(res.fun))
    return best


def test_schedule_optimum_equals_a_qp_solver():
    # a convex QP: a converged solver finds the global optimum, so a majorant cost below it would be
    # optimistic (no allocation reaches it) and one above it would be loose
    rng = np.random.default_rng(1)
    solved = 0
    for _ in range(120):
        steps = int(rng.integers(2, 12))
        c = rng.uniform(0.3, 1.0, size=steps) if rng.random() < 0.7 else np.ones(steps)
        times = np.sort(rng.choice(steps, size=int(rng.integers(1, steps + 1)), replace=False))
        s = float(rng.uniform(0.2, 2.0))
        d = None if rng.random() < 0.5 else float(rng.uniform(0.1, 3.0))
        qp = _qp_optimum(steps, times, c, s, d)
        ours = ss.schedule_mu(use_times=times, steps=steps, contraction=c, step_mu=s, diameter_ratio=d) ** 2
        if math.isfinite(qp):
            solved += 1
            assert ours == pytest.approx(qp, rel=1e-6), (steps, times, c, s, d)
    assert solved >= 100


def test_one_use_is_theta():
    # one use r steps before the end: s^2 theta_c(r + 1)
    # (docs/derivations/shifted-interpolation.md#shifted-interpolation)
    for c, steps, t in [(0.9, 20, 5), (1.0, 7, 0), (0.5, 3, 2)]:
        r = steps - 1 - t
        expected = 0.7**2 * c ** (2 * r) / sum(c ** (2 * u) for u in range(r + 1))
        assert ss.schedule_mu(use_times=[t], steps=steps, contraction=c, step_mu=0.7) ** 2 == pytest.approx(expected)


def test_monotone_in_use_times_uses_and_contractions():
    # Lemma 2: a later use, an extra use or a weaker contraction never lowers mu
    rng = np.random.default_rng(2)
    for _ in range(300):
        steps = int(rng.integers(2, 30))
        c = rng.uniform(0.2, 1.0, size=steps)
        times = np.sort(rng.choice(steps, size=int(rng.integers(1, steps)), replace=False))
        d = None if rng.random() < 0.5 else float(rng.uniform(0.1, 5.0))
        kw = dict(steps=steps, step_mu=0.8, diameter_ratio=d)
        base = ss.schedule_mu(use_times=times, contraction=c, **kw)
        free = np.setdiff1d(np.arange(steps), times)
        i = int(rng.integers(times.size))
        later = [t for t in free if t > times[i] and (i + 1 == times.size or t < times[i + 1])]
        if later:
            moved = times.copy()
            moved[i] = later[int(rng.integers(len(later)))]
            assert ss.schedule_mu(use_times=moved, contraction=c, **kw) >= base * (1 - 1e-12)
        if free.size:
            added = np.append(times, rng.choice(free))
            assert ss.schedule_mu(use_times=added, contraction=c, **kw) >= base * (1 - 1e-12)
        weaker = np.minimum(c * rng.uniform(1.0, 1.5, size=steps), 1.0)
        assert ss.schedule_mu(use_times=times, contraction=weaker, **kw) >= base * (1 - 1e-12)


def _family_schedule(spacing, uses, gap, after):
    """Use times of 'uses - 1 uses spaced by l, then one more gap steps later, after steps before the end'."""
    last = (uses - 2) * spacing + gap if uses >= 2 else 0
    times = [k * spacing for k in range(uses - 1)] + [last]
    return np.array(times), last + after + 1


def test_spaced_uses_family_equals_the_reference():
    rng = np.random.default_rng(3)
    for _ in range(400):
        spacing, uses = int(rng.integers(1, 9)), int(rng.integers(1, 12))
        gap, after = int(rng.integers(1, 2 * spacing + 2)), int(rng.integers(0, 3 * spacing + 2))
        c = float(rng.choice([1.0, 1 - 10 ** rng.uniform(-5, -0.1)]))
        d = None if rng.random() < 0.4 else float(10 ** rng.uniform(-1.5, 1.5))
        s = float(rng.uniform(0.05, 3.0))
        times, steps = _family_schedule(spacing, uses, gap, after)
        reference = ss.schedule_mu(use_times=times, steps=steps, contraction=c, step_mu=s, diameter_ratio=d) ** 2
        ours = ss.spaced_uses_mu2(
            step_mu=s, log_contraction=math.log(c), spacing=spacing, uses=uses, gap=gap, after=after, diameter_ratio=d
        )
        assert float(ours) == pytest.approx(reference, rel=1e-9, abs=1e-300), (spacing, uses, gap, after, c, d, s)


def _closed_form(s, c, per_epoch, uses, after):
    """docs/derivations/shifted-interpolation.md#si-cyclic, (*): one feasible allocation per cyclic position."""
    theta = c ** (2 * after) / sum(c ** (2 * u) for u in range(after + 1))
    if uses == 1:
        return s * s * theta
    if c == 1.0:
        return s * s * (theta + (uses - 1) / per_epoch)
    rho, b = c**per_epoch, uses - 1
    fb = (1 + rho) * (1 - rho**b) / ((1 - rho) * (1 + rho**b))
    return s * s * (theta + c ** (2 * per_epoch - 2) * (1 - c * c) / (1 - rho) ** 2 * (1 - rho) / (1 + rho) * fb)


def test_cyclic_positions_never_above_the_closed_form():
    rng = np.random.default_rng(4)
    strictly_below = 0
    for _ in range(200):
        per_epoch, steps = int(rng.integers(2, 15)), int(rng.integers(1, 120))
        c = float(rng.choice([1.0, 1 - 10 ** rng.uniform(-4, -0.3)]))
        mus = si.cyclic_position_mus(step_mu=0.6, contraction=c, steps_per_epoch=per_epoch, steps=steps)
        full, rest = divmod(steps, per_epoch)
        for j in range(per_epoch):
            uses = full + (j < rest)
            if uses == 0:
                assert mus[j] == 0.0
                continue
            after = steps - 1 - (j + (uses - 1) * per_epoch)
            closed = _closed_form(0.6, c, per_epoch, uses, after)
            assert mus[j] ** 2 <= closed * (1 + 1e-9)
            strictly_below += mus[j] ** 2 < closed * (1 - 1e-6)
    assert strictly_below > 0  # the majorant is sometimes a straight line (c < 1, long tails)


# ------------------------------------------------------------------ reshuffle


def _positions_mixture_delta(n, b, steps, c, s, d, eps):
    """delta(eps) of the exact mixture over every sequence of per-pass positions, each sequence
    given its own optimal mu (no relaxation): what the reshuffle profile relaxes."""
    per_epoch = -(-n // b)
    weights = si.batch_position_weights(n, b)
    passes = -(-steps // per_epoch)
    total = np.zeros(len(eps))
    for seq in itertools.product(range(per_epoch), repeat=passes):
        times = [e * per_epoch + p for e, p in enumerate(seq) if e * per_epoch + p < steps]
        w = math.prod(weights[p] for p in seq)
        mu = ss.schedule_mu(use_times=times, steps=steps, contraction=c, step_mu=s, diameter_ratio=d)
        total += w * np.array([float(profiles.gdp_delta(mu, e)) for e in eps])
    return total


def test_reshuffle_profile_dominates_the_exact_mixture_over_position_sequences():
    rng = np.random.default_rng(5)
    for _ in range(25):
        b = int(rng.integers(1, 4))
        n = b * int(rng.integers(2, 5)) + int(rng.integers(0, b))
        per_epoch = -(-n // b)
        steps = int(rng.integers(1, 3 * per_epoch + 1))
        c = float(rng.choice([1.0, float(rng.uniform(0.5, 0.999))]))
        d = None if rng.random() < 0.5 else float(rng.uniform(0.2, 4.0))
        s = float(rng.uniform(0.3, 2.0))
        w, mus = si.reshuffle_profile(
            step_mu=s, contraction=c, dataset_size=n, batch_size=b, steps=steps, diameter_ratio=d
        )
        assert w.sum() == pytest.approx(1.0)
        exact = _positions_mixture_delta(n, b, steps, c, s, d, EPS_GRID)
        for eps, e in zip(EPS_GRID, exact, strict=True):
            assert profiles.mixture_delta(w, mus, eps) >= e * (1 - 1e-9) - 1e-15, (n, b, steps, c, d, eps)


def test_reshuffle_equals_the_exact_mixture_for_one_pass():
    # T <= l: one pass, nothing relaxed: the profile is the mixture over the position exactly
    n, b, steps, c, s = 7, 2, 3, 0.8, 0.9
    w, mus = si.reshuffle_profile(step_mu=s, contraction=c, dataset_size=n, batch_size=b, steps=steps)
    exact = _positions_mixture_delta(n, b, steps, c, s, None, EPS_GRID)
    for eps, e in zip(EPS_GRID, exact, strict=True):
        assert profiles.mixture_delta(w, mus, eps) == pytest.approx(e, rel=1e-9)


def _reshuffle_params(rng, short: bool):
    b = int(rng.integers(2, 5))
    n = b * int(rng.integers(2, 5)) + (int(rng.integers(1, b)) if short else 0)
    per_epoch = -(-n // b)
    lam = float(10 ** rng.uniform(-2, 0))
    return g2_params(
        strong_convexity=lam,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=float(rng.uniform(0.5, 4.0)),
        learning_rate=float(rng.uniform(0.05, 0.95)) / lam,
        steps=int(rng.integers(1, 3 * per_epoch + 1)),
        sampling="reshuffle",
    )


@pytest.mark.parametrize("short", [False, True], ids=["b divides n", "short last batch"])
def test_g2_reshuffle_never_below_exact(short):
    """Strongly convex quadratics: the last iterate is a Gaussian mixture over the per-pass
    positions (exact laws); its certified hockey-stick divergence must not exceed the bound."""
    rng = np.random.default_rng(6 + short)
    ratios = []
    for _ in range(12):
        params = _reshuffle_params(rng, short)
        profile = lp.BOUNDS["shifted-interpolation-reshuffle"].profile(*lp.build(**params))
        exact = g2_laws(params).hockey_stick()
        lower, _ = exact.delta(np.array(EPS_GRID))
        for eps, low in zip(EPS_GRID, lower, strict=True):
            bound = profile.delta(eps)
            assert low <= bound * (1 + 1e-9) + 1e-13, (params, eps, low, bound)
            if low > 1e-6:
                ratios.append(bound / low)
    assert ratios and min(ratios) >= 1.0


def test_g3_reshuffle_with_a_projection_never_below_exact():
    """Projected 1-D walk (linear losses, convex c = 1, diameter D): certified exact privacy
    profile by density evolution (a non-Gaussian last iterate)."""
    rng = np.random.default_rng(8)
    for _ in range(4):
        b = int(rng.integers(1, 3))
        n = b * int(rng.integers(2, 4))
        z, lr, clip = float(rng.uniform(0.6, 2.0)), 0.5, 1.0
        s = lr * z * clip / b
        params = g3_params(
            diameter=float(rng.uniform(0.5, 3.0)) * s,
            dataset_size=n,
            batch_size=b,
            noise_multiplier=z,
            learning_rate=lr,
            clip_norm=clip,
            steps=int(rng.integers(2, 7)),
            sampling="reshuffle",
        )
        profile = lp.BOUNDS["shifted-interpolation-reshuffle"].profile(*lp.build(**params))
        exact, _ = g3_divergence(np.array([2.0]), params, hockey_stick=True, max_nodes=800, fine_cells=4000)
        lower, _ = exact.hockey_stick.delta(np.array(EPS_GRID))
        for eps, low in zip(EPS_GRID, lower, strict=True):
            assert low <= profile.delta(eps) * (1 + 1e-9) + 1e-12, (params, eps)


PAPER_SETTING = dict(step_mu=2 / 3, contraction=0.9999, dataset_size=60_000, batch_size=1500)


@pytest.mark.parametrize(("epochs", "expected"), [(50, 3.491), (100, 4.809), (200, 6.901)], ids=["E50", "E100", "E200"])
def test_reshuffle_on_the_shifted_interpolation_paper_setting(epochs, expected):
    # n = 60000, b = 1500, z = 3, c = 0.9999, delta = 1e-5 (docs/anchor-table.md): within 5% of shuffle-once
    reshuffle = profiles.mixture_epsilon(*si.reshuffle_profile(**PAPER_SETTING, steps=40 * epochs), 1e-5)
    once = profiles.mixture_epsilon(*si.shuffle_once_profile(**PAPER_SETTING, steps=40 * epochs), 1e-5)
    assert reshuffle == pytest.approx(expected, abs=5e-4)
    assert reshuffle <= 1.05 * once


def test_reshuffle_blocks_only_raise_the_profile(monkeypatch):
    # more than EXACT_POSITIONS positions: blocks of positions take their largest mu (Lemma 2)
    kw = dict(step_mu=0.5, contraction=0.999, dataset_size=300, batch_size=1, steps=900, diameter_ratio=20.0)
    exact_w, exact_mu = si.reshuffle_profile(**kw)
    monkeypatch.setattr(si, "EXACT_POSITIONS", 16)
    grouped_w, grouped_mu = si.reshuffle_profile(**kw)
    assert grouped_w.size < exact_w.size and grouped_w.sum() == pytest.approx(1.0)
    for eps in EPS_GRID:
        assert profiles.mixture_delta(grouped_w, grouped_mu, eps) >= profiles.mixture_delta(exact_w, exact_mu, eps)


def test_reshuffle_is_a_registry_row_that_best_uses():
    params = dict(
        sampling="reshuffle",
        dataset_size=60_000,
        batch_size=1500,
        noise_multiplier=3.0,
        learning_rate=2e-4,
        epochs=100,
        smoothness=1.0,
        strong_convexity=0.5,
        gradient_norms_within_clip=True,
    )
    result = lp.epsilon("best", 1e-5, **params)
    assert result.winner == "shifted-interpolation-reshuffle"
    assert float(result.epsilon) == pytest.approx(4.809, abs=5e-4)
    assert lp.epsilon("composition", 1e-5, **params).epsilon > 10 * result.epsilon
    with pytest.raises(lp.NotApplicableError, match="sampling must be one of reshuffle"):
        lp.epsilon("shifted-interpolation-reshuffle", 1e-5, **{**params, "sampling": "shuffle_once"})


ISSUE_30_EXAMPLE = dict(dataset_size=60, batch_size=30, noise_multiplier=0.8, learning_rate=0.3, sampling="reshuffle")


def test_reshuffle_partial_epoch_cannot_be_made_monotone_by_conditioning():
    """Issue 30, item 4 (docs/derivations/schedule-mixtures.md#sm-partial-last-epochs): on the example the row is 19.70
    at T = 3
    (a partial second epoch) and 15.37 at T = 4. Every bound that conditions on the positions is at
    least the joint-convexity mixture of the exact per-schedule G2 values (quadratics, lam = M = 1:
    the same c = 0.7, and within the declared M = 2), 17.3 at T = 3: above the row at T = 4, so no
    refinement of the schedule mixture can make the row monotone there. The row itself is never below
    the exact G2 mixture at any T (partial epochs included)."""
    row = {}
    for steps in range(1, 7):
        params = dict(ISSUE_30_EXAMPLE, steps=steps, strong_convexity=1.0, smoothness=2.0,
                      gradient_norms_within_clip=True)  # fmt: skip
        row[steps] = lp.epsilon(delta=1e-5, bound="shifted-interpolation-reshuffle", **params).epsilon
        laws = g2_laws(g2_params(strong_convexity=1.0, **ISSUE_30_EXAMPLE, steps=steps))
        assert row[steps] >= laws.hockey_stick().epsilon(1e-5)[0], steps
        if steps == 3:
            per_schedule = 2.0 * laws.p_means / math.sqrt(laws.variance)  # exact mu of each schedule
            conditioned = profiles.GaussianMixtureProfile.mixture(laws.p_weights, per_schedule).epsilon(1e-5)
    assert row[3] >= conditioned > row[4]
