r"""Everything the TF Privacy adapter reads from (or wraps in) host internals, in one place.

Keras 2.14 gives callbacks no batch size, no ``shuffle`` flag and no view of
the compiled training step; TF Privacy 0.9 keeps the clipping norm and the
noise in private attributes. This module is the only one that touches them:

* :func:`running_fit` reads (never writes) the ``DataHandler`` and the
  ``CallbackList`` that the running ``Model.fit`` keeps as local variables;
* :func:`optimizer_facts` reads the DP optimizer's private attributes;
* :class:`StepProbe` wraps ``model.train_step`` and the DP optimizer's
  ``_compute_gradients`` / ``apply_gradients`` on the instances (restored by
  ``remove``) so that the compiled step itself records, every step, what it
  did: rows in the batch, length of the loss vector, clip norm and noise std
  it used, the variables it differentiated, whether anything but the DP update
  changed the weights inside the step, and where the step started.

:func:`check_host` refuses (``UnsupportedHostError``) any version other than
the tested ones: tensorflow 2.14.x (Keras 2.14.x) and tensorflow-privacy 0.9.0.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from lastiter_plugins.errors import UnsupportedHostError

TESTED = {"tensorflow": "2.14.", "keras": "2.14.", "tensorflow-privacy": "0.9.0"}


def _installed(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _host_versions() -> dict[str, str]:
    return {name: _installed(name) for name in TESTED}


_VERSIONS = _host_versions()
_IMPORT_ERROR: str | None = None
try:
    from keras.src.engine import data_adapter as _keras_data_adapter
    from keras.src.layers.normalization.batch_normalization import BatchNormalizationBase as _BatchNormBase
    from tensorflow_privacy.privacy.dp_query.gaussian_query import GaussianSumQuery as _GaussianSumQuery
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras import GenericDPSGDOptimizer as _GenericDPSGD
    from tensorflow_privacy.privacy.optimizers.dp_optimizer_keras_vectorized import (
        VectorizedDPKerasSGDOptimizer as _VectorizedDPSGD,
    )
except ImportError as error:  # pragma: no cover - another host version
    _IMPORT_ERROR = str(error)


def check_host() -> None:
    """Refuse a TF / Keras / TF Privacy version whose internals this module was not tested with.

    Raises:
      UnsupportedHostError: naming the versions found and the tested ones.
    """
    wrong = [
        n
        for n, v in _VERSIONS.items()
        if not (v == TESTED[n] if n == "tensorflow-privacy" else v.startswith(TESTED[n]))
    ]
    if wrong or _IMPORT_ERROR is not None:
        found = ", ".join(f"{n} {v}" for n, v in _VERSIONS.items())
        raise UnsupportedHostError(
            "the TF Privacy adapter reads Keras' fit internals and TF Privacy's optimizer attributes, and was tested "
            "with tensorflow 2.14.x (Keras 2.14.x) and tensorflow-privacy 0.9.0 only; another version may keep "
            "them elsewhere, so nothing it read could be trusted. Install the tested versions "
            "(pip install 'lastiter-plugins[tf]') or compute the epsilon with lastiter_plugins.compute_epsilon "
            f"from your own verified settings. Found {found}"
            + (f" (import failed: {_IMPORT_ERROR})." if _IMPORT_ERROR else ".")
        )


# ---------------------------------------------------------------- the model


def batch_mixing_layers(model: Any) -> list[str]:
    """Names of layers that couple the examples of a batch (BatchNormalization, SyncBatchNormalization, the
    tf.compat.v1 layer: every subclass of Keras' BatchNormalizationBase)."""
    return [m.name for m in model.submodules if isinstance(m, _BatchNormBase)]


# ---------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerFacts:
    """Raw settings of a TF Privacy DP-SGD optimizer (private attributes, read only)."""

    kind: str | None  # "DPKerasSGDOptimizer", "VectorizedDPKerasSGDOptimizer" or None (not DP-SGD)
    query: str | None  # the DP query's class name (generic optimizer), None when not a GaussianSumQuery
    clip: Any
    noise_multiplier: Any
    num_microbatches: Any
    accumulation: int
    momentum: Any
    uses_momentum: bool
    nesterov: bool
    decay: float
    keras_clipping: dict[str, Any]
    gradient_transformers: Any
    learning_rate: Any  # the raw hyperparameter: a number, a tf.Variable, a schedule or a callable


def optimizer_facts(optimizer: Any) -> OptimizerFacts:
    """What the DP optimizer will do (TF Privacy 0.9 private attributes)."""
    if isinstance(optimizer, _VectorizedDPSGD):
        kind, query = "VectorizedDPKerasSGDOptimizer", None
        # The compiled step draws noise of std float32(C * z) (tf.random.normal) and clips at float32(C).
        clip = _float32(optimizer._l2_norm_clip)
        std = _float32(_product(optimizer._l2_norm_clip, optimizer._noise_multiplier))
        noise, accumulation = (std / clip if clip and std is not None else None), 1
    elif isinstance(optimizer, _GenericDPSGD):
        kind = "DPKerasSGDOptimizer"
        q = optimizer._dp_sum_query
        query = type(q).__name__ if type(q) is _GaussianSumQuery else None
        state = optimizer._global_state  # what the compiled step reads (GaussianSumQuery's global state)
        clip = state.l2_norm_clip if query else None
        noise = value_of(state.stddev) / value_of(clip) if query and value_of(clip) else None
        accumulation = optimizer.gradient_accumulation_steps
    else:
        return OptimizerFacts(None, None, None, None, None, 1, 0.0, False, False, 0.0, {}, None, None)
    return OptimizerFacts(
        kind=kind,
        query=query if kind == "DPKerasSGDOptimizer" else "vectorized",
        clip=clip,
        noise_multiplier=noise,
        num_microbatches=optimizer._num_microbatches,
        accumulation=accumulation,
        momentum=optimizer._hyper.get("momentum"),
        uses_momentum=bool(optimizer._momentum),
        nesterov=bool(optimizer.nesterov),
        decay=float(optimizer._initial_decay),
        keras_clipping={n: getattr(optimizer, n, None) for n in ("clipnorm", "clipvalue", "global_clipnorm")},
        gradient_transformers=optimizer.gradient_transformers,
        learning_rate=optimizer._hyper.get("learning_rate"),
    )


def _float32(x: Any) -> float | None:
    v = value_of(x)
    return None if v is None else float(np.float32(v))


def _product(a: Any, b: Any) -> float | None:
    va, vb = value_of(a), value_of(b)
    return None if va is None or vb is None else va * vb


def current_learning_rate(optimizer: Any) -> Any:
    """The raw learning-rate hyperparameter the next step will read."""
    return optimizer._hyper.get("learning_rate")


def value_of(x: Any) -> float | None:
    if x is None:
        return None
    if isinstance(x, (tf.Variable, tf.Tensor)):
        return float(x.numpy()) if x.shape.rank == 0 else None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------- fit


_FIT_CODE = inspect.unwrap(tf.keras.Model.fit).__code__


@dataclasses.dataclass(frozen=True)
class FitFacts:
    """What the running ``Model.fit`` will do with the data (its DataHandler, read only)."""

    in_memory: bool
    adapter: str
    weighted: bool
    batch_size: int
    num_batches: int
    partial_batch_size: int
    inferred_steps: int | None
    shuffle: Any
    epochs: int
    steps_per_execution: int  # 0: tuned at run time
    callbacks: tuple[Any, ...]


def running_fit(model: Any) -> FitFacts | None:
    """The running ``Model.fit`` call of ``model`` (Keras 2.14 locals), or None when there is none."""
    frame = inspect.currentframe()
    found = None
    try:
        while frame is not None:
            if frame.f_code is _FIT_CODE and frame.f_locals.get("self") is model:
                found = dict(frame.f_locals)
                break
            frame = frame.f_back
    finally:
        del frame
    if found is None or "data_handler" not in found or "callbacks" not in found:
        return None
    handler = found["data_handler"]
    adapter = handler._adapter
    in_memory = type(adapter) is _keras_data_adapter.TensorLikeDataAdapter
    per_execution = handler._steps_per_execution
    per_execution = int(per_execution.numpy()) if per_execution is not None else 1
    if getattr(model, "enable_tune_steps_per_execution", False):
        per_execution = 0
    callback_list = found["callbacks"]
    return FitFacts(
        in_memory=in_memory,
        adapter=type(adapter).__name__,
        weighted=found.get("sample_weight") is not None or found.get("class_weight") is not None,
        batch_size=int(adapter.batch_size()) if in_memory else 0,
        num_batches=int(adapter.get_size()) if in_memory else 0,
        partial_batch_size=int(adapter._partial_batch_size) if in_memory else 0,
        inferred_steps=handler.inferred_steps,
        shuffle=adapter._shuffle if in_memory else None,
        epochs=int(handler._epochs) - int(handler._initial_epoch),
        steps_per_execution=per_execution,
        callbacks=tuple(getattr(callback_list, "callbacks", callback_list) or ()),
    )


# ---------------------------------------------------------------- the step probe

# Slots of the probe vector (one float64 variable, read once per step).
STEPS, DP_CALLS, ROWS, LOSS_LENGTH, CLIP, NOISE_STD, TAMPERED, START_DISTANCE, MOVED = range(9)
_SLOTS = 9


@dataclasses.dataclass(frozen=True)
class Ball:
    """The projection ball the step must start in (center per trainable variable, radius, tolerance)."""

    center: Sequence[Any]
    radius: float  # the projection's radius: where the projection puts an iterate that left the ball
    margin: float  # the projection scales to radius * margin


class StepProbe:
    """Instruments one model's compiled training step (instance-level wrappers, removed by :meth:`remove`).

    Per step, the compiled step writes into one float64 vector: the number of
    ``train_step`` calls, of DP gradient computations, the rows of the batch,
    the length of the loss vector the DP optimizer splits into microbatches,
    the clip norm and the noise std (on the clipped sum) it used, a flag set
    when the weights changed inside the step other than by the DP update, the
    distance of the starting point from the projection center, and the distance
    between the starting point and the previous step's end (projected when a
    ball is given).
    """

    def __init__(self, model: Any, optimizer: Any, ball: Ball | None) -> None:
        self.model, self.optimizer, self.ball = model, optimizer, ball
        self.values = tf.Variable(tf.zeros([_SLOTS], tf.float64), trainable=False, name="lastiter_probe")
        self.mirror_valid = tf.Variable(False, trainable=False, name="lastiter_mirror_valid")
        self.trainable = list(model.trainable_variables)
        self.mirror = [tf.Variable(v, trainable=False, name="lastiter_mirror") for v in self.trainable]
        self.dp_variables: list[Any] | None = None  # what the DP optimizer differentiated (trace time)
        self._saved: dict[tuple[Any, str], Any] = {}
        self._snapshot: list[Any] | None = None
        self._wrap(model, "train_step", self._train_step)
        self._wrap(optimizer, "_compute_gradients", self._compute_gradients)
        self._wrap(optimizer, "apply_gradients", self._apply_gradients)

    def _wrap(self, obj: Any, name: str, make: Any) -> None:
        original = getattr(obj, name)
        self._saved[(obj, name)] = obj.__dict__.get(name, _MISSING)
        object.__setattr__(obj, name, make(original))

    def remove(self) -> None:
        for (obj, name), before in self._saved.items():
            if before is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, before)
        self._saved = {}

    def read(self) -> list[float]:
        return [float(v) for v in self.values.numpy()]

    def reset(self) -> None:
        self.values.assign(tf.zeros([_SLOTS], tf.float64))
        self.mirror_valid.assign(False)

    # -- in-graph helpers --------------------------------------------------------

    def _watched(self) -> list[Any]:
        """Float model weights (trainable and not); integer states (random generators) are left out."""
        return [w for w in self.model.weights if w.dtype.is_floating]

    def _set(self, slot: int, value: Any) -> None:
        self.values[slot].assign(tf.cast(value, tf.float64))

    def _add(self, slot: int, value: Any) -> None:
        self.values[slot].assign(self.values[slot] + tf.cast(value, tf.float64))

    def _flag_if_changed(self, before: list[Any]) -> None:
        changed = tf.reduce_any(
            [tf.reduce_any(tf.not_equal(w, b)) for w, b in zip(self._watched(), before, strict=True)]
        )
        self._add(TAMPERED, tf.cast(changed, tf.float64))

    def _distance(self, weights: Sequence[Any], points: Sequence[Any]) -> Any:
        squares = [
            tf.reduce_sum(tf.square(tf.cast(w, tf.float64) - tf.cast(p, tf.float64)))
            for w, p in zip(weights, points, strict=True)
        ]
        return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0, tf.float64)

    def _train_step(self, original: Any) -> Any:
        def train_step(data: Any) -> Any:
            rows = tf.shape(tf.nest.flatten(data)[0])[0]
            self._add(STEPS, 1.0)
            self._set(ROWS, rows)
            start = [tf.identity(w) for w in self.trainable]
            if self.ball is not None:
                self._set(START_DISTANCE, self._distance(start, self.ball.center))
            expected = [tf.cast(m, tf.float64) for m in self.mirror]
            if self.ball is not None:  # the projection between steps is the one allowed change
                d = self._distance(self.mirror, self.ball.center)
                scale = tf.minimum(
                    tf.constant(1.0, tf.float64), self.ball.radius * self.ball.margin / tf.maximum(d, 1e-300)
                )
                expected = [
                    tf.cast(c, tf.float64) + (m - tf.cast(c, tf.float64)) * scale
                    for m, c in zip(expected, self.ball.center, strict=True)
                ]
            moved = self._distance(start, expected)
            self._set(MOVED, tf.where(self.mirror_valid, moved, tf.constant(0.0, tf.float64)))
            self._snapshot = [tf.identity(w) for w in self._watched()]
            self._after_update = self._snapshot  # replaced by apply_gradients when the DP update runs
            outputs = original(data)
            self._flag_if_changed(self._after_update)
            for m, w in zip(self.mirror, self.trainable, strict=True):
                m.assign(w)
            self.mirror_valid.assign(True)
            return outputs

        return train_step

    def _compute_gradients(self, original: Any) -> Any:
        optimizer = self.optimizer

        def compute_gradients(loss, var_list, grad_loss=None, tape=None):
            if isinstance(optimizer, _VectorizedDPSGD):
                clip = tf.cast(tf.cast(optimizer._l2_norm_clip, tf.float32), tf.float64)
                std = tf.cast(tf.cast(optimizer._l2_norm_clip * optimizer._noise_multiplier, tf.float32), tf.float64)
            else:
                clip = tf.cast(optimizer._global_state.l2_norm_clip, tf.float64)
                std = tf.cast(optimizer._global_state.stddev, tf.float64)
            self._add(DP_CALLS, 1.0)
            self._set(CLIP, clip)
            self._set(NOISE_STD, std)
            length = tf.shape(loss)[0] if not callable(loss) else -1
            self._set(LOSS_LENGTH, length)
            result = original(loss, var_list, grad_loss=grad_loss, tape=tape)
            self.dp_variables = [v for _, v in result]
            return result

        return compute_gradients

    def _apply_gradients(self, original: Any) -> Any:
        def apply_gradients(*args: Any, **kwargs: Any) -> Any:
            if self._snapshot is not None:
                self._flag_if_changed(self._snapshot)  # nothing but the DP update before it
            result = original(*args, **kwargs)
            self._after_update = [tf.identity(w) for w in self._watched()]
            return result

        return apply_gradients


_MISSING = object()


def finite_positive(value: Any) -> float | None:
    """A Python float when ``value`` is a finite number > 0 (number, 0-d tensor or variable), else None."""
    if isinstance(value, bool):
        return None
    v = value_of(value)
    return v if v is not None and math.isfinite(v) and v > 0 else None
