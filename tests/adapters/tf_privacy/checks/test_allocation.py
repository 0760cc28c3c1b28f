"""checks/allocation.py: every step of a run on a RandomAllocationDataset trains on the batch the pipeline
delivered for it (weights 1 for its examples, 0 for the padding, the padding's loss entries 0, no regularization
loss added to every entry), and the delivered batches are random allocation's (a fresh allocation every epoch).
Real fits where a real pipeline can break it; the step's facts made by hand where Keras itself stops the run
first (a custom compute_loss is refused by the model check)."""

from __future__ import annotations

import types

import numpy as np
import pytest

from lastiter_plugins import PipelineChangedError
from lastiter_plugins.adapters.tf_privacy import AccountingError, RandomAllocationDataset
from lastiter_plugins.adapters.tf_privacy import _observe as observe
from lastiter_plugins.adapters.tf_privacy.checks import AllocationCheck

from .support import DIM, LOSS, B, N, callback, data, linear, optimizer, tf


def test_an_allocation_repeated_every_epoch_is_refused():
    pipeline = RandomAllocationDataset(*data(), batch_size=B, epochs=3)

    class Reseed(tf.keras.callbacks.Callback):  # "the same seed every epoch, for reproducibility"
        def on_epoch_begin(self, epoch, logs=None):
            pipeline._rng = np.random.default_rng(7)

    model = tf.keras.Sequential([tf.keras.Input((DIM,)), tf.keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    accountant = callback(sampling="random_allocation")
    with pytest.raises(PipelineChangedError, match="equal to an earlier epoch's"):
        model.fit(pipeline.dataset, epochs=3, callbacks=[Reseed(), accountant], verbose=0)


def test_a_loss_added_to_every_entry_is_refused_before_the_first_step():
    pipeline = RandomAllocationDataset(*data(), batch_size=B, epochs=2)
    inputs = tf.keras.Input((DIM,))
    outputs = tf.keras.layers.Dense(1)(inputs)
    model = tf.keras.Model(inputs, outputs)
    model.add_loss(0.01 * tf.reduce_sum(outputs**2, axis=1))  # a per-example activity penalty: a padding row's too
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    with pytest.raises(AccountingError, match="no regularization loss with a RandomAllocationDataset: the model has 1"):
        model.fit(pipeline.dataset, epochs=2, callbacks=[callback(sampling="random_allocation")], verbose=0)
    assert pipeline.deliveries == 0  # refused before any batch was drawn


def test_a_loss_added_inside_call_in_training_is_refused_at_its_step():
    class Penalized(tf.keras.Model):  # model.losses is empty until a training call adds the penalty
        def __init__(self):
            super().__init__()
            self.dense = tf.keras.layers.Dense(1)

        def call(self, inputs, training=None):
            outputs = self.dense(inputs)
            if training:
                self.add_loss(0.01 * tf.reduce_sum(outputs, axis=1))  # its gradient in the bias: a padding row's too
            return outputs

    pipeline = RandomAllocationDataset(*data(), batch_size=B, epochs=2)
    model = Penalized()
    model(data()[0][:2])
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    with pytest.raises(PipelineChangedError, match="no regularization loss with a RandomAllocationDataset: step 1's"):
        model.fit(pipeline.dataset, epochs=2, callbacks=[callback(sampling="random_allocation")], verbose=0)


def test_a_model_without_a_finite_loss_on_the_padding_is_named():
    """A padding row is an all-zero input: x / |x| there is nan, which weight 0 does not cancel (0 * nan), and the
    update spreads it to every weight (which the step check alone would call a change outside the update)."""
    pipeline = RandomAllocationDataset(*data(), batch_size=B, epochs=2)
    unit = tf.keras.layers.Lambda(lambda v: v / tf.norm(v, axis=1, keepdims=True))
    model = tf.keras.Sequential([tf.keras.Input((DIM,)), unit, tf.keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    with pytest.raises(PipelineChangedError, match="step 1 had a padding row whose loss is not finite"):
        model.fit(pipeline.dataset, epochs=2, callbacks=[callback(sampling="random_allocation")], verbose=0)


def _facts(step: int, **values: float) -> observe.StepFacts:
    row = np.zeros(observe._SLOTS)
    row[observe.STEP] = step
    for name, value in values.items():
        row[getattr(observe, name.upper())] = value
    return observe.StepFacts.of(row)


@pytest.fixture
def started():
    pipeline = RandomAllocationDataset(*data(), batch_size=B, epochs=1)
    check = AllocationCheck()
    check.start(types.SimpleNamespace(fit=types.SimpleNamespace(allocation=pipeline), model=linear()))
    for _ in pipeline.dataset:  # one epoch delivered, as fit pulls it
        pass
    return check, pipeline


def test_the_delivered_batches_pass(started):
    check, pipeline = started
    for k, (_, kept) in enumerate(pipeline.delivered, start=1):
        assert check.step(k, _facts(k, weight_sum=len(kept))) is None


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (lambda kept: dict(weight_sum=kept - 1), "fed weights summing to"),
        (lambda kept: dict(weight_off_binary=0.5), "a weight 0.5 away from both 0 and 1"),
        (lambda kept: dict(regularizers=1), "no regularization loss"),
        (lambda kept: dict(padding_loss=0.25), "padding row (weight 0) must be 0: step 1 had an entry of 0.25"),
        (lambda kept: dict(padding_loss=-1), "a loss vector that does not match the rows"),
        (lambda kept: dict(padding_loss=float("inf")), "a padding row whose loss is not finite"),
    ],
    ids=["weight-sum", "weights-not-binary", "regularizer", "padding-trains", "unmatched", "padding-not-finite"],
)
def test_a_step_that_is_not_the_delivered_batch_is_refused(started, changes, fragment):
    check, pipeline = started
    kept = len(pipeline.delivered[0][1])
    why = check.step(1, _facts(1, **({"weight_sum": kept} | changes(kept))))
    assert isinstance(why, str) and fragment in why, why
    assert why.endswith("void.")


def test_a_step_without_a_delivery_is_refused(started):
    check, pipeline = started
    why = check.step(len(pipeline.delivered) + 1, _facts(len(pipeline.delivered) + 1))
    assert isinstance(why, str) and "a batch the RandomAllocationDataset delivered" in why
    assert N % B == 0  # the support's sizes: every epoch complete
