r"""Certified loss assumptions for linear models (GLMs and softmax regression).

Instead of asking users for the smoothness M, the strong convexity lam and the
assertion that clipping is never active, derive them from what the user can
check: the loss family, a bound A on the feature norm (guaranteed by a
feature-clipping transform, :mod:`lastiter_plugins.feature_clip`), the l2
coefficient w and where the optimizer applies it, an optional projection, and
the clip norm C. Derivations (each pinned by a test in tests/core/test_glm.py):

* Data term. Binary GLM f(x) = phi(<a~, x>) with a~ = a, or a~ = [a, 1] with a
  bias (then \|a~\| <= A~ = sqrt(A^2 + 1)): gradient phi'(u) a~, Hessian
  phi''(u) a~ a~^T, so the gradient-norm bound is G = sup\|phi'\| A~ and M =
  sup phi'' A~^2. Softmax cross-entropy f(W) = -log softmax(W a~)_y: gradient
  (p - q) a~^T with \|p - q\| <= sqrt(2) for p, q in the simplex, so G = sqrt(2) A~;
  Hessian (diag p - p p^T) (x) a~ a~^T, and v^T (diag p - p p^T) v is the variance
  of v under p, <= (max v - min v)^2 / 4 <= 1/2 for a unit v (Popoviciu's
  inequality), so M = A~^2 / 2, attained at p = (1/2, 1/2, 0, ...).
* Clipping a scalar GLM (Song, Steinke, Thakkar & Thakurta, AISTATS 2021:
  clipped gradient descent on a GLM minimises a convex objective):
  clip_C(phi'(u) a~) = psi'(u) a~ with psi' = clamp(phi', -C/\|a~\|, C/\|a~\|),
  non-decreasing (psi convex) and no steeper than phi' (psi is M-smooth with the
  same M). Opacus' factor min(1, C / (\|g\| + 1e-6)) keeps both properties. So
  the update actually run is plain SGD on convex M-smooth losses, with clipping
  active or not. False for softmax (vector outputs): there clipping must be
  provably inactive.
* The l2 term. torch ``SGD(weight_decay=w)`` under Opacus adds w x after the
  noisy clipped mean is formed (``DPOptimizer.step`` runs ``pre_step`` then the
  wrapped optimizer's step): the l2 term is outside the clip, adds w to M and to
  lam, and leaves the replace-one sensitivity at 2C. The step of
  psi(<a~, x>) + (w/2)\|x\|^2 is c-Lipschitz with c = max(\|1 - eta w\|,
  \|1 - eta (M + w)\|), the contraction Ye & Shokri (2022, arXiv 2203.05363,
  Lemma D.3) assume. TF Privacy's Keras optimizers differentiate the
  per-microbatch loss, so an l2 term in the loss is inside the clip: the clipped
  vector phi'(u) a~ + w x is not of the scalar form and is certified only when
  clipping is never active, which needs a bounded domain (\|x\| <= B gives the
  bound G + w B).
* Never active on the whole domain (Kong & Ribero 2024, arXiv 2407.05237,
  Prop. 2.1(c) needs it at every point, not only along the run): C >= G (1 +
  1e-3) + 1e-6. The 1e-6 is Opacus' term in its clip factor; the relative 1e-3
  covers float32 evaluation of the gradient norm (docs/derivations/glm.md#glm-never-active).

Dimensions of the loss families (sup \|phi'\|, sup phi''): binary logistic (1,
1/4), labels in [0, 1] or +-1, logits in, i.e. torch ``BCEWithLogitsLoss`` or
Keras ``BinaryCrossentropy(from_logits=True)``; squared (u - y)^2 (torch
``MSELoss``, Keras ``MeanSquaredError``, one output; (2(A~ B + Y), 2) on a ball
\|x\| <= B with \|y\| <= Y); Huber(delta) (delta, 1), torch ``HuberLoss`` and
Keras ``Huber``; smoothed hinge(gamma) (1, 1/gamma), labels +-1
(Shalev-Shwartz & Zhang 2013, arXiv 1209.1873, smoothed hinge).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from typing import Any

#: Opacus' clip factor is min(1, C / (norm + 1e-6)): the clip is the identity
#: only for norms <= C - 1e-6.
OPACUS_CLIP_EPSILON = 1e-6
#: Relative margin for float32 evaluation of a per-example gradient norm
#: (docs/derivations/glm.md#glm-never-active).
FLOAT_MARGIN_RELATIVE = 1e-3


class LossFamily(str, enum.Enum):
    """The per-example data loss of a linear model."""

    BINARY_LOGISTIC = "binary_logistic"
    SOFTMAX_CROSS_ENTROPY = "softmax_cross_entropy"
    SQUARED = "squared"
    HUBER = "huber"
    SMOOTHED_HINGE = "smoothed_hinge"

    @classmethod
    def parse(cls, value: Any) -> LossFamily:
        """Accept a member or its value (case-insensitive, '-' for '_')."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == key:
                    return member
        raise ValueError(f"loss must be one of {', '.join(m.value for m in cls)}. Found {value!r}.")

    @property
    def scalar(self) -> bool:
        """Whether the loss is phi(<a~, x>) of one scalar score (clipping keeps it convex and smooth)."""
        return self is not LossFamily.SOFTMAX_CROSS_ENTROPY


