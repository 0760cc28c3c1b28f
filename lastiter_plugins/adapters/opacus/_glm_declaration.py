"""The declaration of the GLM route: the losses ``register(model="glm", loss=..., feature_norm=A)`` accepts
(:data:`LOSSES`, the torch loss module of each: :data:`LOSS_MODULES`), their validation (:func:`declare`)
and what it records (:class:`GlmDeclaration`)."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np
from torch import nn

from lastiter_plugins import feature_clip
from lastiter_plugins.glm import LossFamily

#: Loss names accepted by ``register(model="glm", loss=...)`` and the torch loss each stands for.
LOSSES: dict[str, tuple[LossFamily, str]] = {
    "logistic": (LossFamily.BINARY_LOGISTIC, "torch.nn.BCEWithLogitsLoss, labels in [0, 1], one output"),
    "softmax": (LossFamily.SOFTMAX_CROSS_ENTROPY, "torch.nn.CrossEntropyLoss on the logits, k >= 2 outputs"),
    "huber": (LossFamily.HUBER, "torch.nn.HuberLoss(delta=huber_delta), one output"),
}
#: The torch loss module of each declared loss, and its parameters that change the loss' curvature
#: or scale, with the value the derived constants assume (None: huber_delta).
LOSS_MODULES: dict[str, tuple[type, dict[str, Any]]] = {
    "logistic": (nn.BCEWithLogitsLoss, {"weight": None, "pos_weight": None}),
    "softmax": (nn.CrossEntropyLoss, {"weight": None, "label_smoothing": 0.0}),
    "huber": (nn.HuberLoss, {"delta": None}),
}
_ALIASES = {
    "binary_logistic": "logistic",
    "softmax_cross_entropy": "softmax",
    "cross_entropy": "softmax",
}
#: What the user would declare by hand instead (appended to every refusal of the GLM route).
BY_HAND = (
    "Otherwise register without model='glm' and declare smoothness, strong_convexity, weak_convexity and "
    "gradient_norms_within_clip by hand, valid for every per-example loss on the whole parameter domain."
)


@dataclasses.dataclass(frozen=True)
class GlmDeclaration:
    """What ``register(model="glm", ...)`` declares: the loss and the feature-norm bound A."""

    loss: str  # a key of LOSSES
    feature_norm: float
    huber_delta: float | None = None

    @property
    def family(self) -> LossFamily:
        return LOSSES[self.loss][0]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def declare(
    *,
    loss: Any,
    feature_norm: Any,
    huber_delta: Any,
    smoothness: Any,
    weak_convexity: Any,
    strong_convexity: Any,
    gradient_norms_within_clip: Any,
) -> GlmDeclaration:
    """Validate the arguments of ``register(model="glm", ...)``."""
    declared = {
        "smoothness": smoothness is not None,
        "weak_convexity": weak_convexity != 0.0,
        "strong_convexity": strong_convexity != 0.0,
        "gradient_norms_within_clip": gradient_norms_within_clip is not False,
    }
    clash = [name for name, given in declared.items() if given]
    if clash:
        raise ValueError(
            f"{', '.join(clash)} must not be given with model='glm': the accountant derives the loss assumptions "
            "from the model, the loss and feature_norm. Remove them, or register without model='glm' to declare "
            f"them by hand. Found {', '.join(clash)}."
        )
    key = loss.strip().lower().replace("-", "_") if isinstance(loss, str) else loss
    key = _ALIASES.get(key, key)
    if key not in LOSSES:
        raise ValueError(
            f"loss must be one of {', '.join(LOSSES)} with model='glm' ("
            + "; ".join(f"{k}: {v[1]}" for k, v in LOSSES.items())
            + "). Squared and hinge losses need a bound on the parameters and labels: compute their constants with "
            f"lastiter_plugins.glm.certify_linear_model and declare them by hand. Found loss={loss!r}."
        )
    try:
        feature_clip.safe_clip_radius(feature_norm, 1, np.float64)
    except ValueError as exc:
        raise ValueError(str(exc).replace("feature_norm_bound", "feature_norm")) from None
    if key == "huber":
        if isinstance(huber_delta, bool) or not isinstance(huber_delta, numbers.Real) or not 0 < huber_delta < math.inf:  # type: ignore[operator]  # typeshed's numbers.Real declares no __gt__
            raise ValueError(f"huber_delta must be a finite number > 0 for loss='huber'. Found {huber_delta!r}.")
        huber_delta = float(huber_delta)
    elif huber_delta is not None:
        raise ValueError(f"huber_delta is only for loss='huber'. Found huber_delta={huber_delta!r} with loss={key!r}.")
    return GlmDeclaration(loss=key, feature_norm=float(feature_norm), huber_delta=huber_delta)
