"""Liang et al. (arXiv 2502.17772) under add-or-remove-one: the sampled-Gaussian term
has sensitivity C (noise multiplier sqrt(beta)*z), derivation in
docs/derivations/liang.md#add-or-remove-sensitivity. Known values against dp-accounting, and ground
truths G1 and G3 (Poisson, add_or_remove_one) that the tighter numbers must respect.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from lastiter_plugins.bounds import liang
from lastiter_plugins.lower_end.exact import g1_divergence, g1_params, g3_divergence, g3_params


@pytest.mark.parametrize(("q", "z", "steps"), [(0.01, 1.0, 1000), (0.05, 0.8, 1), (0.2, 2.5, 37)])
def test_unbounded_equals_poisson_composition(q, z, steps):
    """liang-unbounded = T * S_alpha(q, z): dp-accounting's PoissonSampledDpEvent(q, GaussianDpEvent(z)) x T,
    exactly at integer orders; at fractional orders never above dp-accounting's (0.6's fractional series can
    exceed the chord of the convex cumulant between integer orders, which is then used: still an upper bound)."""
    orders = np.array([1.5, 2.0, 3.5, 8.0, 32.0, 128.0])
    acc = dp_rdp.RdpAccountant(orders=orders.tolist())
    acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)
    theirs = np.asarray(acc._rdp)
    ours = liang.unbounded_rdp(orders, sampling_probability=q, noise_multiplier=z, steps=steps)
    integer = orders == np.floor(orders)
    np.testing.assert_allclose(ours[integer], theirs[integer], rtol=1e-9)
    assert (ours[~integer] <= theirs[~integer] * (1 + 1e-9)).all()
    # the fractional value is the smaller of dp-accounting's series and the chord between integer orders
    lo, hi = np.floor(orders[~integer]), np.ceil(orders[~integer])
    at_hi = liang.unbounded_rdp(hi, sampling_probability=q, noise_multiplier=z, steps=steps)
    at_lo = liang.unbounded_rdp(np.maximum(lo, 2.0), sampling_probability=q, noise_multiplier=z, steps=steps)
    low_cumulant = np.where(lo == 1.0, 0.0, (lo - 1) * at_lo)  # the cumulant is 0 at order 1
    t = orders[~integer] - lo
    chord = ((1 - t) * low_cumulant + t * (hi - 1) * at_hi) / (orders[~integer] - 1)
    np.testing.assert_allclose(ours[~integer], np.minimum(chord, theirs[~integer]), rtol=1e-9)


def _g1(q_n_b, z, steps):
    n, b = q_n_b
    return g1_params(dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps,
                     sampling="poisson", relation="add_or_remove_one")  # fmt: skip


def test_unbounded_is_tight_at_one_step():
    """One step of G1 is exactly the sampled Gaussian mechanism: the bound equals the truth
    (a bound using noise 2z, i.e. sensitivity C/2, would fail; 2C would be 4x loose)."""
    orders = np.array([2.0, 4.0, 8.0, 16.0, 32.0])
    exact = g1_divergence(orders, _g1((100, 5), 1.0, 1))
    bound = liang.unbounded_rdp(orders, sampling_probability=0.05, noise_multiplier=1.0, steps=1)
    assert np.all(bound >= exact.lower * (1 - 1e-9))
    assert np.all(bound <= exact.upper * (1 + 1e-6))
    too_small = liang.unbounded_rdp(orders, sampling_probability=0.05, noise_multiplier=2.0, steps=1)
    assert np.any(too_small < exact.lower)


def test_g1_poisson_sweep():
    """G1 has no projection, so only liang-unbounded applies to it."""
    rng = np.random.default_rng(21)
    orders = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])
    ratios = []
    for _ in range(60):
        n = int(rng.integers(10, 500))
        b = int(rng.integers(1, max(2, n // 3)))
        z = float(10 ** rng.uniform(-0.3, 0.7))
        steps = int(rng.integers(1, 60))
        q = b / n
        exact = g1_divergence(orders, _g1((n, b), z, steps), cells=3000)
        un = liang.unbounded_rdp(orders, sampling_probability=q, noise_multiplier=z, steps=steps)
        assert np.all(un >= exact.lower * (1 - 1e-9)), (n, b, z, steps)
        ratios.append(float(np.min(un / exact.lower)))
    print(f"\nG1 poisson add/remove, liang-unbounded / exact: min {min(ratios):.4f} median {np.median(ratios):.4f}")


@pytest.mark.parametrize(
    ("diameter", "z", "q", "lr", "steps"),
    [(0.01, 0.5, 0.1, 1.0, 3), (0.05, 1.0, 0.2, 1.0, 4), (0.1, 1.0, 0.05, 0.5, 5), (0.02, 0.7, 0.25, 1.0, 2),
     (0.5, 2.0, 0.1, 1.0, 3), (0.005, 0.5, 0.5, 1.0, 4)],
)  # fmt: skip
def test_g3_poisson_bounded(diameter, z, q, lr, steps):
    orders = np.array([2.0, 4.0, 8.0, 16.0])
    b = 5
    n = round(b / q)
    params = g3_params(diameter=diameter, dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps,
                       learning_rate=lr, clip_norm=1.0, sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    exact, _ = g3_divergence(orders, params)
    kw = dict(sampling_probability=b / n, noise_multiplier=z)
    bounded = liang.bounded_rdp(
        orders, **kw, diameter=diameter, batch_size=b, learning_rate=lr, clip_norm=1.0, expansion=1.0
    )  # fmt: skip  (M = 0: the step is an isometry)
    unbounded = liang.unbounded_rdp(orders, **kw, steps=steps)
    print(f"\nG3 D={diameter} z={z} q={q} T={steps}: bounded/exact {np.round(bounded / exact.lower, 3)}")
    assert np.all(bounded >= exact.lower)
    assert np.all(unbounded >= exact.lower)


@pytest.mark.filterwarnings("ignore:the optimal Renyi order")  # the small user grid
def test_lower_estimate_never_above_the_reported_epsilon():
    """liang-bounded's lower estimate (docs/derivations/lower-estimates.md#liang-bounded-estimate) lets best skip it: it
    must never exceed
    what the row reports, on the default grid or on any user grid, at any delta (it comes within 1% of
    it on most of these draws, so a wrong constant fails)."""
    import lastiter_plugins as lp

    rng = np.random.default_rng(21)
    for i in range(24):
        n = int(rng.integers(50, 100000))
        b = int(rng.integers(1, n + 1))
        params = dict(
            dataset_size=n,
            batch_size=b,
            sampling="poisson",
            relation="add_or_remove_one",
            noise_multiplier=float(np.exp(rng.uniform(np.log(0.3), np.log(50.0)))),
            steps=int(rng.integers(1, 10**6)),
            learning_rate=float(np.exp(rng.uniform(np.log(1e-4), np.log(1.0)))),
            smoothness=float(np.exp(rng.uniform(np.log(1e-3), np.log(10.0)))),
            diameter=float(np.exp(rng.uniform(np.log(1e-4), np.log(10.0)))),
        )
        delta = float(np.exp(rng.uniform(np.log(1e-12), np.log(0.3))))
        config, assumptions = lp.build(**params)
        lower = lp.BOUNDS["liang-bounded"].lower_estimate(config, assumptions, delta)
        for orders in (None, [1.5, 2.0, 10.0, 100.0])[: 1 + i % 2]:
            reported = lp.epsilon("liang-bounded", delta, orders=orders, **params).epsilon
            assert lower <= reported * (1 + 1e-12), (params, delta, orders, lower, reported)


def test_best_skips_liang_bounded_when_its_estimate_cannot_win():
    """The Poisson pipeline of benchmarks/bench_core_speed.py: liang-bounded reports ~1.6e10; best does not
    compute it, says so, and gives the same number as the minimum over every row computed."""
    import lastiter_plugins as lp
    from lastiter_plugins import evaluation

    params = dict(dataset_size=60000, batch_size=600, noise_multiplier=1.0, learning_rate=0.005, steps=10**4,
                  smoothness=1.0, strong_convexity=0.05, gradient_norms_within_clip=True, diameter=1.0,
                  sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    config, assumptions = lp.build(**params)
    skipped = evaluation.evaluate_for_best(config, assumptions, 1e-5)["liang-bounded"]
    assert skipped.result is None and "not computed" in skipped.notes[0]
    everything = evaluation.evaluate_all(config, assumptions, 1e-5)
    assert everything["liang-bounded"].result.epsilon > 1e9
    assert (
        lp.epsilon("best", 1e-5, **params).epsilon == evaluation.best_of(everything.values(), config.relation).epsilon
    )
