r"""RDP -> (epsilon, delta), and the order grid shared by the whole library."""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp


def _default_orders() -> np.ndarray:
    fractional = 1.0 + np.geomspace(0.01, 0.95, 32)  # 1.01 .. 1.95
    small = np.arange(2.0, 101.0)  # every integer 2 .. 100
    large = np.unique(np.round(np.geomspace(100.0, 1e4, 121)))[1:]  # 101 .. 10^4
    grid = np.concatenate([fractional, small, large])
    grid.setflags(write=False)
    return grid


#: The library's one default grid of Renyi orders: 1.01 .. 10^4, dense near 1,
#: every integer up to 100 (the sampled-Gaussian bounds are exact at integers),
#: then geometric. Read-only; pass your own ``orders`` to change it.
DEFAULT_ORDERS: np.ndarray = _default_orders()


class OrderGridWarning(UserWarning):
    """The optimal order sits at an edge of the order grid: widen the grid."""


def validate_orders(orders: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """A validated copy of ``orders`` (or the default grid). Orders must be finite and > 1."""
    if orders is None:
        return DEFAULT_ORDERS.copy()
    if isinstance(orders, numbers.Real):
        orders = [orders]
    try:
        arr = np.array(orders, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"orders must be a sequence of numbers > 1. Found {orders!r}.") from None
    if arr.size == 0:
        raise ValueError("orders must contain at least one order > 1. Found an empty sequence.")
    bad = arr[~np.isfinite(arr) | (arr <= 1.0)]
    if bad.size:
        raise ValueError(f"orders must be finite and > 1. Found {bad[0]:g}.")
    return arr


def validate_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1). Found {delta!r}.")
    return float(delta)


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    r"""Smallest epsilon over the orders, by dp-accounting's improved conversion
    (Canonne, Kamath & Steinke 2020 / Balle et al. 2020; ``compute_epsilon``).

    Warns with :class:`OrderGridWarning` when the optimum is at an edge of the grid.

    Returns:
      (epsilon, optimal order); epsilon is ``inf`` when every order is ``inf``.
    """
    delta = validate_delta(delta)
    finite = np.isfinite(rdp)
    if not finite.any():
        return math.inf, float(orders[0])
    eps, order = _dp_rdp.compute_epsilon(orders[finite], rdp[finite], delta)
    eps, order = float(eps), float(order)
    if eps > 0 and orders.size > 1 and order in (float(orders.min()), float(orders.max())):
        warnings.warn(
            f"the optimal Renyi order {order:g} is at the edge of the order grid "
            f"[{orders.min():g}, {orders.max():g}]; epsilon may improve with a wider grid.",
            OrderGridWarning,
            stacklevel=3,
        )
    return eps, order
