r"""Validation of the numbers users pass at the public edge, in one place.

The public functions (``lastiter_plugins.rdp`` / ``epsilon`` / ``applicable_bounds`` /
``calibrate_noise`` / ``advise``, ``evaluation.evaluate_all``, the CLI, the adapters' entry points) check
their inputs here once; the layers below them (evaluation, conversion, the bounds) trust what they are
given. A pipeline is validated by constructing its :class:`~lastiter_plugins.config.TrainingConfig` and
:class:`~lastiter_plugins.config.LossAssumptions`.

Every error is a ``ValueError`` naming the parameter, the constraint and the value found.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lastiter_plugins.config import shown


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


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate_orders(orders: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """A validated copy of ``orders`` (or the default grid). Orders must be finite and > 1."""
    if orders is None:
        return DEFAULT_ORDERS.copy()
    given: object = [orders] if isinstance(orders, numbers.Real) else orders  # one order
    try:
        arr = np.array(given, dtype=float).reshape(-1)
    except OverflowError:  # an integer beyond the largest double
        raise ValueError(f"orders must be finite and > 1. Found {_beyond_float(given)}.") from None
    except (TypeError, ValueError):
        raise ValueError(f"orders must be a sequence of numbers > 1. Found {orders!r}.") from None
    if arr.size == 0:
        raise ValueError("orders must contain at least one order > 1. Found an empty sequence.")
    bad = arr[~np.isfinite(arr) | (arr <= 1.0)]
    if bad.size:
        raise ValueError(f"orders must be finite and > 1. Found {bad[0]:g}.")
    return arr


def _beyond_float(values: Any) -> str:
    """The first value of ``values`` that no double holds (an integer beyond 1.8e308), for a message."""
    for value in values if isinstance(values, Sequence | np.ndarray) else [values]:
        try:
            float(value)
        except (OverflowError, TypeError, ValueError):
            return shown(value)
    return shown(values)


def number_problem(name: str, value: Any, constraint: str, holds: Callable[[float], bool]) -> str | None:
    """None when ``value`` is a number (not a bool, not NaN) that a double holds and ``holds`` of; else the
    one-line message naming ``name``, ``constraint`` (in words) and the value (a huge integer abbreviated; one
    that the constraint would take but no double holds, such as 10**400 for ">= 0", says so)."""
    if _is_number(value):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the largest double
            if holds(math.inf if value > 0 else -math.inf):
                return (
                    f"{name} must be {constraint} that a double holds (at most 1.8e308, or inf). Found {shown(value)}."
                )
        else:
            if not math.isnan(number) and holds(number):
                return None
    return f"{name} must be {constraint}. Found {shown(value)}."


def _checked(name: str, value: Any, constraint: str, holds: Callable[[float], bool]) -> float:
    problem = number_problem(name, value, constraint, holds)
    if problem is not None:
        raise ValueError(problem)
    return float(value)


def validate_delta(delta: Any) -> float:
    """``delta`` as a float, checked to lie in (0, 1)."""
    return _checked("delta", delta, "in (0, 1)", lambda x: 0.0 < x < 1.0)


def validate_epsilon(epsilon: Any, name: str = "epsilon") -> float:
    """``epsilon`` as a float, checked to be a number >= 0 (``inf`` allowed: delta 0) that a double holds (an
    integer beyond 1.8e308 is refused: pass ``math.inf``)."""
    return _checked(name, epsilon, "a number >= 0", lambda x: x >= 0.0)


def positive_number(name: str, value: Any) -> float:
    """``value`` as a float, checked to be a finite number > 0."""
    return _checked(name, value, "a finite number > 0", lambda x: 0.0 < x < math.inf)
