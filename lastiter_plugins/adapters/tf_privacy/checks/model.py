r"""The model: every row assumes one clipped gradient per example, computed by Keras' own training step from
a per-example loss, with nothing but the DP update changing the weights, and a released model that is a function
of the noisy steps and of public data only. A batch-normalization layer in training mode (it couples the examples
of a batch and keeps unnoised statistics of the data), a preprocessing layer adapted on data not declared public
(``is_adapted``: its statistics are released without noise), a stateful layer, a custom ``train_step`` /
``compute_loss`` / ``make_train_function``, a loss reducing the batch, and ``loss_weights`` other than 1 break
that for every row: refused before the first step. A Keras constraint on a trainable variable maps each iterate
to another after the update: post-processing of the noisy steps, which the every-iterate rows cover and the
last-iterate rows do not (use ``ProjectionCallback`` for a projection onto a ball): a departure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from lastiter_plugins.host import Departure

from .. import _observe as observe
from .._errors import AccountingError
from ._check import Check, Start, weakening


class ModelCheck(Check):
    def start(self, start: Start) -> Iterable[Departure]:
        check_model(start.model)
        adapted = observe.adapted_layers(start.model)
        if adapted and not start.public_statistics:
            raise AccountingError(
                "a preprocessing layer adapted to data must have been adapted on public data: its statistics (a "
                "Normalization's mean and variance, a vocabulary, bin boundaries) are part of the released model, "
                "computed without noise, and one example can move them, so no finite epsilon holds if they come "
                "from the private training data. Adapt it on public data and declare public_statistics=True, or "
                "pass constants that do not depend on the private data (Normalization(mean=..., variance=...)). "
                f"Found adapted layers {adapted} with public_statistics=False."
            )
        return ()


class ConstraintCheck(Check):
    gates = weakening(update="any")

    def start(self, start: Start) -> Iterable[Departure]:
        constrained = [v.name for v in start.model.trainable_variables if getattr(v, "constraint", None) is not None]
        if constrained:
            yield Departure(
                step=1,
                fact=f"Keras constraints map the weights after every update ({', '.join(constrained)})",
                changes=self.gates,
            )


def check_model(model: Any) -> None:
    """Refuse models whose step is not one clipped gradient per example (or whose training code cannot be read)."""
    if not model.built or not model.trainable_variables:
        raise AccountingError(
            "the model must be built, with trainable variables, before fit (model.build(input_shape) or call "
            "it once on a batch of public or dummy data): the callback records the variables the step trains. "
            f"Found built={model.built}, {len(model.trainable_variables)} trainable variables."
        )
    mixing = observe.batch_mixing_layers(model)
    if mixing:
        raise AccountingError(
            "the model must have no batch-normalization layer in training mode (BatchNormalization, "
            "SyncBatchNormalization, tf.compat.v1.layers.BatchNormalization): in training it normalises each "
            "example with statistics of the whole batch, so one example's gradient depends on the others and "
            "clipping no longer bounds one example's influence, and its moving statistics are computed from the "
            "private data without noise and released with the model (public_statistics does not cover it). Use "
            "LayerNormalization or GroupNormalization (per example), or freeze the layer (layer.trainable = False "
            f"on a tf.keras layer, or call it with training=False). Found {mixing} in training mode."
        )
    overridden = custom_training_code(model)
    if overridden:
        method, where = overridden
        raise AccountingError(
            f"model.{method} must be Keras' own Model.{method}: a custom {method} can feed an example twice while "
            "keeping the loss vector at batch_size values, scale the loss (and with it the smoothness behind the "
            "constants), or change the weights, and the callback cannot verify what it does. Put custom logic in "
            "the model's call or in the loss, or account the run by hand (lastiter_plugins.epsilon) if you "
            f"can prove it is plain DP-SGD on one clipped gradient per example. Found {method} {where}."
        )
    stateful = [
        layer.name
        for layer in model.submodules
        if isinstance(layer, tf.keras.layers.Layer)
        and not isinstance(layer, tf.keras.Model)
        and getattr(layer, "stateful", False)
    ]
    if stateful:
        raise AccountingError(
            "the model must have no stateful layer (an RNN with stateful=True): it carries the state computed from "
            "one batch's examples into the next batches, so one example influences other examples' gradients, and "
            "into the released model, outside the model's weights and without noise. Use stateful=False. "
            f"Found {stateful}."
        )
    reduced = [
        loss
        for loss in tf.nest.flatten(model.loss)
        if loss is not None
        and not (isinstance(loss, tf.keras.losses.Loss) and loss.reduction == tf.keras.losses.Reduction.NONE)
    ]
    if reduced:
        found = ", ".join(
            f"{type(loss).__name__}(reduction={loss.reduction!r})"
            if isinstance(loss, tf.keras.losses.Loss)
            else repr(loss)
            for loss in reduced
        )
        raise AccountingError(
            "the loss given to compile must be a tf.keras.losses.Loss with reduction=tf.keras.losses.Reduction.NONE: "
            "TF Privacy clips one loss value per example, and a loss string or function is wrapped by Keras with the "
            "default reduction, which reduces the batch to one number. "
            f"Found {found}."
        )
    weights = observe.compiled_loss_weights(model)
    if weights is not None and any(w != 1 for w in tf.nest.flatten(weights)):
        raise AccountingError(
            "compile's loss_weights must be None or 1: Keras multiplies the per-example loss by them before TF "
            "Privacy differentiates it, which multiplies the smoothness and the gradient norms behind the loss "
            "constants. Fold the weight into the loss (and declare constants for that loss). "
            f"Found loss_weights={weights!r}."
        )


#: Model methods whose Keras implementation the per-step checks rely on.
TRAINING_METHODS = ("train_step", "compute_loss", "make_train_function")


def custom_training_code(model: Any) -> tuple[str, str] | None:
    """(method, where) of the first method of ``TRAINING_METHODS`` the model replaces, or None."""
    for method in TRAINING_METHODS:
        if method in vars(model):
            return method, "replaced on the model instance"
        owner = next(klass for klass in type(model).__mro__ if method in vars(klass))
        if owner is not tf.keras.Model:
            return method, f"overridden by {owner.__name__}"
    return None
