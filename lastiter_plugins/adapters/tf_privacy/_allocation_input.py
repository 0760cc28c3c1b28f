r"""Random allocation for Keras ``fit``: an input pipeline of fixed-length batches (docs/sampling.md,
docs/derivations/keras-adapter.md#keras-random-allocation).

TF Privacy's DP Keras optimizers divide each step's noisy clipped sum by the number of rows they are given;
random allocation's batch sizes vary, so every batch is padded to one length ``L`` with rows of weight 0 (they
add nothing to the clipped sum) and a batch of more than ``L`` examples is cut to a random ``L`` of them. The
accounting adds the probability of a cut to delta (docs/derivations/fixed-length-batches.md).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from lastiter_plugins.adapters._allocation import allocate, count, steps_per_epoch
from lastiter_plugins.adapters._derivation import DrawnBatch
from lastiter_plugins.host import DEFAULT_OVERFLOW, padded_batch_size

#: the datasets made by a RandomAllocationDataset, by id (the callback finds the pipeline behind fit's x)
_MADE: weakref.WeakValueDictionary[int, RandomAllocationDataset] = weakref.WeakValueDictionary()
_PASSES = itertools.count(1)  # globally increasing pass ids (AllocationRecord compares them)
#: the transformations that may follow the dataset: they pass its elements on unchanged (TF 2.14's class names)
_PASS_THROUGH = {"_PrefetchDataset", "_OptionsDataset"}


class RandomAllocationDataset:
    r"""RANDOM_ALLOCATION for Keras ``fit``: every epoch, each example joins ``allocations_per_epoch`` (k) of the
    epoch's ``t = ceil(n k / b)`` steps, drawn uniformly at random and afresh every epoch (k = 1: balls in bins;
    Chua et al. 2024, arXiv 2412.16802), from a secret generator.

    Pass :attr:`dataset` to ``model.fit`` (alone, or followed by ``prefetch``) with ``epochs=epochs`` and a
    :class:`LastIterateCallback` declaring ``sampling="random_allocation"``. Keras iterates the dataset afresh
    every epoch, and every iteration draws a new allocation.

    **Fixed-length batches.** TF Privacy's DP Keras optimizers divide each step's noisy sum by the rows they
    are given, so every batch has exactly ``max_batch_size`` (L) rows: the step's examples with sample weight 1,
    then rows of zeros with sample weight 0, which add nothing to the clipped sum (their loss entry is 0). A
    batch with more than L examples (an event of probability ``overflow`` over the whole run by default) keeps
    a random L of them; the accounting adds that probability to delta. The optimizer divides by L, not b: the
    step of an example is ``learning_rate / L``. Multiply your learning rate by ``L / b`` to keep the step a
    b-sized batch would take. Padding costs compute: every step runs on L rows, ``L / b`` times the mean batch
    (about 1.2 at b = 1500, 1.9 at b = 64: small batches vary relatively more).

    Args:
      x, y: the examples and their labels (arrays with the examples along the first axis, the same count).
      batch_size: b, the mean batch size: the epoch has ``t = ceil(n k / b)`` steps.
      epochs: the epochs ``fit`` will run (the overflow probability covers them).
      allocations_per_epoch: k, the steps each example joins in an epoch (default 1).
      max_batch_size: L, the rows of every batch; default: the smallest L whose probability that some batch of
        the run exceeds it is at most ``overflow`` (``lastiter_plugins.host.padded_batch_size``).
      overflow: that target probability (default 1e-9), when ``max_batch_size`` is not given.
      generator: the source of the allocations, a ``numpy.random.Generator``; default: one seeded from the
        operating system's entropy (secret). A seed you publish makes the allocations public.
    """

    def __init__(
        self,
        x: Any,
        y: Any,
        *,
        batch_size: int,
        epochs: int,
        allocations_per_epoch: int = 1,
        max_batch_size: int | None = None,
        overflow: float = DEFAULT_OVERFLOW,
        generator: np.random.Generator | None = None,
    ) -> None:
        self.x, self.y = np.asarray(x), np.asarray(y)
        for name, part in (("x", self.x), ("y", self.y)):
            if part.ndim == 0 or part.dtype == object:
                raise ValueError(
                    f"{name} must be one array with the examples along its first axis (numpy, a tf.Tensor); for "
                    "several inputs, give the model one array and split it in a layer. Found "
                    f"{type(x if name == 'x' else y).__name__}."
                )
        n = len(self.x)
        if n < 1 or len(self.y) != n:
            raise ValueError(f"x and y must hold the same number (>= 1) of examples. Found {n} and {len(self.y)}.")
        b = count("batch_size", batch_size, 1)
        if b > n:
            raise ValueError(f"batch_size must be <= the number of examples = {n}. Found {b}.")
        self.epochs = count("epochs", epochs, 1)
        k = count("allocations_per_epoch", allocations_per_epoch, 1)
        t = steps_per_epoch(n, b, k)
        if k > t:
            raise ValueError(f"allocations_per_epoch must be <= the steps of an epoch = {t}. Found {k}.")
        if generator is not None and not isinstance(generator, np.random.Generator):
            raise ValueError(f"generator must be a numpy.random.Generator or None. Found {type(generator).__name__}.")
        if max_batch_size is None:
            max_batch_size = padded_batch_size(n, b, k, self.epochs * t, overflow)
        self.dataset_size, self.batch_size, self.allocations_per_epoch = n, b, k
        self.steps_per_epoch = t
        self.max_batch_size = count("max_batch_size", max_batch_size, 1)
        self._rng = generator if generator is not None else np.random.default_rng()
        self._lock = threading.Lock()
        self.deliveries = 0  # batches delivered so far (every iteration, fit's or not)
        self.batches_cut = 0  # of those, the ones with more than L examples, cut to L (a run counts its own)
        # the last batches delivered (the callback checks them once per epoch; prefetching runs ahead): their
        # number in the stream of deliveries, the batch as the allocation drew it, the examples kept (at most L)
        self._recent: collections.deque[tuple[int, DrawnBatch, tuple[int, ...]]] = collections.deque(maxlen=2 * t + 64)
        L = self.max_batch_size
        signature = (
            tf.TensorSpec((L, *self.x.shape[1:]), tf.as_dtype(self.x.dtype)),
            tf.TensorSpec((L, *self.y.shape[1:]), tf.as_dtype(self.y.dtype)),
            tf.TensorSpec((L,), tf.float32),
        )
        made = tf.data.Dataset.from_generator(self._epoch, output_signature=signature)
        self.dataset: tf.data.Dataset = made.apply(tf.data.experimental.assert_cardinality(t))
        _MADE[id(self.dataset)] = self

    @property
    def delivered(self) -> list[tuple[DrawnBatch, tuple[int, ...]]]:
        """The last batches delivered (at most two epochs' and 64 more), in order: each as the allocation drew it,
        and the examples kept (at most ``max_batch_size``)."""
        with self._lock:
            return [(drawn, kept) for _, drawn, kept in self._recent]

    def delivery(self, index: int) -> tuple[DrawnBatch, tuple[int, ...]] | None:
        """The ``index``-th batch delivered (0-based, over every iteration), while it is among the last kept."""
        with self._lock:
            if not self._recent or not self._recent[0][0] <= index <= self._recent[-1][0]:
                return None
            _, drawn, kept = self._recent[index - self._recent[0][0]]
            return drawn, kept

    def _epoch(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        L = self.max_batch_size
        with self._lock:
            pass_id = next(_PASSES)
            batches = allocate(self.dataset_size, self.steps_per_epoch, self.allocations_per_epoch, self._rng)
            trained = [
                np.sort(self._rng.choice(batch, L, replace=False)) if len(batch) > L else batch for batch in batches
            ]
        for position, (batch, rows) in enumerate(zip(batches, trained, strict=True)):
            x = np.zeros((L, *self.x.shape[1:]), self.x.dtype)
            y = np.zeros((L, *self.y.shape[1:]), self.y.dtype)
            weights = np.zeros(L, np.float32)
            x[: len(rows)], y[: len(rows)], weights[: len(rows)] = self.x[rows], self.y[rows], 1.0
            drawn = DrawnBatch(pass_id, position, tuple(int(i) for i in batch))
            kept = drawn.indices if len(rows) == len(batch) else tuple(int(i) for i in rows)
            with self._lock:
                self._recent.append((self.deliveries, drawn, kept))
                self.deliveries += 1
                self.batches_cut += len(kept) < len(drawn.indices)
            yield x, y, weights


def pipeline_of(dataset: Any) -> RandomAllocationDataset | None:
    """The :class:`RandomAllocationDataset` whose dataset ``dataset`` is, directly or behind ``prefetch`` and
    ``with_options`` only (None for any other dataset)."""
    seen = dataset
    for _ in range(8):
        made = _MADE.get(id(seen))
        if made is not None and made.dataset is seen:
            return made
        if type(seen).__name__ not in _PASS_THROUGH:
            return None
        seen = getattr(seen, "_input_dataset", None)
    return None


def pipelines_in(data: Any) -> list[RandomAllocationDataset]:
    """The :class:`RandomAllocationDataset` objects whose dataset lies in ``data``'s input graph: ``data`` (any
    nesting of datasets and arrays) itself, or any dataset it is built from, every input of a zip or a concatenate
    followed (a map, a filter, a repeat, a batch... after it)."""
    made = {id(m.dataset): m for m in _MADE.values()}
    found: dict[int, RandomAllocationDataset] = {}
    todo = [d for d in tf.nest.flatten(data) if isinstance(d, tf.data.Dataset)]
    seen: set[int] = set()
    while todo and len(seen) < 256:
        dataset = todo.pop()
        if id(dataset) in seen:
            continue
        seen.add(id(dataset))
        if id(dataset) in made:
            found[id(dataset)] = made[id(dataset)]
            continue
        inputs = getattr(dataset, "_inputs", None)
        with contextlib.suppress(Exception):  # a dataset type without inputs
            todo += list(inputs()) if callable(inputs) else []
    return list(found.values())
