r"""Observation: what ``fit`` was called with and what each step used, read from the host; nothing is
judged here (:mod:`._derive` derives the pipeline from these facts and compares).

Keras 2.14 gives callbacks no batch size, no ``shuffle`` flag and no view of
the compiled training step; TF Privacy 0.9 keeps the clipping norm and the
noise in private attributes. This module is the only one that touches them,
behind :func:`check_host`, which refuses (``UnsupportedHostError``) any
version other than the tested ones: tensorflow 2.14.x (Keras 2.14.x) and
tensorflow-privacy 0.9.0.

* :func:`running_fit` reads (never writes) the ``DataHandler`` and the
  ``CallbackList`` that the running ``Model.fit`` keeps as local variables:
  :class:`FitFacts`, what fit was called with;
* :func:`optimizer_facts` reads the DP optimizer's private attributes:
  :class:`OptimizerFacts`;
* :class:`StepProbe` wraps ``model.train_step`` and the DP optimizer's
  ``_compute_gradients`` / ``apply_gradients`` on the instances (restored by
  ``remove``) so that the compiled step itself records, every step, one row of
  what it used (:class:`StepTable`, read as :class:`StepFacts`): rows in the
  batch, the loss weights fed, length of the loss vector, clip norm, noise std
  and learning rate as used (tf.Variable-backed values included), the
  optimizer's step count, whether anything but the DP update changed a weight
  inside the step, and where the step started; the host reads the rows in one
  transfer when it checks them, never per batch;
* :func:`host_facts` reads what the step cannot see (:class:`HostFacts`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
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
#: The families of TF Privacy's DP Keras optimizers (``OptimizerFacts.family``).
GENERIC, VECTORIZED, SPARSE = "generic", "vectorized", "sparse"
try:
    from keras.src.engine import data_adapter as _keras_data_adapter
    from keras.src.layers.normalization.batch_normalization import BatchNormalizationBase as _BatchNormBase
    from tensorflow_privacy.privacy.dp_query.gaussian_query import GaussianSumQuery as _GaussianSumQuery
    from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras as _generic
    from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras_sparse as _sparse
    from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras_vectorized as _vectorized

    # TF Privacy 0.9's DP Keras optimizers, by family, each the DP subclass of a legacy Keras optimizer
    # (SGD, Adam, Adagrad): the generic ones take a DP query (DPKeras*Optimizer builds a GaussianSumQuery and
    # noises in _compute_gradients), the vectorized ones noise in _compute_gradients, the sparse ones clip in
    # _compute_gradients and noise each variable's mean gradient in apply_gradients.
    _FAMILIES: dict[str, tuple[tuple[str, Any], ...]] = {
        GENERIC: tuple((base, getattr(_generic, f"GenericDP{base}Optimizer")) for base in ("SGD", "Adam", "Adagrad")),
        VECTORIZED: tuple(
            (base, getattr(_vectorized, f"VectorizedDPKeras{base}Optimizer")) for base in ("SGD", "Adam", "Adagrad")
        ),
        SPARSE: tuple((base, getattr(_sparse, f"DPSparseKeras{base}Optimizer")) for base in ("SGD", "Adam", "Adagrad")),
    }
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
            "(pip install 'lastiter-plugins[tf]') or compute the epsilon with lastiter_plugins.epsilon "
            f"from your own verified settings. Found {found}"
            + (f" (import failed: {_IMPORT_ERROR})." if _IMPORT_ERROR else ".")
        )


# ---------------------------------------------------------------- the model


def batch_mixing_layers(model: Any) -> list[str]:
    """Names of the batch-normalization layers (every subclass of Keras' BatchNormalizationBase:
    BatchNormalization, SyncBatchNormalization, the tf.compat.v1 layer) that may run in training mode in fit,
    where they couple the examples of a batch and update their moving statistics from it.

    A layer is frozen, and left out, when Keras 2.14 runs it in inference mode whatever fit passes: a v2 layer
    (``_USE_V2_BEHAVIOR``, private) with ``trainable=False`` (``_get_training_value`` then forces
    ``training=False``), or a layer every one of whose calls in the model's graph was made with
    ``training=False`` (the node's ``call_kwargs``; a subclassed model's calls are not in a graph: not frozen).
    """
    return [m.name for m in model.submodules if isinstance(m, _BatchNormBase) and not _frozen(m)]


def _frozen(layer: Any) -> bool:
    if not layer.trainable and getattr(layer, "_USE_V2_BEHAVIOR", False) is True:
        return True
    nodes = list(getattr(layer, "_inbound_nodes", ()))
    return bool(nodes) and all(node.call_kwargs.get("training", None) is False for node in nodes)


def adapted_layers(model: Any) -> list[str]:
    """Names of the layers whose state was fitted to data by ``adapt`` (``is_adapted`` true: Normalization,
    Discretization, TextVectorization, StringLookup, IntegerLookup, any PreprocessingLayer, found by the
    attribute, not the class)."""
    return [m.name for m in model.submodules if getattr(m, "is_adapted", False) is True]


def keras_train_steps(model: Any) -> int:
    """The training steps Keras counted on the model in this process (its private ``_train_counter``, Keras
    2.14): every ``train_on_batch`` and every step of a ``fit`` adds one, ``compile`` keeps it, and ``fit``
    sets it to 0 only after building its callback list, so a callback's ``set_model`` still reads the count of
    the training before that fit. 0 for a model without the counter."""
    counter = getattr(model, "_train_counter", None)
    return 0 if counter is None else int(counter.numpy())


# ---------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerFacts:
    """Raw settings of a TF Privacy DP Keras optimizer (private attributes, read only)."""

    name: str | None  # "DPKerasAdamOptimizer", "VectorizedDPKerasSGDOptimizer", ...; None: not a DP Keras optimizer
    family: str | None  # GENERIC, VECTORIZED or SPARSE
    base: str | None  # the Keras update it applies to the noised gradient: "SGD", "Adam" or "Adagrad"
    query: str | None  # the DP query's class name (generic family), None when not a GaussianSumQuery
    clip: Any
    noise_multiplier: Any
    num_microbatches: Any
    accumulation: int
    momentum: Any  # SGD's momentum (None for Adam and Adagrad)
    uses_momentum: bool
    nesterov: bool
    decay: float
    keras_clipping: dict[str, Any]
    gradient_transformers: Any
    learning_rate: Any  # the raw hyperparameter: a number, a tf.Variable, a schedule or a callable


def _family(optimizer: Any) -> tuple[str, str] | None:
    for family, classes in _FAMILIES.items():
        for base, cls in classes:
            if isinstance(optimizer, cls):
                return family, base
    return None


def optimizer_facts(optimizer: Any) -> OptimizerFacts:
    """What the DP optimizer will do (TF Privacy 0.9 private attributes)."""
    found = _family(optimizer)
    if found is None:
        return OptimizerFacts(None, None, None, None, None, None, None, 1, None, False, False, 0.0, {}, None, None)
    family, base = found
    if family == GENERIC:
        name, q = f"DPKeras{base}Optimizer", optimizer._dp_sum_query
        query = type(q).__name__ if type(q) is _GaussianSumQuery else None
        state = optimizer._global_state  # what the compiled step reads (GaussianSumQuery's global state)
        clip = state.l2_norm_clip if query else None
        clip_value = value_of(clip)
        stddev = value_of(state.stddev) if query and clip_value else None  # a GaussianSumQuery's state only
        noise = stddev / clip_value if stddev is not None and clip_value else None
    else:
        name = f"VectorizedDPKeras{base}Optimizer" if family == VECTORIZED else f"DPSparseKeras{base}Optimizer"
        query = family
        # The compiled step draws noise of std float32(C * z) on the sum (the sparse family: on the mean, std
        # float32(C * z) / k) and clips at float32(C).
        clip = _float32(optimizer._l2_norm_clip)
        std = _float32(_product(optimizer._l2_norm_clip, optimizer._noise_multiplier))
        noise = std / clip if clip and std is not None else None
    return OptimizerFacts(
        name=name,
        family=family,
        base=base,
        query=query,
        clip=clip,
        noise_multiplier=noise,
        num_microbatches=optimizer._num_microbatches,
        accumulation=int(getattr(optimizer, "gradient_accumulation_steps", 1)),
        momentum=optimizer._hyper.get("momentum") if base == "SGD" else None,
        uses_momentum=bool(getattr(optimizer, "_momentum", False)),
        nesterov=bool(getattr(optimizer, "nesterov", False)),
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

#: What fit does with the examples' order across epochs (``FitFacts.order``; ``ONCE``: one uniform
#: permutation drawn in the first epoch and kept, which a tf.data pipeline can do, see ``_tfdata``).
FIXED, PERMUTATION, BATCH_ORDER, ONCE = "fixed", "permutation", "batch order", "permutation once"
#: A :class:`RandomAllocationDataset`'s order: a fresh random allocation every epoch (its batches padded).
ALLOCATION = "random allocation"


@dataclasses.dataclass(frozen=True)
class FitFacts:
    """What the running ``Model.fit`` will do with the data (its DataHandler, read only)."""

    in_memory: bool
    adapter: str
    sample_weight: Any  # fit's sample_weight argument (None when none was given)
    class_weight: Any  # fit's class_weight argument (None when none was given)
    batch_size: int
    num_batches: int
    partial_batch_size: int
    inferred_steps: int | None
    shuffle: Any  # fit's shuffle argument (as the adapter stored it)
    order: str | None  # FIXED, PERMUTATION (a new uniform permutation every epoch) or BATCH_ORDER
    epochs: int  # epochs - initial_epoch
    initial_epoch: int
    steps_per_execution: int  # 0: tuned at run time
    callbacks: tuple[Any, ...]
    dataset: Any  # a tf.data.Dataset given as x (None for other inputs)
    validation_split: float  # fit's validation_split (part of the private data)
    validation_data: Any  # fit's validation_data (data the user may declare public; None when none was given)


def _in_memory(adapter: Any, shuffle: Any) -> tuple[int, int, int, Any, str] | None:
    """(batch size, batches, partial batch size, shuffle, order) of an in-memory adapter of Keras 2.14, else None.

    * ``TensorLikeDataAdapter`` (arrays, tensors, pandas; lists of arrays) and ``ListsOfScalarsDataAdapter``
      (Python lists, batched by an inner TensorLikeDataAdapter): ``shuffle=True`` draws a new
      ``tf.random.shuffle`` permutation of all indices every epoch, ``False`` keeps the order, ``"batch"``
      keeps consecutive batches and shuffles their order (and the rows within each);
    * ``CompositeTensorDataAdapter`` (RaggedTensor, SparseTensor, scipy sparse): any true ``shuffle``
      (``"batch"`` included) is ``dataset.shuffle(num_samples)``, a buffer holding every example, which
      draws a uniform permutation, and the dataset is iterated afresh every epoch
      (``reshuffle_each_iteration``); a false one keeps the order.
    """
    if type(adapter) is _keras_data_adapter.ListsOfScalarsDataAdapter:
        adapter = adapter._internal_adapter
    if type(adapter) is _keras_data_adapter.TensorLikeDataAdapter:
        stored = adapter._shuffle
        order = BATCH_ORDER if stored == "batch" else (PERMUTATION if stored else FIXED)
        partial = int(adapter._partial_batch_size)
    elif type(adapter) is _keras_data_adapter.CompositeTensorDataAdapter:
        stored = shuffle.lower() if isinstance(shuffle, str) else shuffle
        order = PERMUTATION if stored else FIXED
        partial = int(adapter._partial_batch_size or 0)
    else:
        return None
    return int(adapter.batch_size()), int(adapter.get_size()), partial, stored, order


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
    read = _in_memory(adapter, found.get("shuffle"))
    per_execution = handler._steps_per_execution
    per_execution = int(per_execution.numpy()) if per_execution is not None else 1
    if getattr(model, "enable_tune_steps_per_execution", False):
        per_execution = 0
    callback_list = found["callbacks"]
    batch_size, num_batches, partial, shuffle, order = read if read is not None else (0, 0, 0, None, None)
    return FitFacts(
        in_memory=read is not None,
        adapter=type(adapter).__name__,
        sample_weight=found.get("sample_weight"),
        class_weight=found.get("class_weight"),
        batch_size=batch_size,
        num_batches=num_batches,
        partial_batch_size=partial,
        inferred_steps=handler.inferred_steps,
        shuffle=shuffle,
        order=order,
        epochs=int(handler._epochs) - int(handler._initial_epoch),
        initial_epoch=int(handler._initial_epoch),
        steps_per_execution=per_execution,
        callbacks=tuple(getattr(callback_list, "callbacks", callback_list) or ()),
        dataset=adapter._dataset if type(adapter) is _keras_data_adapter.DatasetAdapter else None,
        validation_split=float(found.get("validation_split") or 0.0),
        validation_data=found.get("validation_data"),
    )


def compiled_loss_weights(model: Any) -> Any:
    """The ``loss_weights`` given to ``model.compile`` (None when none were)."""
    container = getattr(model, "compiled_loss", None)
    return getattr(container, "_user_loss_weights", None)


def rows_of(batch_part: Any) -> Any:
    """The number of examples in one (possibly ragged or sparse) input tensor, in graph."""
    if isinstance(batch_part, tf.RaggedTensor):
        return batch_part.nrows()
    if isinstance(batch_part, tf.SparseTensor):
        return batch_part.dense_shape[0]
    return tf.shape(batch_part)[0]


# ---------------------------------------------------------------- the per-step record


class StepTable:
    """One row of float64 facts per step, written by the compiled step, read by the host once per check.

    The step fills a row (``begin`` resets it, ``set``/``add``/``minimum``/``maximum`` write slots, ``end``
    stores it); the host reads the whole table in one transfer (``read``). Row 0 holds the number of steps
    recorded; step k (1-based) is stored in row 1 + (k - 1) mod ``capacity``, so the host must read at least
    once every ``capacity`` steps (it does at every epoch end, with capacity = the steps of an epoch), and
    knows when it did not (``StepRecord.lost``).
    """

    def __init__(self, slots: int, capacity: int, name: str, initial: npt.ArrayLike | None = None) -> None:
        self.capacity = int(capacity)
        self.initial = np.zeros(slots) if initial is None else np.asarray(initial, np.float64)
        self.table = tf.Variable(tf.zeros([self.capacity + 1, slots], tf.float64), trainable=False, name=name)
        self.row = tf.Variable(self.initial, dtype=tf.float64, trainable=False, name=f"{name}_row")

    # -- in graph (called while the step is traced)
    def begin(self) -> Any:
        """Start the row of a new step; returns the step's number (1-based)."""
        self.row.assign(self.initial)
        count = self.table[0, 0] + 1.0
        self.table[0, 0].assign(count)
        return count

    def set(self, slot: int, value: Any) -> None:
        self.row[slot].assign(tf.cast(value, tf.float64))

    def add(self, slot: int, value: Any) -> None:
        self.row[slot].assign(self.row[slot] + tf.cast(value, tf.float64))

    def maximum(self, slot: int, value: Any) -> None:
        self.row[slot].assign(tf.maximum(self.row[slot], tf.cast(value, tf.float64)))

    def minimum(self, slot: int, value: Any) -> None:
        self.row[slot].assign(tf.minimum(self.row[slot], tf.cast(value, tf.float64)))

    def end(self) -> None:
        """Store the row of the step begun last."""
        index = 1 + (tf.cast(self.table[0, 0], tf.int64) - 1) % self.capacity
        self.table.scatter_nd_update(tf.reshape(index, [1, 1]), tf.reshape(self.row, [1, -1]))

    # -- on the host
    def read(self) -> StepRecord:
        return StepRecord(self.table.numpy(), self.capacity)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """The host's copy of a :class:`StepTable`."""

    values: np.ndarray
    capacity: int

    @property
    def steps(self) -> int:
        """Steps recorded so far."""
        return int(self.values[0, 0])

    def lost(self, checked: int) -> bool:
        """Whether rows after step ``checked`` were overwritten before this read."""
        return self.steps - checked > self.capacity

    def row(self, k: int) -> np.ndarray:
        """The facts of step ``k`` (1-based), valid while not :meth:`lost`."""
        return self.values[1 + (k - 1) % self.capacity]


