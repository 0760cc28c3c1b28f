r"""Feature-norm clipping: make \|a\| <= A hold exactly, despite float rounding.

The certified loss assumptions of :mod:`lastiter_plugins.glm` need a bound A on
the l2 norm of every feature vector the model sees. A preprocessing transform
a -> a min(1, A'/\|a\|) guarantees it, with A' slightly below A so that the
rounding of the transform itself cannot push a norm above A. This module is
the framework-free reference (numpy); torch or Keras layers built around it
must use :func:`safe_clip_radius` for A' and compute in the same dtype.

Derivation (docs/derivations/glm.md#glm-feature-clipping; Higham, "Accuracy and Stability of
Numerical Algorithms", 2nd ed. 2002, Lemma 3.1 and Sec. 3.1 for gamma_n). Let u be
the unit roundoff of the dtype (2^-24 for float32), d the feature dimension and
gamma_n = n u / (1 - n u). Computed in that dtype in any summation order,
s = fl(sum a_i^2) is within gamma_{2d} \|a\|^2 of \|a\|^2 (gamma_d for the d
products and d - 1 sums; the other d covers underflow of tiny squares once
\|a\| >= 2^-53), n = fl(sqrt s) = sqrt(s)(1 + e) with \|e\| <= u, and
f = fl(A'/n) <= (A'/n)(1 + u). If the vector is shrunk (f < 1) the output
fl(a_i f) has norm <= \|a\| f (1 + u) <= A' K; if it is kept (f >= 1) then
\|a\| <= A'(1 + u) / ((1 - u) sqrt(1 - gamma_{2d})) <= A' K; with
K = (1 + u)^2 / ((1 - u) sqrt(1 - gamma_{2d})). So A' = A / K (rounded down to
the dtype) gives \|output\| <= A exactly. For float32 and d = 1000,
A' = A (1 - 6.0e-5).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

#: Smallest bound accepted: below it, underflow of the squares is not covered by the analysis.
MIN_FEATURE_NORM_BOUND = 2.0**-50

_SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64))


def _dtype(dtype: Any) -> np.dtype:
    dt = np.dtype(dtype)
    if dt not in _SUPPORTED:
        raise ValueError(f"dtype must be float32 or float64. Found {dt}.")
    return dt


def _bound(value: Any, dt: np.dtype) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"feature_norm_bound must be a finite number >= {MIN_FEATURE_NORM_BOUND:g}. Found {value!r}.")
    value = float(value)
    largest = math.sqrt(float(np.finfo(dt).max)) / 4.0
    if not MIN_FEATURE_NORM_BOUND <= value <= largest:
        raise ValueError(
            f"feature_norm_bound must be in [{MIN_FEATURE_NORM_BOUND:g}, {largest:g}] for {dt}. Found {value!r}."
        )
    return value


def _dimension(dim: Any, u: float) -> int:
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 1:
        raise ValueError(f"dim must be an integer >= 1. Found {dim!r}.")
    if 4 * int(dim) * u >= 1.0:
        raise ValueError(f"dim must be < 1/(4u) = {1.0 / (4.0 * u):.6g} for the rounding analysis. Found {dim}.")
    return int(dim)


def rounding_factor(dim: int, dtype: Any = np.float32) -> float:
    r"""K >= 1 with \|clip output\| <= A' K for every input (module docstring).

    Args:
      dim: d, the number of entries of a feature vector.
      dtype: the dtype the transform is computed in (float32 or float64).

    Returns:
      K = (1 + u)^2 / ((1 - u) sqrt(1 - gamma_{2d})), enlarged by 8 float64 ulps
      to cover its own evaluation.
    """
    dt = _dtype(dtype)
    u = float(np.finfo(dt).eps) / 2.0
    d = _dimension(dim, u)
    gamma = 2 * d * u / (1.0 - 2 * d * u)
    return (1.0 + u) ** 2 / ((1.0 - u) * math.sqrt(1.0 - gamma)) * (1.0 + 8 * 2.0**-53)


def safe_clip_radius(feature_norm_bound: float, dim: int, dtype: Any = np.float32) -> float:
    r"""A' = A / K, rounded down to ``dtype``: clipping to A' in ``dtype`` leaves every norm <= A.

    Args:
      feature_norm_bound: A, the bound that must hold exactly.
      dim: d, the number of entries of a feature vector.
      dtype: the dtype the transform is computed in (float32 or float64).

    Returns:
      A' as a Python float that is exactly representable in ``dtype``.

    Raises:
      ValueError: invalid A, d or dtype.
    """
    dt = _dtype(dtype)
    bound = _bound(feature_norm_bound, dt)
    radius = bound / rounding_factor(dim, dt)
    stored = dt.type(radius)
    if float(stored) > radius:
        stored = np.nextafter(stored, dt.type(0))
    return float(stored)


def clip_features(features: np.ndarray, feature_norm_bound: float) -> np.ndarray:
    r"""a -> a min(1, A'/\|a\|) along the last axis, computed in the features' dtype.

    Every output row has l2 norm <= ``feature_norm_bound`` exactly (as a real
    number, for the stored float values). Rows with norm <= A' are returned
    unchanged; a zero row stays zero.

    Args:
      features: float32 or float64 array of shape (..., d).
      feature_norm_bound: A.

    Returns:
      A new array of the same shape and dtype.

    Raises:
      ValueError: non-finite entries, an unsupported dtype, or an invalid A.
    """
    a = np.asarray(features)
    dt = _dtype(a.dtype)
    if a.ndim < 1 or a.shape[-1] < 1:
        raise ValueError(f"features must have shape (..., d) with d >= 1. Found shape {a.shape}.")
    if not np.isfinite(a).all():
        raise ValueError("features must be finite. Found NaN or infinity.")
    radius = dt.type(safe_clip_radius(feature_norm_bound, a.shape[-1], dt))
    with np.errstate(divide="ignore", over="ignore"):
        norms = np.sqrt(np.sum(np.square(a), axis=-1, dtype=dt), dtype=dt)
        factor = np.minimum(dt.type(1), np.divide(radius, norms, dtype=dt), dtype=dt)
    # norm overflow (|a| > sqrt(max float)) gives factor 0: a zero row, within the bound
    return np.multiply(a, factor[..., None], dtype=dt)


def feature_norms_within(features: np.ndarray, feature_norm_bound: float) -> np.ndarray:
    r"""Per row: True only if its exact l2 norm is <= A (never True for a violation).

    Float32 values are widened to float64 exactly and their squares are exact
    there; the float64 sum of d non-negative terms and the square root are within
    a relative (d + 2) 2^-53 of the exact norm, so a row is accepted iff
    n_64 (1 + (d + 4) 2^-53) <= A. A row within about d 1e-16 relative of A may
    be rejected.

    Args:
      features: float32 or float64 array of shape (..., d).
      feature_norm_bound: A.

    Returns:
      Boolean array of shape features.shape[:-1]; non-finite rows are False.
    """
    a = np.asarray(features)
    _dtype(a.dtype)
    if a.ndim < 1 or a.shape[-1] < 1:
        raise ValueError(f"features must have shape (..., d) with d >= 1. Found shape {a.shape}.")
    bound = _bound(feature_norm_bound, np.dtype(np.float64))
    d = a.shape[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        wide = a.astype(np.float64)
        norms = np.sqrt(np.sum(wide * wide, axis=-1))
        ok = norms * (1.0 + (d + 4) * 2.0**-53) <= bound
    return ok & np.isfinite(wide).all(axis=-1)


def check_feature_norms(features: np.ndarray, feature_norm_bound: float) -> None:
    r"""Raise unless every row of ``features`` has l2 norm <= A (see :func:`feature_norms_within`).

    Args:
      features: float32 or float64 array of shape (..., d).
      feature_norm_bound: A, the bound declared to the accountant.

    Raises:
      ValueError: naming the first violating row and its norm.
    """
    ok = feature_norms_within(features, feature_norm_bound)
    if not ok.all():
        index = tuple(int(i) for i in np.argwhere(~ok)[0])
        row = np.asarray(features)[index].astype(np.float64)
        raise ValueError(
            f"every feature vector must have l2 norm <= feature_norm_bound = {feature_norm_bound:g} (clip them with "
            f"clip_features). Found norm {float(np.linalg.norm(row)):.17g} at index {index}."
        )