class L2Placement(str, enum.Enum):
    """Where the l2 term (w/2)|x|^2 enters the update."""

    #: Added to the noisy clipped mean by the optimizer: torch SGD(weight_decay=w) under Opacus.
    OUTSIDE_CLIP = "outside_clip"
    #: Part of the per-example loss, so clipped with it: an l2 term in the loss under TF Privacy.
    INSIDE_CLIP = "inside_clip"

    @classmethod
    def parse(cls, value: Any) -> L2Placement:
        """Accept a member or its value."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            for member in cls:
                if member.value == key:
                    return member
        raise ValueError(f"l2_placement must be one of {', '.join(m.value for m in cls)}. Found {value!r}.")


def _real(name: str, value: Any, *, positive: bool) -> float:
    constraint = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number {constraint}. Found {value!r}.")
    out = float(value)
    if not math.isfinite(out) or out < 0 or (positive and out == 0):
        raise ValueError(f"{name} must be a finite number {constraint}. Found {value!r}.")
    return out


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False. Found {value!r}.")
    return value


@dataclasses.dataclass(frozen=True)
class LinearModelCertificate:
    r"""Loss assumptions derived for a linear model; build it with :func:`certify_linear_model`.

    Attributes:
      loss: the loss family.
      effective_feature_norm: A~ = A, or sqrt(A^2 + 1) with a bias.
      data_smoothness: sup phi'' A~^2 (softmax: A~^2 / 2), the data term's M.
      smoothness: M of the per-example loss actually run: data_smoothness + w.
      strong_convexity: lam = w when the l2 term covers every trained parameter, else 0.
      weak_convexity: always 0 (every family is convex).
      diameter: 2R of the projection ball (None: no projection).
      max_gradient_norm: bound on the norm of the clipped vector (the data-term
        gradient, plus w x when the l2 term is inside the clip) over the whole
        domain; None when unbounded there.
      clip_norm_never_active: smallest clip norm at which clipping is certified
        never active on the whole domain (max_gradient_norm (1 + 1e-3) + 1e-6;
        None when the gradient is unbounded).
      clipping_can_be_active: clip_norm < clip_norm_never_active (or unbounded).
      scalar_glm: the loss is phi(<a~, x>) of one score, so clipping it keeps it
        convex and M-smooth.
      clipped_loss_convex_smooth: the per-example update actually run (clipped,
        plus an l2 term outside the clip) is the gradient step of a convex loss
        with these smoothness and strong-convexity constants, whether or not
        clipping is active.
      l2_outside_clip: the strong convexity is the l2 term added outside the clip
        (it covers every parameter), so it does not grow with a batch's size.
      not_certified: why no valid assumptions can be returned (None when they can).
    """

    loss: LossFamily
    effective_feature_norm: float
    data_smoothness: float
    smoothness: float
    strong_convexity: float
    weak_convexity: float
    diameter: float | None
    max_gradient_norm: float | None
    clip_norm_never_active: float | None
    clipping_can_be_active: bool
    scalar_glm: bool
    clipped_loss_convex_smooth: bool
    not_certified: str | None
    l2_outside_clip: bool = False

    @property
    def certified(self) -> bool:
        """Whether :meth:`loss_assumption_kwargs` returns assumptions (instead of raising)."""
        return self.not_certified is None

    def contraction(self, learning_rate: float) -> float:
        r"""Lipschitz constant c = max(|1 - eta lam|, |1 - eta M|) of one step of the loss run.

        Holds for any batch of at most b examples divided by b (docs/derivations/glm.md#glm-l2-contraction); meaningful
        only when :attr:`certified`.
        """
        eta = _real("learning_rate", learning_rate, positive=True)
        return max(abs(1.0 - eta * self.strong_convexity), abs(1.0 - eta * self.smoothness))

    def loss_assumption_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``LossAssumptions`` that hold for the update actually run.

        Returns:
          dict with smoothness, strong_convexity, weak_convexity, diameter,
          gradient_norms_within_clip (True only when clipping is certified never
          active on the whole domain) and clipped_loss_convex_smooth (the
          scalar-GLM route).

        Raises:
          ValueError: the configuration cannot be certified; the message names
            what to change or to declare by hand.
        """
        if self.not_certified is not None:
            raise ValueError(self.not_certified)
        return {
            "smoothness": self.smoothness,
            "strong_convexity": self.strong_convexity,
            "weak_convexity": self.weak_convexity,
            "diameter": self.diameter,
            "gradient_norms_within_clip": not self.clipping_can_be_active,
            "clipped_loss_convex_smooth": self.clipped_loss_convex_smooth,
            "l2_outside_clip": self.l2_outside_clip,
        }


def _scalar_bounds(loss: LossFamily, a_eff: float, params: dict[str, float | None]) -> tuple[float | None, float]:
    """(sup |phi'| over the domain or None, sup phi'') for a scalar family."""
    if loss is LossFamily.BINARY_LOGISTIC:
        return 1.0, 0.25
    if loss is LossFamily.HUBER:
        return params["huber_delta"], 1.0
    if loss is LossFamily.SMOOTHED_HINGE:
        smoothing = params["hinge_smoothing"]
        assert smoothing is not None  # _check_family_arguments refused the smoothed hinge without it
        return 1.0, 1.0 / smoothing
    # squared (u - y)^2: |phi'| = 2|u - y| <= 2 (A~ B + Y) on |x| <= B, |y| <= Y
    bound, labels = params["parameter_norm_bound"], params["label_bound"]
    if bound is None or labels is None:
        return None, 2.0
    return 2.0 * (a_eff * bound + labels), 2.0


def certify_linear_model(
    loss: LossFamily | str,
    *,
    feature_norm_bound: float,
    clip_norm: float,
    bias: bool,
    num_classes: int | None = None,
    l2: float = 0.0,
    l2_placement: L2Placement | str = L2Placement.OUTSIDE_CLIP,
    l2_covers_all_parameters: bool = True,
    projection_radius: float | None = None,
    projection_center_norm: float = 0.0,
    label_bound: float | None = None,
    huber_delta: float | None = None,
    hinge_smoothing: float | None = None,
) -> LinearModelCertificate:
    r"""Derive the loss assumptions of a linear model trained with DP-SGD.

    The model is one linear layer (weights, plus a bias when ``bias``) on
    features with \|a\| <= A, and nothing else is trained. Derivations: module
    docstring and docs/derivations/glm.md#glm-route.

    Args:
      loss: the per-example data loss (:class:`LossFamily`).
      feature_norm_bound: A, every feature vector fed to the model has l2 norm <= A
        (the bias input excluded); see :mod:`lastiter_plugins.feature_clip`.
      clip_norm: C, the per-example clipping norm.
      bias: whether the layer has a bias (the model sees [a, 1]).
      num_classes: k >= 2 for softmax cross-entropy (required there, refused elsewhere).
      l2: w >= 0, the l2 coefficient: the term (w/2)|x|^2, i.e. gradient w x
        (torch ``weight_decay=w``).
      l2_placement: outside the clip (torch SGD weight_decay under Opacus) or
        inside (an l2 term in the per-example loss, as under TF Privacy).
      l2_covers_all_parameters: False when some trained parameter (e.g. the
        bias, in a parameter group without weight decay) has no l2 term: then
        lam = 0.
      projection_radius: R, the update projects all parameters jointly onto an l2
        ball of radius R after every step (diameter 2R); None: no projection.
      projection_center_norm: \|c\| of that ball's centre (0: centred at the origin).
      label_bound: Y, every regression label has \|y\| <= Y (squared loss only).
      huber_delta: delta > 0 of the Huber loss (Huber only).
      hinge_smoothing: gamma > 0 of the smoothed hinge (smoothed hinge only).

    Returns:
      A frozen :class:`LinearModelCertificate`.

    Raises:
      ValueError: an argument is invalid or missing for the family (a
        configuration that is valid but not certifiable does not raise here; its
        ``loss_assumption_kwargs`` does).
    """
    family = LossFamily.parse(loss)
    a = _real("feature_norm_bound", feature_norm_bound, positive=True)
    c = _real("clip_norm", clip_norm, positive=True)
    bias = _flag("bias", bias)
    w = _real("l2", l2, positive=False)
    placement = L2Placement.parse(l2_placement)
    covers_all = _flag("l2_covers_all_parameters", l2_covers_all_parameters)
    radius = None if projection_radius is None else _real("projection_radius", projection_radius, positive=True)
    center = _real("projection_center_norm", projection_center_norm, positive=False)
    if radius is None and center != 0.0:
        raise ValueError(f"projection_center_norm needs projection_radius. Found projection_center_norm={center}.")
    params: dict[str, float | None] = {
        "parameter_norm_bound": None if radius is None else center + radius,
        "label_bound": None if label_bound is None else _real("label_bound", label_bound, positive=False),
        "huber_delta": None if huber_delta is None else _real("huber_delta", huber_delta, positive=True),
        "hinge_smoothing": (
            None if hinge_smoothing is None else _real("hinge_smoothing", hinge_smoothing, positive=True)
        ),
    }
    _check_family_arguments(family, num_classes, params)

    a_eff = math.hypot(a, 1.0) if bias else a
    if family is LossFamily.SOFTMAX_CROSS_ENTROPY:
        data_gradient: float | None = math.sqrt(2.0) * a_eff
        data_smoothness = a_eff**2 / 2.0
    else:
        slope, curvature = _scalar_bounds(family, a_eff, params)
        data_gradient = None if slope is None else slope * a_eff
        data_smoothness = curvature * a_eff**2

    bound = params["parameter_norm_bound"]
    max_gradient: float | None = data_gradient
    if w > 0 and placement is L2Placement.INSIDE_CLIP and max_gradient is not None:
        max_gradient = None if bound is None else max_gradient + w * bound
    never_active = None
    if max_gradient is not None:
        never_active = max_gradient * (1.0 + FLOAT_MARGIN_RELATIVE) + OPACUS_CLIP_EPSILON
    can_be_active = never_active is None or c < never_active

    l2_in_clip = w > 0 and placement is L2Placement.INSIDE_CLIP
    convex_smooth_when_clipped = family.scalar and not l2_in_clip
    not_certified = None
    if can_be_active and not convex_smooth_when_clipped:
        not_certified = _why_not(family, c, never_active, l2_in_clip, radius)

    return LinearModelCertificate(
        loss=family,
        effective_feature_norm=a_eff,
        data_smoothness=data_smoothness,
        smoothness=data_smoothness + w,
        strong_convexity=w if covers_all else 0.0,
        weak_convexity=0.0,
        diameter=None if radius is None else 2.0 * radius,
        max_gradient_norm=max_gradient,
        clip_norm_never_active=never_active,
        clipping_can_be_active=can_be_active,
        scalar_glm=family.scalar,
        clipped_loss_convex_smooth=convex_smooth_when_clipped or not can_be_active,
        not_certified=not_certified,
        l2_outside_clip=w > 0 and covers_all and placement is L2Placement.OUTSIDE_CLIP,
    )


def _check_family_arguments(family: LossFamily, num_classes: Any, params: dict[str, float | None]) -> None:
    if family is LossFamily.SOFTMAX_CROSS_ENTROPY:
        if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2 for softmax_cross_entropy. Found {num_classes!r}.")
    elif num_classes is not None:
        raise ValueError(f"num_classes is only for softmax_cross_entropy. Found num_classes={num_classes!r}.")
    needed = {
        LossFamily.HUBER: "huber_delta",
        LossFamily.SMOOTHED_HINGE: "hinge_smoothing",
    }.get(family)
    if needed is not None and params[needed] is None:
        raise ValueError(f"{needed} must be given for the {family.value} loss. Found None.")
    for name in ("huber_delta", "hinge_smoothing", "label_bound"):
        owner = {
            "huber_delta": LossFamily.HUBER,
            "hinge_smoothing": LossFamily.SMOOTHED_HINGE,
            "label_bound": LossFamily.SQUARED,
        }[name]
        if params[name] is not None and family is not owner:
            raise ValueError(
                f"{name} is only for the {owner.value} loss. Found {name}={params[name]} with {family.value}."
            )


def _why_not(
    family: LossFamily, clip_norm: float, never_active: float | None, l2_in_clip: bool, radius: float | None
) -> str:
    if l2_in_clip and radius is None:
        return (
            "cannot certify the loss assumptions: the l2 term is inside the clip (part of the per-example loss), so "
            "the clipped vector phi'(u) a + w x is not a scalar GLM gradient and clipping must be provably inactive, "
            "which needs a bounded domain: project the parameters onto a ball (projection_radius), or apply the l2 "
            "term outside the clip (torch SGD weight_decay under Opacus), or declare smoothness, strong_convexity "
            "and gradient_norms_within_clip by hand. Found no projection."
        )
    if never_active is None:
        return (
            f"cannot certify the loss assumptions for {family.value}: the per-example gradient is unbounded on the "
            "domain, so clipping can be active; give projection_radius and label_bound, or declare the assumptions "
            "by hand."
        )
    what = (
        "softmax cross-entropy has vector outputs, so a clipped gradient is not the gradient of a convex smooth loss"
        if family is LossFamily.SOFTMAX_CROSS_ENTROPY
        else "the l2 term is inside the clip, so the clipped vector is not a scalar GLM gradient"
    )
    return (
        f"cannot certify the loss assumptions: {what}, and clipping can be active. clip_norm must be >= "
        f"{never_active:.6g} (the per-example gradient-norm bound on the whole domain, with a float margin) for "
        f"clipping to be never active; otherwise the loss assumptions must be declared by hand (only bounds whose "
        f"theorem allows active clipping of non-convex clipped updates can then apply). "
        f"Found clip_norm={clip_norm:g}."
    )
