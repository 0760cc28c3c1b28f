"""Tier 1: the vectorised fractional-order series of sgm.py against dp-accounting's own per-order loop.

``sgm._dp_accounting_fractional`` re-evaluates dp-accounting's ``_compute_log_a_frac`` series
(Mironov, Talwar & Zhang 2019, arXiv 1908.10530, Sec. 3.3) for all orders at once, following the
series of whichever dp-accounting is installed (0.4.x: signed terms, no cap; >= 0.5: absolute terms,
capped). It must give dp-accounting's numbers, and inf exactly where dp-accounting gives no finite
non-negative number (it raises, returns NaN, inf or a negative value).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

from lastiter_plugins.bounds import sgm
from lastiter_plugins.validation import validate_orders

SAMPLING_RATES = [1e-4, 0.01, 0.1, 0.5, 0.9]
NOISES = [0.3, 0.7, 1.0, 2.0, 10.0, 100.0]
_DEFAULT = validate_orders(None)
ORDERS = np.unique(
    np.concatenate(
        [
            _DEFAULT[np.floor(_DEFAULT) != _DEFAULT],  # the default grid's fractional orders (1.01 .. 1.95)
            [1.1, 1.5, 2.5, 3.3, 5.75, 7.7, 15.5, 31.25, 63.9, 100.5, 127.3, 200.01, 255.5],
        ]
    )
)


def _dp_accounting_reference(q: float, noise: float, orders: np.ndarray) -> np.ndarray:
    """dp-accounting's per-order values, inf where it gives no finite non-negative number."""
    out = []
    for order in orders.tolist():
        try:
            with np.errstate(all="ignore"):
                value = float(dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, noise, [order])[0])
        except (ArithmeticError, ValueError):
            value = math.inf
        out.append(value if math.isfinite(value) and value >= 0.0 else math.inf)
    return np.array(out)


# dp-accounting's own loop takes 5-9 s at q = 0.5 with large noise (long series): those two cases are left out
_CASES = [(q, s) for q in SAMPLING_RATES for s in NOISES if not (q == 0.5 and s >= 10.0)]


@pytest.mark.parametrize(("q", "noise"), _CASES, ids=[f"q={q:g}-s={s:g}" for q, s in _CASES])
def test_fractional_series_matches_dp_accounting(q, noise, monkeypatch):
    expected = _dp_accounting_reference(q, noise, ORDERS)

    def no_hand_back(*args):
        raise AssertionError(f"order handed back to dp-accounting's own loop: {args}")

    # every order of the grid is evaluated by the vectorised series, not by dp-accounting's loop
    monkeypatch.setattr(sgm, "_dp_accounting_one", no_hand_back)
    got = sgm._dp_accounting_fractional(q, ORDERS.copy(), np.full(ORDERS.shape, noise))

    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(expected), err_msg=f"orders {ORDERS}")
    finite = np.isfinite(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-10, atol=0.0)


def test_fractional_series_has_finite_values_on_the_grid():
    """The comparison above is not vacuous: most of the grid has finite values (both versions)."""
    values = sgm._dp_accounting_fractional(0.01, ORDERS.copy(), np.ones(ORDERS.shape))
    assert np.isfinite(values).all()
    assert (values > 0.0).all()


@pytest.mark.parametrize(
    ("q", "orders", "noise"),
    [
        (0.0, [1.5, 2.5], 1.0),  # no sampling: 0
        (1.0, [1.5, 2.5], 1.0),  # always sampled: the Gaussian alpha / (2 s^2)
        (0.01, [2.0, 3.0], 1.0),  # integer orders: dp-accounting's binomial sum
        (0.01, [1.5, 2.5], 0.0),  # no noise: inf
        (0.01, [1.5, np.inf], 1.0),
    ],
    ids=["q=0", "q=1", "integer-orders", "zero-noise", "infinite-order"],
)
def test_arguments_outside_the_series_go_to_dp_accounting(q, orders, noise):
    orders = np.array(orders)
    expected = _dp_accounting_reference(q, noise, orders)
    got = sgm._dp_accounting_fractional(q, orders, np.full(orders.shape, noise))
    np.testing.assert_array_equal(got, expected)
