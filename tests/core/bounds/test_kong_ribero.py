"""Kong & Ribero (arXiv 2407.05237; lastiter_plugins/bounds/kong_ribero.py): the Lipschitz constant of
the clipped update and the step-size limit, the closed forms of the three bounds (cyclic, bounded
domain, curvature-free), and bounded-domain-random at full batches, which is Theorem 2.2 minimised
over the window (its R = 1 member is Theorem 2.2 with L = 1).

The rows' preconditions (step-size limit, relation, sampling) are checked by the API's refusals in
tests/core/test_api.py; their values in the worked examples of docs/bounds.md in
tests/core/bounds/test_known_values.py; their soundness on exact instances in tests/core/verification/.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins.bounds import kong_ribero
from lastiter_plugins.bounds.bounded_domain import random_batch_rdp

ORDERS = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0])

# ------------------------------------------------------------------ the update's constants


def test_update_lipschitz_of_a_gradient_step_and_of_a_possibly_clipped_one():
    # m = 0: L_eta = 1; clipping possibly active: sqrt(2) L_eta (Prop. 2.1(b)), never active: L_eta (Prop. 2.1(c))
    assert kong_ribero.update_lipschitz(0.1, 1.0, 0.0, clipping_may_be_active=False) == 1.0
    assert kong_ribero.update_lipschitz(0.1, 1.0, 0.0, clipping_may_be_active=True) == pytest.approx(math.sqrt(2.0))
    # eq. 13 with eta = 0.1, M = 1, m = 0.5: 1 + 2 eta m (1 + m / (2 (M + m))) = 1 + 0.1 * 7/6
    l_eta = math.sqrt(1.0 + 0.1 * 7.0 / 6.0)
    got = kong_ribero.update_lipschitz(0.1, 1.0, 0.5, clipping_may_be_active=False)
    assert got == pytest.approx(l_eta, rel=1e-14)
    clipped = kong_ribero.update_lipschitz(0.1, 1.0, 0.5, clipping_may_be_active=True)
    assert clipped == pytest.approx(math.sqrt(2.0) * l_eta, rel=1e-14)


@pytest.mark.parametrize(
    ("smoothness", "weak_convexity", "clipping_may_be_active", "expected"),
    [(1.0, 0.0, True, 0.5), (1.0, 0.0, False, 1.0), (0.75, 0.25, True, 0.5), (0.75, 0.25, False, 1.0),
     (0.2, 0.0, True, 2.5), (0.0, 0.0, True, math.inf), (0.0, 0.0, False, math.inf)],
)  # fmt: skip
def test_max_learning_rate_is_one_over_twice_the_curvature_with_clipping(
    smoothness, weak_convexity, clipping_may_be_active, expected
):
    """1/(2(M+m)) when clipping may be active, 1/(M+m) when it never is (Thm. 2.2/2.3, Prop. 2.1(c))."""
    assert kong_ribero.max_learning_rate(smoothness, weak_convexity, clipping_may_be_active) == expected


# ------------------------------------------------------------------ the closed forms


def test_cyclic_is_four_alpha_over_z_squared_plus_a_term_per_full_pass():
    """Theorem 2.3: 4 alpha / z^2 (1 + E theta_L(l)): E = 0 is 4 alpha / z^2, each full pass adds the same term."""
    kw = {"noise_multiplier": 2.0, "steps_per_epoch": 10, "lipschitz": math.sqrt(2.0)}
    by_epochs = [kong_ribero.cyclic_rdp(ORDERS, epochs=e, **kw) for e in range(4)]
    np.testing.assert_allclose(by_epochs[0], 4.0 * ORDERS / 4.0, rtol=1e-15)
    per_pass = by_epochs[1] - by_epochs[0]
    assert np.all(per_pass > 0)
    for e in (2, 3):
        np.testing.assert_allclose(by_epochs[e], by_epochs[0] + e * per_pass, rtol=1e-12)


def test_one_step_kong_ribero_cyclic_is_gaussian_up_to_its_factor_two():
    """T < l: E = 0 and the bound is 4 alpha / z^2 (twice the Gaussian mechanism, as published)."""
    orders = [2.0, 8.0, 32.0]
    got = lp.rdp(
        "kong-ribero-cyclic", orders, dataset_size=100, batch_size=10, noise_multiplier=2.0,
        learning_rate=0.1, steps=1, smoothness=1.0, sampling="cyclic",
    )  # fmt: skip
    np.testing.assert_allclose(got, 4 * np.array(orders) / 4.0)


def test_bounded_is_theorem_2_2_closed_form():
    """alpha/2 (L D b / (eta z C) + 2/z)^2, whatever the number of steps."""
    lipschitz, diameter, b, eta, z, c = math.sqrt(2.0), 0.3, 4, 0.1, 0.5, 2.0
    got = kong_ribero.bounded_rdp(ORDERS, noise_multiplier=z, lipschitz=lipschitz, diameter=diameter, batch_size=b,
                                  learning_rate=eta, clip_norm=c)  # fmt: skip
    shift = lipschitz * diameter * b / (eta * z * c) + 2.0 / z
    np.testing.assert_allclose(got, ORDERS / 2.0 * shift**2, rtol=1e-14)


def test_curvature_free_closed_form():
    got = lp.rdp("kong-ribero-curvature-free", [3.0], dataset_size=100, batch_size=4, noise_multiplier=2.0, steps=7,
                 sampling="reshuffle")  # fmt: skip
    assert got[0] == pytest.approx(8 * 3.0 * 7 * 16 / 4.0)


# ------------------------------------------------------------------ bounded-domain-random at full batches


@pytest.mark.parametrize(
    ("d", "z"), [(0.3, 0.5), (20.0, 0.5), (3.0, 2.0)], ids=["window-one", "window-five", "window-three"]
)
def test_bounded_domain_random_at_full_batches_is_theorem_2_2_minimised_over_the_window(d, z):
    """q = 1, a long run: bounded-domain-random is min_R (alpha/2)(d + 2R/z)^2 / R (d = D b / (eta z C)); its
    R = 1 member is Kong & Ribero's Theorem 2.2 with L = 1, so it is never above it, equal where R = 1 is
    the minimiser (d z / 2 <= 1) and below it where a longer window wins."""
    eta, c, b = 0.1, 1.0, 4
    diameter = d * eta * z * c / b
    got = random_batch_rdp(ORDERS, sampling_probability=1.0, noise_multiplier=z, steps=10**6, diameter=diameter,
                           batch_size=b, learning_rate=eta, clip_norm=c)  # fmt: skip
    expected = [min(a / 2 * (d + 2 * r / z) ** 2 / r for r in range(1, 50)) for a in ORDERS]
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    theorem = kong_ribero.bounded_rdp(ORDERS, noise_multiplier=z, lipschitz=1.0, diameter=diameter, batch_size=b,
                                      learning_rate=eta, clip_norm=c)  # fmt: skip
    if d * z / 2 <= 1.0:
        np.testing.assert_allclose(got, theorem, rtol=1e-9)
    else:
        assert np.all(got < theorem * (1 - 1e-6))