# ---------------------------------------------------------------- the step probe

# Slots of a step's row (see StepProbe).
STEP, DP_CALLS, ROWS, LOSS_LENGTH, CLIP, NOISE_STD, LEARNING_RATE, ITERATIONS = range(8)
TAMPERED, START_DISTANCE, MOVED, OTHERS_MOVED, WEIGHT_OFF_ONE = range(8, 13)
WEIGHT_SUM, WEIGHT_OFF_BINARY, PADDING_LOSS, REGULARIZERS = range(13, 17)
_SLOTS = 17


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What one step used, as its compiled step recorded it (one row of :class:`StepTable`)."""

    step: int  # the step's number (1-based) as the table counted it
    dp_calls: float  # DP gradient computations the step ran
    rows: int  # examples in the batch
    loss_length: int  # entries of the loss vector the DP optimizer clipped one by one
    clip: float  # the clip norm it used
    noise_std: float  # the noise std on the clipped sum it used
    learning_rate: float  # the rate its update read
    iterations: float  # optimizer.iterations when it started
    tampered: bool  # a weight changed inside the step other than by the DP update
    start_distance: float  # distance of its start from the projection center (0 without a ball)
    moved: float  # distance of its start from the previous step's end (projected, with a ball)
    others_moved: bool  # a non-trainable weight changed between the previous step and this one
    weight_off_one: float  # the largest |w - 1| of the loss weights fed to it (0 without weights)
    weight_sum: float  # the sum of the loss weights fed to it (0 without weights)
    weight_off_binary: float  # the largest min(|w|, |w - 1|) of those weights: 0 when each is 0 or 1
    padding_loss: float  # the largest |entry| of the loss vector at a row of weight 0 (-1: not comparable)
    regularizers: float  # the regularization losses Keras adds to every entry of the loss vector

    @classmethod
    def of(cls, row: np.ndarray) -> StepFacts:
        return cls(
            step=int(row[STEP]),
            dp_calls=float(row[DP_CALLS]),
            rows=int(row[ROWS]),
            loss_length=int(row[LOSS_LENGTH]),
            clip=float(row[CLIP]),
            noise_std=float(row[NOISE_STD]),
            learning_rate=float(row[LEARNING_RATE]),
            iterations=float(row[ITERATIONS]),
            tampered=bool(row[TAMPERED]),
            start_distance=float(row[START_DISTANCE]),
            moved=float(row[MOVED]),
            others_moved=bool(row[OTHERS_MOVED]),
            weight_off_one=float(row[WEIGHT_OFF_ONE]),
            weight_sum=float(row[WEIGHT_SUM]),
            weight_off_binary=float(row[WEIGHT_OFF_BINARY]),
            padding_loss=float(row[PADDING_LOSS]),
            regularizers=float(row[REGULARIZERS]),
        )


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What the compiled step cannot see, read on the host when the steps are checked."""

    optimizer: Any  # model.optimizer now
    learning_rate: Any  # the raw learning-rate hyperparameter the next trace reads
    trainable_ids: tuple[int, ...]  # ids of model.trainable_variables now
    traced_ids: tuple[tuple[int, ...], ...]  # per trace of the step, the sorted ids the DP optimizer differentiated
    weight_ids: tuple[int, ...]  # ids of model.weights now


