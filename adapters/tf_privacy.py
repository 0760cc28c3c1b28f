r"""TF Privacy / Keras glue: live last-iterate accounting during ``model.fit``
and a privacy statement to publish.

TF Privacy (0.9) has no accountant object: its Keras DP optimizers clip and
noise the gradients and users compute epsilon afterwards from the
hyperparameters. This module gives Keras users

* :class:`LastIterateCallback`, a ``keras.callbacks.Callback`` that reads the
  DP optimizer (clipping norm, noise multiplier, microbatches, learning rate)
  and ``fit``'s data pipeline (batch size, dataset size, shuffling), refuses
  every setting the bounds do not cover, counts the optimizer steps and writes
  ``epsilon`` into the epoch logs (Keras' progress bar and ``History``);
* :class:`ProjectionCallback`, the projection onto an l2 ball that the
  bounded-domain bounds need (the accountant checks that it is there);
* :func:`compute_last_iterate_privacy_statement`, the counterpart of TF
  Privacy's ``compute_dp_sgd_privacy_statement`` for the final model only.

Tested against tensorflow 2.14.1 (Keras 2.14.0) and tensorflow-privacy 0.9.0.

How the callback sees ``fit``'s settings (a decision, see docs/tf_privacy.md):
Keras 2.14 gives callbacks only ``params = {verbose, epochs, steps}``; the
batch size and the ``shuffle`` flag live in the ``DataHandler`` that
``Model.fit`` builds as a local variable, and the callback list is a local too.
At ``on_train_begin`` the callback finds the running ``Model.fit`` frame of its
own model on the call stack and reads (never writes) that data handler and
callback list. Anything it cannot read with certainty (a custom training loop,
inputs that are not in-memory arrays or tensors, another Keras version) is
refused with a message, never guessed.

The update the bounds analyse (BOUNDS.md section 1) is plain SGD with a
constant step on the per-example clipped gradients,
``x <- Pi(x - eta * (sum_i clip_C(grad f_i(x)) + N(0, (z C)^2 I)) / b)``.
TF Privacy's ``DPKerasSGDOptimizer`` with one example per microbatch does
exactly that on every full batch. It divides a short last batch of b' < b
examples by b', not b, so one example moves that step by 2*eta*C/b' while the
other steps carry noise eta*z*C/b: the displacement that the cyclic
(shifted-divergence) bounds spread over the following steps is b/b' times
larger than they assume. The callback therefore refuses a short last batch
(choose a batch size that divides the number of examples).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
import textwrap
from collections.abc import Sequence
from typing import Any

import numpy as np

try:
    import tensorflow as tf
    from keras.src.engine import data_adapter as _keras_data_adapter
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as _tfp_statement
    from tensorflow_privacy.privacy.dp_query.gaussian_query import GaussianSumQuery as _GaussianSumQuery
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras import GenericDPSGDOptimizer as _GenericDPSGD
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras_vectorized import (
        VectorizedDPKerasSGDOptimizer as _VectorizedDPSGD,
    )
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "lastiter_plugins.adapters.tf_privacy needs TensorFlow 2.14 and TF Privacy 0.9: "
        "pip install 'lastiter-plugins[tf]'. "
        f"Import failed with: {error}"
    ) from error

from lastiter_plugins.api import EpsilonResult, account, applicable_bounds, compute_epsilon
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.conversion import validate_delta, validate_orders
from lastiter_plugins.registry import BEST, BOUND_IDS, BOUNDS

__all__ = [
    "AccountingError",
    "DPOptimizerSettings",
    "FitSettings",
    "LastIterateCallback",
    "ProjectionCallback",
    "compute_last_iterate_privacy_statement",
    "read_dp_optimizer",
]

#: The code object of Keras 2.14's ``Model.fit`` (under its traceback-filtering decorator).
_FIT_CODE = inspect.unwrap(tf.keras.Model.fit).__code__

#: What Keras ``fit(shuffle=...)`` does with in-memory arrays (keras/src/engine/data_adapter.py,
#: TensorLikeDataAdapter): True draws a new permutation every epoch, False keeps the order.
#: A user who permuted the arrays once, at random and in secret, before fit(shuffle=False)
#: may declare shuffle_once.
_SAMPLINGS_FOR_SHUFFLE: dict[bool, tuple[Sampling, ...]] = {
    True: (Sampling.RESHUFFLE,),
    False: (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE),
}


class AccountingError(ValueError):
    """The training run cannot be accounted (the message names the setting and the fix)."""


# ---------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class DPOptimizerSettings:
    """What a TF Privacy DP-SGD optimizer does, read from the optimizer itself.

    Attributes:
      optimizer_class: the class name (DPKerasSGDOptimizer's generic class or the vectorized one).
      l2_norm_clip: C, the clipping norm of each microbatch gradient.
      noise_multiplier: z; the noise added to the sum of clipped gradients has std z*C.
      num_microbatches: None (one example per microbatch) or the fixed number of microbatches.
      learning_rate: eta, the constant step size.
    """

    optimizer_class: str
    l2_norm_clip: float
    noise_multiplier: float
    num_microbatches: int | None
    learning_rate: float


def _hyper_value(optimizer: Any, name: str) -> Any:
    """The raw hyperparameter (a number, a tf.Variable, a schedule or a callable), read
    without creating the optimizer's variables."""
    return optimizer._hyper.get(name)


def _number(value: Any) -> float | None:
    """A Python float for a number, a 0-d tensor or variable; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, (tf.Variable, tf.Tensor)) and value.shape.rank == 0:
        return float(value.numpy())
    return None


def _learning_rate(optimizer: Any) -> float:
    raw = _hyper_value(optimizer, "learning_rate")
    if isinstance(raw, tf.keras.optimizers.schedules.LearningRateSchedule):
        raise AccountingError(
            "learning_rate must be a constant number: the bounds assume a constant step size and no "
            "direction of a schedule is safe for all of them (BOUNDS.md section 1). "
            f"Found the schedule {type(raw).__name__}."
        )
    value = _number(raw)
    if value is None:
        raise AccountingError(
            f"learning_rate must be a constant number (not a callable or tensor expression). Found {raw!r}."
        )
    if not (math.isfinite(value) and value > 0):
        raise AccountingError(f"learning_rate must be a finite number > 0. Found {value!r}.")
    return value


def read_dp_optimizer(optimizer: Any) -> DPOptimizerSettings:
    """Read and check a TF Privacy DP-SGD optimizer.

    Accepted: ``DPKerasSGDOptimizer`` (an instance of TF Privacy's
    ``GenericDPSGDOptimizer`` with a ``GaussianSumQuery``) and
    ``VectorizedDPKerasSGDOptimizer``, both built on the legacy Keras SGD, with
    momentum 0, no Nesterov, no ``decay``, no gradient clipping or
    transformation by Keras (``clipnorm``, ``clipvalue``, ``global_clipnorm``,
    ``gradient_transformers``), ``gradient_accumulation_steps == 1`` and a
    constant learning rate.

    Raises:
      AccountingError: anything else, naming the setting and the fix.
    """
    if isinstance(optimizer, _VectorizedDPSGD):
        kind = "VectorizedDPKerasSGDOptimizer"
        clip, noise = optimizer._l2_norm_clip, optimizer._noise_multiplier
        clip_value, noise_value = _number(clip), _number(noise)
    elif isinstance(optimizer, _GenericDPSGD):
        kind = "DPKerasSGDOptimizer"
        query = optimizer._dp_sum_query
        if type(query) is not _GaussianSumQuery:
            raise AccountingError(
                "the DP query must be TF Privacy's GaussianSumQuery (what DPKerasSGDOptimizer builds): "
                "tree aggregation (DP-FTRL), adaptive clipping and other queries are not DP-SGD. "
                f"Found {type(query).__name__}."
            )
        clip_value, stddev = _number(query._l2_norm_clip), _number(query._stddev)
        noise_value = None if clip_value in (None, 0.0) or stddev is None else stddev / clip_value
        accumulation = optimizer.gradient_accumulation_steps
        if accumulation != 1:
            raise AccountingError(
                "gradient_accumulation_steps must be 1: with accumulation the optimizer noises every "
                "small batch and applies their average, a different mechanism (batch and noise change). "
                f"Found {accumulation}."
            )
    else:
        raise AccountingError(
            "the optimizer must be TF Privacy's DPKerasSGDOptimizer or VectorizedDPKerasSGDOptimizer "
            "(plain DP-SGD, the update every bound analyses); Adam, Adagrad and non-private optimizers are "
            f"refused. Found {type(optimizer).__module__}.{type(optimizer).__name__}."
        )
    if clip_value is None or not (math.isfinite(clip_value) and clip_value > 0):
        raise AccountingError(f"l2_norm_clip must be a finite number > 0. Found {clip!r}.")
    if noise_value is None or not (math.isfinite(noise_value) and noise_value > 0):
        raise AccountingError(f"noise_multiplier must be a finite number > 0. Found {noise_value!r}.")
    momentum = _number(_hyper_value(optimizer, "momentum"))
    if optimizer._momentum or momentum != 0.0:
        raise AccountingError(
            "momentum must be 0: the bounds analyse plain SGD (BOUNDS.md section 1). "
            f"Found momentum={_hyper_value(optimizer, 'momentum')!r}."
        )
    if optimizer.nesterov:
        raise AccountingError("nesterov must be False: the bounds analyse plain SGD. Found True.")
    if optimizer._initial_decay != 0.0:
        raise AccountingError(
            "decay must be 0: Keras' legacy decay is a learning-rate schedule eta/(1 + decay*t), and the "
            f"bounds assume a constant step. Found decay={optimizer._initial_decay!r}."
        )
    for name in ("clipnorm", "clipvalue", "global_clipnorm"):
        if getattr(optimizer, name, None) is not None:
            raise AccountingError(
                f"{name} must be None: Keras would clip the already noised gradient, which changes the "
                f"update the bounds analyse (TF Privacy's l2_norm_clip does the DP clipping). "
                f"Found {name}={getattr(optimizer, name)!r}."
            )
    if optimizer.gradient_transformers:
        raise AccountingError(
            "gradient_transformers must be empty: they change the noised gradient before the update. "
            f"Found {optimizer.gradient_transformers!r}."
        )
    microbatches = optimizer._num_microbatches
    if microbatches is not None:
        microbatches = _number(microbatches)
        if microbatches is None or microbatches != int(microbatches) or microbatches < 1:
            raise AccountingError(
                f"num_microbatches must be None or an integer >= 1. Found {optimizer._num_microbatches!r}."
            )
        microbatches = int(microbatches)
    return DPOptimizerSettings(
        optimizer_class=kind,
        l2_norm_clip=clip_value,
        noise_multiplier=noise_value,
        num_microbatches=microbatches,
        learning_rate=_learning_rate(optimizer),
    )


def _check_microbatches(settings: DPOptimizerSettings, batch_size: int) -> None:
    k = settings.num_microbatches
    if k is None:
        return
    if k != batch_size:
        raise AccountingError(
            f"num_microbatches must be None or equal to batch_size = {batch_size} (one example per "
            f"microbatch). Found num_microbatches={k}, i.e. microbatches of {batch_size / k:g} examples. "
            f"TF Privacy then clips the mean gradient of each microbatch (not each example's gradient), adds "
            f"N(0, (zC)^2) to the sum of the {k} clipped microbatch gradients and divides by {k}. One example "
            f"can move its microbatch's clipped mean by up to 2C, so a step moves by up to 2*eta*C/{k}, not "
            f"2*eta*C/{batch_size}: the records of this mechanism are microbatches, not examples, and the "
            "bounds' constants (n, b, the Lipschitz constant of the per-example-clipped update) do not "
            "describe it (TF Privacy's own accounting doubles the sensitivity for microbatching). "
            "Use num_microbatches=None."
        )


def _check_full_batches(dataset_size: int, batch_size: int, partial_batch_size: int) -> None:
    if partial_batch_size:
        raise AccountingError(
            f"batch_size must divide dataset_size = {dataset_size}: fit would end every epoch with a batch of "
            f"{partial_batch_size} examples, and TF Privacy divides each batch's noisy gradient sum by its own "
            f"size (num_microbatches=None), so one example in that batch moves the step by 2*eta*C/"
            f"{partial_batch_size}, {batch_size / partial_batch_size:g} times the 2*eta*C/{batch_size} the "
            "cyclic last-iterate bounds assume while the other steps keep the noise eta*z*C/b (with "
            "num_microbatches=batch_size TF Privacy cannot split that batch at all). Choose a batch_size that "
            "divides dataset_size, or train on the first floor(n/b)*b examples. "
            f"Found batch_size={batch_size}, dataset_size % batch_size = {partial_batch_size}."
        )


# ---------------------------------------------------------------- what fit does


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """What the running ``Model.fit`` does with the data (read from its DataHandler).

    Attributes:
      dataset_size: number of training examples (after ``validation_split``).
      batch_size: b.
      partial_batch_size: size of the short last batch of each epoch (0 if none).
      steps_per_epoch: ceil(dataset_size / batch_size).
      shuffle: fit's shuffle setting (True, False or "batch").
      epochs: epochs this fit call will run (``epochs - initial_epoch``).
      steps_per_execution: batches run per call of the train function.
      callbacks: the callbacks of this fit call.
    """

    dataset_size: int
    batch_size: int
    partial_batch_size: int
    steps_per_epoch: int
    shuffle: bool | str
    epochs: int
    steps_per_execution: int
    callbacks: tuple[Any, ...]


def _fit_locals(model: Any) -> dict[str, Any] | None:
    frame = inspect.currentframe()
    try:
        while frame is not None:
            if frame.f_code is _FIT_CODE and frame.f_locals.get("self") is model:
                return dict(frame.f_locals)
            frame = frame.f_back
        return None
    finally:
        del frame


def _read_fit(model: Any) -> FitSettings:
    """Read the running ``Model.fit`` call of ``model`` (Keras 2.14 internals, read only)."""
    found = _fit_locals(model)
    if found is None or "data_handler" not in found or "callbacks" not in found:
        raise AccountingError(
            "LastIterateCallback must be passed to Keras' Model.fit (tensorflow 2.14 / Keras 2.14): it "
            "reads fit's batch size, shuffle setting and callback list from the running fit call, and "
            "found none (a custom training loop, a subclass that does not call Model.fit, or another "
            "Keras version). Found no running Model.fit for this model."
        )
    handler = found["data_handler"]
    adapter = handler._adapter
    if type(adapter) is not _keras_data_adapter.TensorLikeDataAdapter:
        raise AccountingError(
            "fit's x must be in-memory arrays or tensors (numpy, tf.Tensor, pandas), batched by fit's "
            "batch_size: only then are the batch size, the batches and the shuffling known. For a "
            "tf.data.Dataset, a generator or a keras Sequence they are not, so the declared sampling "
            f"cannot be checked. Found an input handled by {type(adapter).__name__}."
        )
    if found.get("sample_weight") is not None or found.get("class_weight") is not None:
        raise AccountingError(
            "sample_weight and class_weight must be None: they rescale each example's loss, so the "
            "declared smoothness/convexity constants and the effective learning rate would change per "
            "example. Fold the weights into the loss function and declare constants for that loss. "
            "Found weights passed to fit."
        )
    batch_size, num_batches = int(adapter.batch_size()), int(adapter.get_size())
    partial = int(adapter._partial_batch_size)
    dataset_size = (num_batches - 1) * batch_size + partial if partial else num_batches * batch_size
    inferred = handler.inferred_steps
    if inferred != num_batches:
        raise AccountingError(
            f"steps_per_epoch must be None (or ceil(dataset_size / batch_size) = {num_batches}): an epoch "
            "of fit must be one pass over the data, in ceil(n/b) steps. "
            f"Found steps_per_epoch={inferred}."
        )
    strategy = model.distribute_strategy
    if strategy.num_replicas_in_sync != 1:
        raise AccountingError(
            "fit must run on one replica: under a distribution strategy each replica clips, noises and "
            "normalises its own share of the batch. "
            f"Found {strategy.num_replicas_in_sync} replicas ({type(strategy).__name__})."
        )
    per_execution = handler._steps_per_execution
    per_execution = int(per_execution.numpy()) if per_execution is not None else 1
    if getattr(model, "enable_tune_steps_per_execution", False):
        per_execution = 0  # tuned at run time: unknown
    callback_list = found["callbacks"]
    callbacks = tuple(getattr(callback_list, "callbacks", callback_list) or ())
    return FitSettings(
        dataset_size=dataset_size,
        batch_size=batch_size,
        partial_batch_size=partial,
        steps_per_epoch=num_batches,
        shuffle=adapter._shuffle,
        epochs=int(handler._epochs) - int(handler._initial_epoch),
        steps_per_execution=per_execution,
        callbacks=callbacks,
    )


def _check_stopping(callbacks: Sequence[Any]) -> None:
    """Refuse callbacks that choose the released model or the stopping time from the training."""
    for cb in callbacks:
        if isinstance(cb, tf.keras.callbacks.EarlyStopping):
            if cb.restore_best_weights:
                raise AccountingError(
                    "EarlyStopping must not be used with restore_best_weights=True: it replaces the final "
                    f"model by the iterate of the epoch with the best {cb.monitor!r}, an iterate selected by "
                    "comparing intermediate iterates on (private) data. The last-iterate bounds cover the "
                    "final iterate of a fixed number of steps only, not a selected one. Remove EarlyStopping "
                    "and choose the number of epochs before training. Found restore_best_weights=True."
                )
            raise AccountingError(
                "EarlyStopping must not be in fit's callbacks: it stops training at an epoch chosen from "
                f"{cb.monitor!r}, computed on the private data (validation_split included), and a stopping "
                "time chosen from the private data is not covered by the bounds, which assume a number of "
                "steps fixed in advance. Remove EarlyStopping and choose the number of epochs before "
                f"training. Found EarlyStopping(monitor={cb.monitor!r}, restore_best_weights=False)."
            )
        if isinstance(cb, tf.keras.callbacks.TerminateOnNaN):
            raise AccountingError(
                "TerminateOnNaN must not be in fit's callbacks: it stops training when the loss on the "
                "private data becomes NaN, a data-dependent stopping time the bounds do not cover (they "
                "assume a number of steps fixed in advance). Remove it. Found TerminateOnNaN."
            )


def _check_sampling(declared: Sampling, shuffle: bool | str) -> None:
    if isinstance(shuffle, str) or shuffle not in _SAMPLINGS_FOR_SHUFFLE:
        raise AccountingError(
            "fit's shuffle must be True (a new permutation every epoch: sampling='reshuffle') or False "
            "(the same order every epoch: sampling='cyclic'). shuffle='batch' keeps the batches and "
            f"shuffles their order, which is none of the schemes the bounds cover. Found shuffle={shuffle!r}."
        )
    allowed = _SAMPLINGS_FOR_SHUFFLE[bool(shuffle)]
    if declared not in allowed:
        what = "draws a new permutation every epoch" if shuffle else "keeps the same order every epoch"
        raise AccountingError(
            f"sampling must be {' or '.join(s.value for s in allowed)} for fit(shuffle={shuffle}), which "
            f"{what} (Keras 2.14 TensorLikeDataAdapter); sampling={declared.value} contradicts it. Declare "
            f"the sampling fit performs, or change fit's shuffle. Found sampling={declared.value}."
        )


# ---------------------------------------------------------------- projection


class ProjectionCallback(tf.keras.callbacks.Callback):
    r"""Project all trainable weights of the model jointly onto the l2 ball of
    diameter ``diameter`` around ``center`` (default: the origin), before the
    first step and after every optimizer step.

    This is the projection :math:`\Pi` onto a closed convex set of diameter D
    that the bounded-domain bounds assume (kong-ribero-bounded,
    altschuler-talwar, liang-bounded), and the device that makes a declaration
    ``gradient_norms_within_clip=True`` checkable: on a ball of radius R the gradient norms are
    bounded whenever they grow at most linearly. The weights are scaled to
    radius ``R*(1 - 1e-6)`` when they leave the ball, so that float32 rounding
    never leaves them outside the radius R = D/2.

    Args:
      diameter: D > 0.
      center: the ball's center, a sequence of arrays shaped like
        ``model.trainable_variables`` (None: the origin). It must not depend on
        the private data.

    Raises:
      AccountingError: at the start of training if ``steps_per_execution`` is
        not 1 (the callback would run only every N steps) or the center does not
        match the weights.
    """

    _MARGIN = 1.0 - 1e-6

    def __init__(self, diameter: float, center: Sequence[Any] | None = None) -> None:
        super().__init__()
        value = _number(diameter)
        if value is None or not (math.isfinite(value) and value > 0):
            raise ValueError(f"diameter must be a finite number > 0. Found {diameter!r}.")
        self.diameter = value
        self.radius = value / 2.0
        self._center_values = None if center is None else [np.asarray(c) for c in center]
        self._center: list[tf.Tensor] | None = None

    def on_train_begin(self, logs: dict | None = None) -> None:
        found = _fit_locals(self.model)
        if found is not None and "data_handler" in found:
            per_execution = found["data_handler"]._steps_per_execution
            per_execution = int(per_execution.numpy()) if per_execution is not None else 1
            if per_execution != 1 or getattr(self.model, "enable_tune_steps_per_execution", False):
                raise AccountingError(
                    "steps_per_execution must be 1 with ProjectionCallback: Keras calls batch callbacks once "
                    "per execution, so the weights would be projected only every N steps. "
                    f"Found steps_per_execution={per_execution}."
                )
        weights = self.model.trainable_variables
        if self._center_values is None:
            self._center = [tf.zeros_like(v) for v in weights]
        else:
            shapes = [tuple(v.shape) for v in weights]
            given = [c.shape for c in self._center_values]
            if len(given) != len(shapes) or any(s != g for s, g in zip(shapes, given, strict=True)):
                raise AccountingError(
                    f"center must match the shapes of model.trainable_variables {shapes}. Found {given}."
                )
            self._center = [tf.constant(c, dtype=v.dtype) for c, v in zip(self._center_values, weights, strict=True)]
        self.project()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.project()

    def distance_from_center(self) -> float:
        """The l2 distance of the weights (all trainable variables together) from the center."""
        weights = self.model.trainable_variables
        center = self._center if self._center is not None else [tf.zeros_like(v) for v in weights]
        total = sum(
            float(tf.reduce_sum(tf.square(tf.cast(v - c, tf.float64)))) for v, c in zip(weights, center, strict=True)
        )
        return math.sqrt(total)

    def project(self) -> None:
        """Project the weights onto the ball now (a no-op inside it)."""
        distance = self.distance_from_center()
        if distance <= self.radius:
            return
        scale = self.radius * self._MARGIN / distance
        for v, c in zip(self.model.trainable_variables, self._center, strict=True):
            v.assign(c + (v - c) * tf.cast(scale, v.dtype))


# ---------------------------------------------------------------- the accountant


class LastIterateCallback(tf.keras.callbacks.Callback):
    r"""Last-iterate accounting for ``model.fit`` with TF Privacy's DP-SGD optimizers.

    Pass it to ``model.fit(x, y, batch_size=b, shuffle=..., callbacks=[...])``
    with in-memory arrays. At ``on_train_begin``, before any step, it reads and
    checks the optimizer (:func:`read_dp_optimizer`) and fit's data pipeline,
    and checks that the chosen bound applies to the planned run; it counts the
    optimizer steps (``optimizer.iterations``) in ``on_train_batch_end``,
    refuses a learning rate changed during training, and writes ``epsilon`` into
    the epoch logs (Keras' progress bar and ``History``) in ``on_epoch_end``.

    ``epsilon`` covers the FINAL model only (``composition`` excepted, which
    covers every iterate) under the declared neighbouring relation: checkpoints
    saved during training (``ModelCheckpoint``, ``save_best_only`` included)
    must not be released. It covers a number of steps fixed before training:
    ``EarlyStopping`` (with or without ``restore_best_weights``) and
    ``TerminateOnNaN`` are refused, and a callback that sets
    ``model.stop_training`` voids the epsilon. It describes the model only as
    long as the model takes no step it did not count: reading ``epsilon`` after
    a later ``fit`` without it, ``train_on_batch`` or a recompilation raises.

    Every batch must be full (``batch_size`` divides ``dataset_size``): TF
    Privacy divides a short last batch by its own size, which the bounds do
    not cover (see the module docstring and docs/tf_privacy.md).

    Args:
      bound: a bound id of ``lastiter_plugins.BOUND_IDS`` (default ``best``).
      sampling: what fit does: ``reshuffle`` for ``shuffle=True`` (Keras'
        default), ``cyclic`` for ``shuffle=False`` (``shuffle_once`` with
        ``shuffle=False`` when the arrays were permuted once at random, in
        secret, before fit).
      dataset_size: n, the number of training examples (checked against fit).
      delta: the target delta.
      smoothness, weak_convexity, strong_convexity, gradient_norms_within_clip: the loss
        assumptions (see :class:`lastiter_plugins.LossAssumptions`); they must
        hold for the per-example loss Keras passes to the optimizer.
      diameter: D of the projection; requires exactly one
        :class:`ProjectionCallback` with diameter <= D in the same fit call.
      relation: ``replace_one`` (default) or ``add_or_remove_one``.
      orders: Renyi orders (default: the library's grid).

    Raises:
      ValueError: invalid arguments (at construction).
      AccountingError: a setting the bounds do not cover (at ``on_train_begin``,
        or during training for a learning-rate change or a stopped training);
        when reading ``epsilon``, ``result`` or ``config``, steps the callback
        did not count.
      NotApplicableError: the chosen bound does not apply to the planned run.
    """

    def __init__(
        self,
        *,
        bound: str = BEST,
        sampling: str | Sampling,
        dataset_size: int,
        delta: float,
        smoothness: float | None = None,
        weak_convexity: float = 0.0,
        strong_convexity: float = 0.0,
        diameter: float | None = None,
        gradient_norms_within_clip: bool = False,
        relation: str | Relation = Relation.REPLACE_ONE,
        orders: Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        if bound not in BOUND_IDS:
            raise ValueError(f"bound must be one of {', '.join(BOUND_IDS)}. Found {bound!r}.")
        self.bound = bound
        self.sampling = Sampling.parse(sampling)
        if self.sampling not in (*_SAMPLINGS_FOR_SHUFFLE[True], *_SAMPLINGS_FOR_SHUFFLE[False]):
            raise ValueError(
                "sampling must be cyclic, shuffle_once or reshuffle: Keras fit passes over the data in "
                f"epochs and cannot sample random batches or Poisson batches. Found {self.sampling.value}."
            )
        # Validate the run-independent numbers now, with the library's own checks.
        TrainingConfig(dataset_size=dataset_size, batch_size=1, noise_multiplier=1.0, steps=1, sampling=self.sampling)
        self.dataset_size = int(dataset_size)
        self.delta = validate_delta(delta)
        self.relation = Relation.parse(relation)
        self.assumptions = LossAssumptions(
            smoothness=smoothness,
            weak_convexity=weak_convexity,
            strong_convexity=strong_convexity,
            diameter=diameter,
            gradient_norms_within_clip=gradient_norms_within_clip,
        )
        self.orders = validate_orders(orders)
        self._reset()

    def _reset(self) -> None:
        self.optimizer_settings: DPOptimizerSettings | None = None
        self.fit_settings: FitSettings | None = None
        self._template: TrainingConfig | None = None
        self._start_iterations = 0
        self._steps = 0
        self._failure: str | None = None
        self._cache: EpsilonResult | None = None
        self._optimizer: Any = None

    # -- reading ------------------------------------------------------------

    @property
    def steps(self) -> int:
        """Optimizer steps counted so far in this fit call."""
        return self._steps

    @property
    def config(self) -> TrainingConfig:
        """The TrainingConfig of the steps counted so far."""
        self._check_usable()
        return self._template.replace(steps=self._steps)

    @property
    def result(self) -> EpsilonResult:
        """The labelled guarantee (bound, relation, what it protects, ...) for the steps so far."""
        self._check_usable()
        if self._cache is None or self._cache.steps != self._steps:
            self._cache = compute_epsilon(self.bound, self.config, self.assumptions, self.delta, self.orders)
        return self._cache

    @property
    def epsilon(self) -> float:
        """Epsilon at ``delta`` for the final model after the steps counted so far."""
        return self.result.epsilon

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise AccountingError(self._failure)
        if self._template is None or self._steps == 0:
            raise AccountingError("no optimizer step has been counted yet: train with model.fit first.")
        # The epsilon describes the model only while it is still the iterate after the counted steps:
        # any later step (fit without this callback, train_on_batch, a custom loop) is unaccounted.
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not self._optimizer:
            raise AccountingError(
                "model.optimizer must be the optimizer whose steps this callback counted: the model was "
                "compiled again, so steps taken with the new optimizer are not accounted. Found "
                f"{type(optimizer).__name__} object {id(optimizer):#x}, not the accounted one "
                f"{id(self._optimizer):#x}; account the whole training in one fit call with this callback."
            )
        expected = self._start_iterations + self._steps
        iterations = int(optimizer.iterations.numpy())
        if iterations > expected:
            raise AccountingError(
                f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
                f"model took {iterations - expected} optimizer step(s) it did not see (a later fit or "
                "train_on_batch without this callback, a custom training loop, or epsilon read by another "
                "callback before this one's on_train_batch_end), so the epsilon would describe fewer steps "
                f"than the model took. Found iterations={iterations}; account the whole training in one "
                "fit call with this callback."
            )
        if iterations < expected:
            raise AccountingError(
                f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
                "step count was set back (a restored optimizer state?), so the steps the model took are "
                f"unknown. Found iterations={iterations}."
            )

    # -- the Keras hooks ----------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self._reset()
        model = self.model
        settings = read_dp_optimizer(model.optimizer)
        fit = _read_fit(model)
        if fit.dataset_size != self.dataset_size:
            raise AccountingError(
                f"dataset_size must equal the number of examples fit trains on = {fit.dataset_size} "
                f"(after validation_split). Found dataset_size={self.dataset_size}."
            )
        _check_sampling(self.sampling, fit.shuffle)
        _check_microbatches(settings, fit.batch_size)
        _check_full_batches(fit.dataset_size, fit.batch_size, fit.partial_batch_size)
        iterations = int(model.optimizer.iterations.numpy())
        if iterations != 0:
            raise AccountingError(
                "the optimizer must be fresh (iterations = 0): its earlier steps would not be accounted. "
                f"Found iterations={iterations}; compile the model with a new optimizer."
            )
        constrained = [v.name for v in model.trainable_variables if getattr(v, "constraint", None) is not None]
        if constrained:
            raise AccountingError(
                "trainable variables must have no Keras constraint: a constraint changes the update after "
                "every step (use ProjectionCallback for a projection onto a ball). "
                f"Found constraints on {', '.join(constrained)}."
            )
        batch_norms = [m.name for m in model.submodules if isinstance(m, tf.keras.layers.BatchNormalization)]
        if batch_norms:
            raise AccountingError(
                "the model must have no BatchNormalization layer: it couples the examples of a batch (a "
                "per-example gradient then depends on the others, so clipping no longer bounds one example's "
                "influence) and its moving statistics are computed from the private data without noise and "
                f"released with the model. Use LayerNormalization or GroupNormalization. Found {batch_norms}."
            )
        self._check_projection(fit)
        _check_stopping(fit.callbacks)
        planned_steps = max(fit.epochs, 1) * fit.steps_per_epoch
        template = TrainingConfig(
            dataset_size=fit.dataset_size,
            batch_size=fit.batch_size,
            noise_multiplier=settings.noise_multiplier,
            steps=planned_steps,
            sampling=self.sampling,
            learning_rate=settings.learning_rate,
            clip_norm=settings.l2_norm_clip,
            relation=self.relation,
        )
        # Refuse before the first step when the bound does not apply to the planned run.
        compute_epsilon(self.bound, template, self.assumptions, self.delta, self.orders)
        self.optimizer_settings, self.fit_settings, self._template = settings, fit, template
        self._optimizer = model.optimizer

    def _check_projection(self, fit: FitSettings) -> None:
        projections = [cb for cb in fit.callbacks if isinstance(cb, ProjectionCallback)]
        declared = self.assumptions.diameter
        if declared is None:
            if projections:
                raise AccountingError(
                    "diameter must be declared when a ProjectionCallback is used (the bounds must know "
                    f"the update projects). Found a ProjectionCallback of diameter {projections[0].diameter:g} "
                    "and diameter=None."
                )
            return
        if len(projections) != 1:
            raise AccountingError(
                f"diameter={declared:g} needs exactly one ProjectionCallback in the same fit call (the "
                "bounded-domain bounds assume every iterate is projected onto one convex set; two "
                f"projections in a row do not project onto their intersection). Found {len(projections)}."
            )
        if projections[0].diameter > declared:
            raise AccountingError(
                f"diameter must be >= the ProjectionCallback's diameter = {projections[0].diameter:g}. "
                f"Found diameter={declared:g}."
            )

    def _fail(self, message: str) -> None:
        self._failure = message
        raise AccountingError(message)

    def _check_learning_rate(self) -> None:
        expected = self.optimizer_settings.learning_rate
        try:
            current = _learning_rate(self.model.optimizer)
        except AccountingError as error:
            self._fail(f"the learning rate changed during training: {error}")
        # The variable holds the value in the weights' dtype (float32 by default).
        if current not in (expected, float(np.float32(expected))):
            self._fail(
                f"learning_rate must stay constant during training (a schedule or callback changed it). "
                f"Found {current!r} after starting with {expected!r}; the epsilon of this run is void."
            )

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        self._check_learning_rate()
        iterations = int(self.model.optimizer.iterations.numpy())
        if iterations != self._start_iterations + self._steps:
            self._fail(
                f"optimizer.iterations must count only this fit call's steps = {self._steps}. Found "
                f"{iterations} (restored by another callback?); the epsilon of this run is void."
            )

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        self._check_learning_rate()
        self._steps = int(self.model.optimizer.iterations.numpy()) - self._start_iterations

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None or self._steps == 0:
            return
        if logs is not None:
            logs["epsilon"] = self.epsilon

    def on_train_end(self, logs: dict | None = None) -> None:
        if self._template is None or self._failure is not None:
            return
        if getattr(self.model, "stop_training", False):
            planned = self._template.steps
            self._fail(
                "model.stop_training must stay False: a callback set it and stopped "
                f"training after {self._steps} of the {planned} planned steps. A stopping time chosen during "
                "training from the private data is not covered by the bounds, which assume a number of "
                "steps fixed in advance; the epsilon of this run is void. Choose the number of epochs "
                "before training. Found model.stop_training=True."
            )


# ---------------------------------------------------------------- the statement


def _steps_from_epochs(num_epochs: Any, steps_per_epoch: int) -> int:
    value = _number(num_epochs)
    if value is None or not (math.isfinite(value) and value > 0):
        raise ValueError(f"num_epochs must be a finite number > 0. Found {num_epochs!r}.")
    steps = value * steps_per_epoch
    if abs(steps - round(steps)) > 1e-9 * max(1.0, steps):
        raise ValueError(
            f"num_epochs * ceil(number_of_examples / batch_size) must be a whole number of steps "
            f"(ceil = {steps_per_epoch}). Found num_epochs={num_epochs!r}, i.e. {steps:g} steps."
        )
    return round(steps)


_SAMPLING_WORDS = {
    Sampling.CYCLIC: "cyclic: the same order and batches every epoch (Keras fit(shuffle=False))",
    Sampling.SHUFFLE_ONCE: "shuffle once: one secret random permutation, then cyclic over it",
    Sampling.RESHUFFLE: "reshuffle: a new random permutation every epoch (Keras fit(shuffle=True))",
    Sampling.RANDOM_BATCH: "random batch: a uniformly random batch of b examples every step",
    Sampling.POISSON: "Poisson: each example joins each step independently with probability b/n",
}

_RELATION_WORDS = {
    Relation.REPLACE_ONE: "replace-one adjacency (the two datasets have the same size and differ in one example)",
    Relation.ADD_OR_REMOVE_ONE: "add-or-remove-one adjacency (one dataset has one example more)",
}


def _fill(text: str) -> str:
    return textwrap.fill(text, width=80)


def _fill_item(text: str) -> str:
    return textwrap.fill(text, width=80, initial_indent="    - ", subsequent_indent="      ")


def _format_eps(value: float) -> str:
    return f"{value:12.3f}" if math.isfinite(value) else f"{'inf':>12}"


def compute_last_iterate_privacy_statement(
    *,
    number_of_examples: int,
    batch_size: int,
    num_epochs: float,
    noise_multiplier: float,
    delta: float,
    l2_norm_clip: float,
    learning_rate: float,
    sampling: str | Sampling,
    smoothness: float | None = None,
    weak_convexity: float = 0.0,
    strong_convexity: float = 0.0,
    diameter: float | None = None,
    gradient_norms_within_clip: bool = False,
) -> str:
    r"""A privacy report for the FINAL model of a DP-SGD run: the last-iterate
    counterpart of TF Privacy's ``compute_dp_sgd_privacy_statement``.

    It states the setup, the threat model (the final model only; TF Privacy's
    statement protects every checkpoint), the neighbouring relation, the loss
    assumptions with their constants, the epsilon of every applicable bound and
    the best, and TF Privacy's own statement as the baseline (computed with
    ``used_microbatching=False``: one example per microbatch, the only setting
    :class:`LastIterateCallback` accepts).

    Args:
      number_of_examples: n.
      batch_size: b.
      num_epochs: passes over the data; ``num_epochs * ceil(n/b)`` must be a whole number of steps.
      noise_multiplier: z.
      delta: the target delta.
      l2_norm_clip: C.
      learning_rate: eta, constant.
      sampling: what the pipeline did (see :class:`lastiter_plugins.Sampling`).
      smoothness, weak_convexity, strong_convexity, diameter, gradient_norms_within_clip: the loss assumptions.

    Returns:
      The statement, lines of at most 80 characters apart from the table rows.

    Raises:
      ValueError: invalid parameters, or no bound applies under either relation.
    """
    # Validate n, b, z, C, eta and the sampling with the library's checks before using them.
    shape = TrainingConfig(
        dataset_size=number_of_examples,
        batch_size=batch_size,
        noise_multiplier=noise_multiplier,
        steps=1,
        sampling=sampling,
        learning_rate=learning_rate,
        clip_norm=l2_norm_clip,
    )
    if shape.dataset_size % shape.batch_size:
        raise ValueError(
            f"batch_size must divide number_of_examples = {shape.dataset_size}: TF Privacy divides a short last "
            "batch by its own size, which the last-iterate bounds do not cover (see LastIterateCallback). "
            f"Found batch_size={shape.batch_size}."
        )
    steps = _steps_from_epochs(num_epochs, shape.steps_per_epoch)
    params: dict[str, Any] = dict(
        dataset_size=number_of_examples,
        batch_size=batch_size,
        noise_multiplier=noise_multiplier,
        clip_norm=l2_norm_clip,
        learning_rate=learning_rate,
        steps=steps,
        sampling=sampling,
        smoothness=smoothness,
        weak_convexity=weak_convexity,
        strong_convexity=strong_convexity,
        diameter=diameter,
        gradient_norms_within_clip=gradient_norms_within_clip,
    )
    delta = validate_delta(delta)
    sections: dict[Relation, tuple[list[tuple[str, EpsilonResult]], EpsilonResult, list[str]]] = {}
    for relation in Relation:
        checks = applicable_bounds(relation=relation, **params)
        rows = [(bid, account(bid, delta, relation=relation, **params)) for bid in BOUNDS if checks[bid].applies]
        if rows:
            best = account(BEST, delta, relation=relation, **params)
            missing = [f"{bid}: {checks[bid].reason}" for bid in BOUNDS if not checks[bid].applies]
            sections[relation] = (rows, best, missing)
    config = shape.replace(steps=steps)
    assumptions = LossAssumptions(
        smoothness=smoothness,
        weak_convexity=weak_convexity,
        strong_convexity=strong_convexity,
        diameter=diameter,
        gradient_norms_within_clip=gradient_norms_within_clip,
    )
    if not sections:
        raise ValueError(
            f"no bound applies to sampling={config.sampling.value} under either neighbouring relation; "
            "see lastiter_plugins.applicable_bounds for the reasons."
        )

    n, b, per_epoch = config.dataset_size, config.batch_size, config.steps_per_epoch
    paragraphs = [
        _fill(
            f"DP-SGD (plain SGD, constant learning rate {config.learning_rate:g}) performed over {n} examples "
            f"with {b} examples per iteration ({per_epoch} iterations per epoch"
            + f"), clipping norm {config.clip_norm:g} per example (one example per microbatch), noise "
            f"multiplier {config.noise_multiplier:g}, for {num_epochs:g} epochs = {steps} iterations. "
            f"Sampling: {_SAMPLING_WORDS[config.sampling]}."
        ),
        _fill(
            "This privacy guarantee protects the release of the FINAL model only. It does not protect "
            "intermediate checkpoints, models evaluated or published during training, or anything "
            "computed from them: they must stay private. (TF Privacy's statement below protects the "
            "release of all model checkpoints in addition to the final model, with different numbers; "
            "the 'composition' rows below also protect every iterate.) It covers the model after the "
            f"{steps} iterations stated, a number fixed before training: a stopping time chosen from the "
            "private data (early stopping on a training or validation metric) and a model selected among "
            "intermediate iterates (restoring the best weights, releasing the best checkpoint) are not "
            "covered."
        ),
        _assumptions_paragraph(assumptions, config.clip_norm),
    ]
    for relation, (rows, best, missing) in sections.items():
        head = _fill(
            f"Example-level DP with {_RELATION_WORDS[relation]} at delta = {delta:g}, Renyi-DP accounting "
            "(lastiter-plugins):"
        )
        lines = [head]
        for bid, result in rows:
            what = "every iterate" if not BOUNDS[bid].last_iterate else "final model"
            lines.append(f"    {bid:<28}{_format_eps(result.epsilon)}   ({what}; {BOUNDS[bid].reference})")
        lines.append(f"    {'best':<28}{_format_eps(best.epsilon)}   (via {best.winner}; protects {best.protects})")
        if missing:
            lines.append("  Not applicable here:")
            lines.extend(
                textwrap.fill(m, width=80, initial_indent="    - ", subsequent_indent="      ") for m in missing
            )
        paragraphs.append("\n".join(lines))
    for relation in Relation:
        if relation not in sections:
            paragraphs.append(
                _fill(f"No bound covers sampling={config.sampling.value} under {_RELATION_WORDS[relation]}.")
            )
    baseline = _tfp_statement.compute_dp_sgd_privacy_statement(
        number_of_examples=n,
        batch_size=b,
        num_epochs=float(num_epochs),
        noise_multiplier=config.noise_multiplier,
        delta=delta,
        used_microbatching=False,
    )
    paragraphs.append(
        _fill(
            "Baseline: TF Privacy's compute_dp_sgd_privacy_statement (tensorflow-privacy 0.9, "
            "used_microbatching=False). Its numbers use add-or-remove-one adjacency and protect every "
            "checkpoint; they are not comparable with the replace-one numbers above without care (a "
            "replace-one change is one removal plus one addition). Its Poisson line assumes Poisson sampling, "
            "which Keras fit does not perform."
        )
        + "\n\n"
        + "\n".join(f"  | {line}".rstrip() for line in baseline.rstrip("\n").split("\n"))
    )
    return "\n\n".join(paragraphs) + "\n"


def _assumptions_paragraph(a: LossAssumptions, clip_norm: float) -> str:
    parts = []
    parts.append("not declared" if a.smoothness is None else f"M = {a.smoothness:g} (every per-example loss M-smooth)")
    convexity = (
        f"lam = {a.strong_convexity:g} (strongly convex)"
        if a.strong_convexity > 0
        else ("convex (m = 0)" if a.weak_convexity == 0 else f"m = {a.weak_convexity:g} (m-weakly convex)")
    )
    domain = "no projection" if a.diameter is None else f"projection onto a convex set of diameter D = {a.diameter:g}"
    clipping = (
        "clipping may be active"
        if a.clipping_may_be_active
        else f"clipping declared inactive: every per-example gradient norm <= C = {clip_norm:g} on the whole domain"
    )
    return _fill(
        "Assumptions declared by the trainer (the guarantee holds only if they do, for the per-example "
        f"loss actually optimised, on both neighbouring datasets): smoothness {parts[0]}; {convexity}; "
        f"{domain}; {clipping}."
    )
