r"""The certified linear model of the Keras route (``model="glm"``): the model, its loss and the features are
checked before the first step, and the loss assumptions derived from them
(docs/derivations/jax-privacy-adapter.md#jp-glm; :func:`lastiter_plugins.glm.certify_linear_model`).

Supported: binary logistic regression, one ``keras.layers.Dense(1)`` on features of l2 norm at most A, compiled
with ``keras.losses.BinaryCrossentropy(from_logits=True)``, labels in [0, 1]. Clip the features before ``fit``
with :func:`lastiter_plugins.feature_clip.clip_features` (the adapter checks the array ``fit`` receives).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.feature_clip import check_feature_norms
from lastiter_plugins.glm import LossFamily, certify_linear_model

_SUPPORTED = (LossFamily.BINARY_LOGISTIC,)


@dataclasses.dataclass(frozen=True)
class GlmDeclaration:
    """What the user declared for ``model="glm"``: the loss family and the feature-norm bound A."""

    loss: LossFamily
    feature_norm: float

    @classmethod
    def parse(cls, loss: Any, feature_norm: Any) -> GlmDeclaration:
        family = LossFamily.parse(loss)
        if family not in _SUPPORTED:
            raise ValueError(
                f"loss must be {', '.join(f.value for f in _SUPPORTED)} for model='glm' on the jax_privacy Keras "
                f"route. Found {family.value}."
            )
        if isinstance(feature_norm, bool) or not isinstance(feature_norm, (int, float)) or not feature_norm > 0:
            raise ValueError(f"feature_norm must be a number > 0 for model='glm'. Found {feature_norm!r}.")
        return cls(family, float(feature_norm))


def _refuse(what: str) -> lp.NotApplicableError:
    return lp.NotApplicableError(
        f"model='glm' {what} (docs/derivations/jax-privacy-adapter.md#jp-glm); or declare the loss assumptions by "
        "hand (assumptions=LossAssumptions(...))."
    )


def dense_layer(model: Any) -> Any:
    """The model's one Dense(1) layer, after checking that nothing else is trained or computed."""
    import keras

    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    if len(layers) != 1 or type(layers[0]) is not keras.layers.Dense:
        names = ", ".join(type(layer).__name__ for layer in layers) or "none"
        raise _refuse(f"needs a model of exactly one keras.layers.Dense(1) on its inputs. Found layers: {names}")
    dense = layers[0]
    config = dense.get_config()
    problems = [
        f"{key}={config[key]!r}"
        for key in ("kernel_regularizer", "bias_regularizer", "kernel_constraint", "bias_constraint")
        if config.get(key) is not None
    ]
    if dense.activity_regularizer is not None:
        problems.append("an activity_regularizer")
    if dense.units != 1:
        problems.append(f"units={dense.units}")
    if dense.activation is not keras.activations.linear:
        problems.append(f"activation={config['activation']!r}")
    if getattr(dense, "lora_enabled", False):
        problems.append("LoRA enabled")
    if model.dtype_policy.name != "float32":
        problems.append(f"dtype policy {model.dtype_policy.name}")
    if problems:
        raise _refuse(
            "needs Dense(1) with a linear activation, no regularizer or constraint, float32. Found "
            + "; ".join(problems)
        )
    return dense


def check_loss(model: Any) -> None:
    import keras

    loss = getattr(model, "loss", None)
    if not isinstance(loss, keras.losses.BinaryCrossentropy):
        raise _refuse(
            "needs the model compiled with loss=keras.losses.BinaryCrossentropy(from_logits=True) (binary "
            f"logistic). Found {loss!r}"
        )
    config = loss.get_config()
    if not config.get("from_logits") or config.get("label_smoothing", 0.0) != 0.0:
        raise _refuse(
            "needs BinaryCrossentropy(from_logits=True, label_smoothing=0). Found from_logits="
            f"{config.get('from_logits')}, label_smoothing={config.get('label_smoothing')}"
        )


def check_data(x: Any, y: Any, feature_norm: float) -> None:
    """Every feature row, as the float32 model sees it, within A (checked in float64), every label in [0, 1]."""
    if isinstance(x, (dict, list, tuple)) or not hasattr(x, "shape") or len(x.shape) != 2:
        raise _refuse(f"needs x as one 2-D array of features. Found {type(x).__name__}")
    features = np.asarray(x).astype(np.float32)  # the values the float32 model computes with
    try:
        check_feature_norms(features, feature_norm)
    except ValueError as exc:
        raise _refuse(f"needs every feature row of x within the declared feature_norm: {exc}") from None
    labels = np.asarray(y, dtype=np.float64)
    if labels.size and (not np.all(np.isfinite(labels)) or labels.min() < 0.0 or labels.max() > 1.0):
        raise _refuse(
            f"needs every label in [0, 1] (binary logistic). Found labels in [{labels.min()}, {labels.max()}]"
        )


def derive(declared: GlmDeclaration, model: Any, x: Any, y: Any, clip_norm: float) -> lp.LossAssumptions:
    """The loss assumptions of the linear model ``fit`` is about to train (raises NotApplicableError)."""
    dense = dense_layer(model)
    check_loss(model)
    check_data(x, y, declared.feature_norm)
    certificate = certify_linear_model(
        declared.loss, feature_norm_bound=declared.feature_norm, clip_norm=clip_norm, bias=bool(dense.use_bias)
    )
    try:
        return lp.LossAssumptions(**certificate.loss_assumption_kwargs())
    except ValueError as exc:
        raise _refuse(f"cannot be certified: {exc}") from None
