r"""The feature clip of the GLM route: :class:`FeatureNormClip` and the checks that its output rows have
l2 norm <= A (:func:`feature_norms_ok` in float64; :func:`largest_square` and :func:`square_bound`, a
rounding bound in the features' dtype, for the per-step check without a float64 pass)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from lastiter_plugins import feature_clip


class FeatureNormClip(nn.Module):
    r"""a -> a min(1, A'/\|a\|) along the last axis, so that every output row has l2 norm <= A exactly.

    A' = :func:`lastiter_plugins.feature_clip.safe_clip_radius` (A, d, dtype) is
    slightly below A so that float rounding of the clip itself cannot push a norm
    above A (docs/derivations/glm.md#glm-feature-clipping; Higham 2002, Lemma 3.1). Computed in
    the input's dtype (float32 or float64) with one rounding per operation. Put it
    right before the final ``nn.Linear`` of a model registered with ``model="glm"``:
    then \|a\| <= A holds for every possible example, the neighbouring one included.

    Args:
      feature_norm_bound: A > 0.
    """

    def __init__(self, feature_norm_bound: float) -> None:
        super().__init__()
        feature_clip.safe_clip_radius(feature_norm_bound, 1, np.float64)  # validates A
        self._bound = float(feature_norm_bound)
        self._radii: dict[tuple[int, torch.dtype], float] = {}

    @property
    def feature_norm_bound(self) -> float:
        """A: every output row has l2 norm <= A."""
        return self._bound

    def extra_repr(self) -> str:
        return f"feature_norm_bound={self._bound:g}"

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        dtype = features.dtype
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"FeatureNormClip needs float32 or float64 features. Found {dtype}.")
        dim = int(features.shape[-1])
        key = (dim, dtype)
        radius = self._radii.get(key)
        if radius is None:
            np_dtype = np.float32 if dtype is torch.float32 else np.float64
            radius = self._radii[key] = feature_clip.safe_clip_radius(self._bound, dim, np_dtype)
        norms = torch.sqrt(torch.sum(features * features, dim=-1, keepdim=True))
        # tensor / tensor: one correctly rounded division (a Python float / tensor is reciprocal-then-multiply)
        factor = torch.clamp(torch.div(torch.full_like(norms, radius), norms), max=1.0)
        return features * factor


def feature_norms_ok(features: torch.Tensor, bound: float) -> tuple[bool, float]:
    """(every row has exact l2 norm <= bound, the largest norm found), in float64 on the features' device.

    float32 -> float64 is exact and so are the squares; the float64 sum and root are within
    (d + 4) 2^-53 relative of the exact norm, so a row is accepted only if its exact norm is <= bound
    (as :func:`lastiter_plugins.feature_clip.feature_norms_within`)."""
    wide = features.detach().to(torch.float64)
    norms = torch.sqrt(torch.sum(wide * wide, dim=-1))
    largest = float(norms.max()) if norms.numel() else 0.0
    d = int(features.shape[-1])
    ok = math.isfinite(largest) and largest * (1.0 + (d + 4) * 2.0**-53) <= bound
    return ok, largest


def largest_square(features: list) -> torch.Tensor | None:
    """The largest row sum of squares of the tensors in ``features``, computed in their dtype (0-dim; NaN
    propagates), None when they hold no row. An upper bound on the exact value is :func:`square_bound`."""
    squares = [torch.linalg.vecdot(f, f) for f in features if f.numel()]
    if not squares:
        return None
    return (squares[0] if len(squares) == 1 else torch.cat([q.reshape(-1) for q in squares])).max()


def square_bound(computed: float, features: list) -> float:
    """An upper bound on the exact largest row sum of squares, from its value computed in the features' dtype.

    Any order of evaluation of a sum of d products in a dtype of unit roundoff u (each operation rounded
    once, fused or not) is within gamma_d = d u / (1 - d u) of the exact sum, relative (Higham 2002,
    Lemma 3.1 and section 3.1); d 2^-126 (resp. 2^-1022) more covers squares and partial sums flushed to
    zero; the few float64 operations here are covered by 16 float64 ulps."""
    d = max(int(f.shape[-1]) for f in features)
    u = max(torch.finfo(f.dtype).eps for f in features) / 2.0
    tiny = max(torch.finfo(f.dtype).tiny for f in features)
    if not math.isfinite(computed) or computed < 0 or d * u >= 0.5:
        return math.inf
    return (computed + d * tiny) / (1.0 - d * u / (1.0 - d * u)) * (1.0 + 16 * 2.0**-53)
