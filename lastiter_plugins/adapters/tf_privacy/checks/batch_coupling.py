r"""The model treats each example on its own: every row bounds one example's influence by clipping its own
gradient, which assumes that the model's output for an example is a function of that example alone. A layer
computing a statistic of the batch (a ``Lambda`` centring each batch on its mean, a custom layer normalising by
the batch's norm) couples the examples, and clipping no longer bounds one example's influence: every row breaks.

Observed by a probe before the first step, where it can be run: the model (a functional or ``Sequential`` model
whose inputs are floating point with known shapes), in inference mode, on a batch of generated public inputs
(numpy's generator, seed 0: the run's randomness is left alone), and on the same batch with its first example
changed; an output of another example that moves couples the batch. The layer is named: the first layer whose
output couples. Not observed (a stated precondition, docs/tf_privacy.md): a subclassed model, inputs of other
dtypes (text, integer ids), coupling only in training mode or only for some inputs. ``BatchNormalization`` in
training mode is refused by the model check (:mod:`.model`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from lastiter_plugins.host import Departure

from .._errors import AccountingError
from ._check import Check, Start

#: Examples in the probe's batch.
PROBE_BATCH = 3


class BatchCouplingCheck(Check):
    def start(self, start: Start) -> Iterable[Departure]:
        coupled = coupling_layer(start.model)
        if coupled is not None:
            raise AccountingError(
                "the model must compute each example's output from that example alone: its output for one "
                "example of a batch changed when another example changed (a layer computing a statistic of the "
                "batch, such as a Lambda subtracting the batch mean), so one example moves the others' gradients "
                "and clipping no longer bounds its influence. Compute the statistic per example, or from public "
                f"data as a constant. Found the coupling at layer {coupled!r}."
            )
        return ()


def coupling_layer(model: Any) -> str | None:
    """The name of the first layer whose output couples the examples of the probe's batch (the model's name
    when none alone does), or None: no coupling seen, or the probe cannot run on this model."""
    batches = _probe_batches(model)
    if batches is None or not _couples(model, batches):
        return None
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.InputLayer):
            continue
        try:
            part = tf.keras.Model(model.inputs, layer.output)
        except (AttributeError, ValueError):  # a layer used twice, a nested model's own graph
            continue
        if _couples(part, batches):
            return str(layer.name)
    return str(model.name)


def _probe_batches(model: Any) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    rng = np.random.default_rng(0)
    first: list[np.ndarray] = []
    for tensor in inputs:
        shape = tuple(tensor.shape)[1:]
        if not tensor.dtype.is_floating or any(d is None for d in shape):
            return None
        first.append(rng.normal(size=(PROBE_BATCH, *shape)).astype(tensor.dtype.as_numpy_dtype))
    second = [x.copy() for x in first]
    for x in second:
        x[0] = rng.normal(size=x.shape[1:])
    return first, second


def _couples(model: Any, batches: tuple[list[np.ndarray], list[np.ndarray]]) -> bool:
    try:
        outputs = [tf.nest.flatten(model(x, training=False)) for x in batches]
    except (TypeError, ValueError, KeyError, AttributeError, tf.errors.OpError):  # the probe cannot run this model
        return False
    for a, b in zip(*outputs, strict=True):
        a, b = np.asarray(a, np.float64)[1:], np.asarray(b, np.float64)[1:]
        if a.shape != b.shape or not np.allclose(a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(a).max()))):
            return True
    return False