def host_facts(model: Any, probe: StepProbe) -> HostFacts:
    return HostFacts(
        optimizer=model.optimizer,
        learning_rate=current_learning_rate(model.optimizer),
        trainable_ids=tuple(id(v) for v in model.trainable_variables),
        traced_ids=tuple(tuple(sorted(map(id, dp))) for dp in probe.dp_variables),
        weight_ids=tuple(id(v) for v in model.weights),
    )


@dataclasses.dataclass(frozen=True)
class Ball:
    """The projection ball the step must start in (center per trainable variable, radius, tolerance)."""

    center: Sequence[Any]
    radius: float  # the projection's radius: where the projection puts an iterate that left the ball
    margin: float  # the projection scales to radius * margin


class StepProbe:
    """Instruments one model's compiled training step (instance-level wrappers, removed by :meth:`remove`).

    Every step writes one row of :class:`StepTable` ``record``: its number, the DP gradient
    computations it ran, the rows of its batch, the length of the loss vector the DP optimizer splits
    into microbatches, the clip norm and the noise std (on the clipped sum) it used, the learning rate
    its update read, ``optimizer.iterations`` when it started, a flag set when a weight changed inside the
    step other than by the DP update, the distance of its starting point from the projection center,
    the distance between its starting point and the previous step's end (projected when a ball is given)
    a flag set when a non-trainable weight changed between the two steps, and the largest |w - 1| of the
    per-example loss weights fit fed the step (sample_weight, class_weight), their sum, how far the farthest is
    from both 0 and 1, the largest loss entry at a row of weight 0 (padding rows must add nothing) and the
    regularization losses Keras adds to every entry. The weights watched are
    all of ``model.weights`` at the start (trainable and not, every dtype).

    ``dp_variables`` lists, per trace of the step, the variables the DP optimizer differentiated.
    """

    def __init__(self, model: Any, optimizer: Any, ball: Ball | None, capacity: int) -> None:
        self.model, self.optimizer, self.ball = model, optimizer, ball
        self.record = StepTable(_SLOTS, capacity, "lastiter_steps")
        self.watched = list(model.weights)
        trainable = {id(v) for v in model.trainable_variables}
        self.trainable = [w for w in self.watched if id(w) in trainable]
        self.others = [w for w in self.watched if id(w) not in trainable]
        self.mirror = [tf.Variable(w, trainable=False, name="lastiter_mirror") for w in self.watched]
        self.mirror_valid = tf.Variable(False, trainable=False, name="lastiter_mirror_valid")
        self.dp_variables: list[list[Any]] = []
        self._saved: dict[tuple[Any, str], Any] = {}
        self._snapshot: list[Any] | None = None
        self._weights: Any = None  # the traced step's loss weights, one per row (None: none, or nested)
        self._after_update: list[Any] | None = None
        self._departure = tf.function(self._moved_since_last_step)
        self._wrap(model, "train_step", self._train_step)
        self._wrap(optimizer, "_compute_gradients", self._compute_gradients)
        self._wrap(optimizer, "apply_gradients", self._apply_gradients)
        # fit reuses a train function traced before (by train_on_batch or an earlier fit), which calls the step
        # unwrapped: the running fit gets one traced afresh (fit reads model.train_function at every step)
        model.train_function = model.make_train_function(force=True)

    def _wrap(self, obj: Any, name: str, make: Any) -> None:
        original = getattr(obj, name)
        self._saved[(obj, name)] = obj.__dict__.get(name, _MISSING)
        object.__setattr__(obj, name, make(original))

    @property
    def installed(self) -> bool:
        """Whether the wrappers are in place."""
        return bool(self._saved)

    def remove(self) -> None:
        for (obj, name), before in self._saved.items():
            if before is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                object.__setattr__(obj, name, before)
        self._saved = {}

    def read(self) -> StepRecord:
        return self.record.read()

    def departure(self) -> tuple[float, bool]:
        """(distance of the trainable weights from the last step's end, projected with a ball; whether a
        non-trainable weight differs from it) now; (0, False) before the first step."""
        moved, others = self._departure()
        return float(moved), bool(others)

    # -- in-graph helpers --------------------------------------------------------

    def _changed(self, weights: Sequence[Any], before: Sequence[Any]) -> Any:
        flags = [tf.reduce_any(tf.not_equal(w, b)) for w, b in zip(weights, before, strict=True)]
        return tf.reduce_any(flags) if flags else tf.constant(False)

    def _distance(self, weights: Sequence[Any], points: Sequence[Any]) -> Any:
        squares = [
            tf.reduce_sum(tf.square(tf.cast(w, tf.float64) - tf.cast(p, tf.float64)))
            for w, p in zip(weights, points, strict=True)
        ]
        return tf.sqrt(tf.add_n(squares)) if squares else tf.constant(0.0, tf.float64)

    def _moved_since_last_step(self) -> tuple[Any, Any]:
        ends = dict(zip(map(id, self.watched), self.mirror, strict=True))
        expected = [tf.cast(ends[id(w)], tf.float64) for w in self.trainable]
        if self.ball is not None:  # the projection between steps is the one allowed change
            d = self._distance(expected, self.ball.center)
            scale = tf.minimum(
                tf.constant(1.0, tf.float64), self.ball.radius * self.ball.margin / tf.maximum(d, 1e-300)
            )
            expected = [
                tf.cast(c, tf.float64) + (m - tf.cast(c, tf.float64)) * scale
                for m, c in zip(expected, self.ball.center, strict=True)
            ]
        moved = self._distance(self.trainable, expected)
        others = self._changed(self.others, [ends[id(w)] for w in self.others])
        valid = self.mirror_valid
        return tf.where(valid, moved, tf.constant(0.0, tf.float64)), tf.logical_and(valid, others)

    def _padding_loss(self, loss: Any) -> Any:
        """The largest |entry| of the loss vector at the rows of weight 0 (0 without such rows; inf when one is not
        finite; -1 when the vector and the weights do not match row for row)."""
        weights = self._weights
        if weights is None or callable(loss):
            return tf.constant(0.0 if weights is None else -1.0, tf.float64)
        entries = tf.reshape(tf.cast(loss, tf.float64), [tf.shape(loss)[0], -1])

        def largest() -> Any:
            at_zero = tf.broadcast_to(tf.equal(weights, 0.0)[:, None], tf.shape(entries))
            padding = tf.reshape(tf.where(at_zero, tf.abs(entries), tf.zeros_like(entries)), [-1])  # real rows: 0
            finite = tf.reduce_all(tf.math.is_finite(padding))
            return tf.where(finite, tf.reduce_max(tf.concat([padding, [0.0]], 0)), tf.constant(math.inf, tf.float64))

        same = tf.equal(tf.shape(entries)[0], tf.shape(weights)[0])
        return tf.cond(same, largest, lambda: tf.constant(-1.0, tf.float64))

    def _train_step(self, original: Any) -> Any:
        record = self.record

        def train_step(data: Any) -> Any:
            step = record.begin()
            record.set(STEP, step)
            record.set(ROWS, rows_of(tf.nest.flatten(data)[0]))
            _, _, sample_weight = tf.keras.utils.unpack_x_y_sample_weight(data)
            weights = tf.nest.flatten(sample_weight) if sample_weight is not None else []
            for w in weights:
                w = tf.cast(w, tf.float64)
                record.maximum(WEIGHT_OFF_ONE, tf.reduce_max(tf.abs(w - 1.0)))
                record.add(WEIGHT_SUM, tf.reduce_sum(w))
                record.maximum(WEIGHT_OFF_BINARY, tf.reduce_max(tf.minimum(tf.abs(w), tf.abs(w - 1.0))))
            self._weights = tf.reshape(tf.cast(weights[0], tf.float64), [-1]) if len(weights) == 1 else None
            record.set(REGULARIZERS, float(len(self.model.losses)))  # what compute_loss adds to every entry
            record.set(ITERATIONS, self.optimizer.iterations)
            if self.ball is not None:
                record.set(START_DISTANCE, self._distance(self.trainable, self.ball.center))
            moved, others = self._moved_since_last_step()
            record.set(MOVED, moved)
            record.set(OTHERS_MOVED, others)
            self._snapshot = [tf.identity(w) for w in self.watched]
            self._after_update = self._snapshot  # replaced by apply_gradients when the DP update runs
            outputs = original(data)
            trainable = {id(w) for w in self.trainable}
            after = [a for w, a in zip(self.watched, self._after_update, strict=True) if id(w) in trainable]
            start = [s for w, s in zip(self.watched, self._snapshot, strict=True) if id(w) not in trainable]
            record.add(TAMPERED, self._changed(self.trainable, after))  # nothing after the update
            record.add(TAMPERED, self._changed(self.others, start))  # nothing at all
            for m, w in zip(self.mirror, self.watched, strict=True):
                m.assign(w)
            self.mirror_valid.assign(True)
            record.end()
            return outputs

        return train_step

    def _compute_gradients(self, original: Any) -> Any:
        optimizer, record = self.optimizer, self.record
        found = _family(optimizer)
        family = found[0] if found is not None else None

        def compute_gradients(loss, var_list, grad_loss=None, tape=None):
            length = tf.shape(loss)[0] if not callable(loss) else -1
            if family == GENERIC:
                clip = tf.cast(optimizer._global_state.l2_norm_clip, tf.float64)
                std = tf.cast(optimizer._global_state.stddev, tf.float64)
            else:
                clip = tf.cast(tf.cast(optimizer._l2_norm_clip, tf.float32), tf.float64)
                std = tf.cast(tf.cast(optimizer._l2_norm_clip * optimizer._noise_multiplier, tf.float32), tf.float64)
            record.add(DP_CALLS, 1.0)
            record.set(CLIP, clip)
            record.set(LOSS_LENGTH, length)
            record.set(PADDING_LOSS, self._padding_loss(loss))
            result = original(loss, var_list, grad_loss=grad_loss, tape=tape)
            if family == SPARSE:  # the std apply_gradients will add to the mean of the k microbatch gradients
                k = optimizer._num_microbatches if optimizer._num_microbatches is not None else length
                std = tf.cast(optimizer._noise_stddev, tf.float64) * tf.cast(k, tf.float64)
            record.set(NOISE_STD, std)
            self.dp_variables.append([v for _, v in result])
            return result

        return compute_gradients

    def _apply_gradients(self, original: Any) -> Any:
        optimizer, record = self.optimizer, self.record

        def apply_gradients(*args: Any, **kwargs: Any) -> Any:
            if self._snapshot is not None:
                record.add(TAMPERED, self._changed(self.watched, self._snapshot))  # nothing before the update
            # what the update reads (Keras' SGD: lr_t = _decayed_lr(var_dtype); float32 weights)
            record.set(LEARNING_RATE, optimizer._decayed_lr(tf.float32))
            result = original(*args, **kwargs)
            self._after_update = [tf.identity(w) for w in self.watched]
            return result

        return apply_gradients


_MISSING = object()


def finite_positive(value: Any) -> float | None:
    """A Python float when ``value`` is a finite number > 0 (number, 0-d tensor or variable), else None."""
    if isinstance(value, bool):
        return None
    v = value_of(value)
    return v if v is not None and math.isfinite(v) and v > 0 else None
