r"""Noise calibration: the smallest noise multiplier whose epsilon meets a target (safe)."""

from __future__ import annotations

import math
import numbers
from typing import Any

from lastiter_plugins.api import build, compute_epsilon, compute_rdp
from lastiter_plugins.conversion import validate_delta, validate_orders
from lastiter_plugins.errors import CalibrationError


def calibrate_noise(
    bound: str,
    target_epsilon: float,
    delta: float,
    *,
    orders=None,
    max_noise_multiplier: float = 1e4,
    rtol: float = 1e-4,
    **params: Any,
) -> float:
    r"""Smallest noise multiplier (to relative precision ``rtol``) such that
    ``bound`` gives epsilon <= ``target_epsilon`` at ``delta``.

    Every bound's epsilon is non-increasing in the noise multiplier, so a
    geometric bisection finds it. The returned value is always one that was
    evaluated and met the target (the upper end of the final bracket), and it is
    checked once more before returning.

    Raises:
      NotApplicableError: the bound does not apply (independent of the noise).
      CalibrationError: even ``max_noise_multiplier`` does not reach the target.
      ValueError: invalid inputs.
    """
    if isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real):
        raise ValueError(f"target_epsilon must be a finite number > 0. Found {target_epsilon!r}.")
    if not (math.isfinite(target_epsilon) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be a finite number > 0. Found {target_epsilon!r}.")
    delta = validate_delta(delta)
    orders = validate_orders(orders)
    params.pop("noise_multiplier", None)
    config, assumptions = build(noise_multiplier=1.0, **params)
    compute_rdp(bound, config, assumptions, orders[:1])  # raises NotApplicableError before any search

    def eps(z: float) -> float:
        return compute_epsilon(bound, config.replace(noise_multiplier=z), assumptions, delta, orders).epsilon

    hi = 1.0
    while (found := eps(hi)) > target_epsilon:
        if hi >= max_noise_multiplier:
            raise CalibrationError(
                f"no noise_multiplier <= max_noise_multiplier = {max_noise_multiplier:g} reaches "
                f"target_epsilon = {target_epsilon:g} at delta = {delta:g} for {bound}. "
                f"Found epsilon = {found:.6g} at noise_multiplier = {hi:g}."
            )
        hi = min(2.0 * hi, max_noise_multiplier)
    lo = hi / 2.0
    while eps(lo) <= target_epsilon:
        hi, lo = lo, lo / 2.0
        if lo < 1e-6:
            return hi
    while hi / lo > 1.0 + rtol:
        mid = math.sqrt(lo * hi)
        if eps(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    if eps(hi) > target_epsilon:  # safety re-check: never return a value that misses the target
        raise CalibrationError(f"calibration failed to certify noise_multiplier = {hi:g} for {bound}.")
    return hi
