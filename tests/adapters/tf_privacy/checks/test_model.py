"""checks/model.py and checks/steps.py on what the model carries into the run: a preprocessing layer adapted on
the private features, a batch-normalization layer in training mode, and training before the accounted fit are
refused (each breaks every row: the released model holds un-noised statistics of the data, or starts from
weights the epsilon does not cover) unless declared public or frozen; then the run gets the core's number."""

from __future__ import annotations

import numpy as np
import pytest

from lastiter_plugins.adapters.tf_privacy import AccountingError

from .support import DIM, LOSS, N, callback, core, data, fit, iterations, optimizer, tf


def compiled(*layers, opt=None, inputs=None, outputs=None):
    """A deep network (no declared constants) with ``layers`` before a Dense head, compiled with DP-SGD."""
    if inputs is None:
        tf.keras.utils.set_random_seed(0)
        model = tf.keras.Sequential([tf.keras.Input((DIM,)), *layers, tf.keras.layers.Dense(1)])
    else:
        model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=opt if opt is not None else optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    return model


def adapted(layer):
    x, _ = data()
    layer.adapt(x)  # the Keras tutorial pattern: adapted on the private training features
    return layer


# -- a preprocessing layer adapted on data

ADAPTED = [
    ("normalization", lambda: adapted(tf.keras.layers.Normalization(name="norm"))),
    ("discretization", lambda: adapted(tf.keras.layers.Discretization(num_bins=4, name="norm"))),
]


@pytest.mark.parametrize("make", [m for _, m in ADAPTED], ids=[i for i, _ in ADAPTED])
def test_a_layer_adapted_on_the_private_features_is_refused_before_any_step(make):
    model = compiled(make())
    with pytest.raises(AccountingError, match=r"adapted on public data.*public_statistics=True.*\['norm'\]"):
        fit(model, callback())
    assert iterations(model) == 0


@pytest.mark.parametrize("make", [m for _, m in ADAPTED], ids=[i for i, _ in ADAPTED])
def test_a_layer_adapted_on_data_declared_public_gets_the_core_number(make):
    model = compiled(make())
    cb = callback(public_statistics=True)
    fit(model, cb)
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)


def test_normalization_with_given_constants_is_not_adapted_and_is_accepted():
    model = compiled(tf.keras.layers.Normalization(mean=0.0, variance=1.0))
    cb = callback()
    fit(model, cb)
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)


def test_public_statistics_must_be_a_bool():
    with pytest.raises(ValueError, match=r"public_statistics must be True or False\. Found .yes."):
        callback(public_statistics="yes")
    with pytest.raises(ValueError, match=r"public_pretraining must be True or False\. Found 1"):
        callback(public_pretraining=1)


# -- batch normalization


@pytest.mark.parametrize("public", [False, True], ids=["undeclared", "declared-public"])
def test_batch_normalization_in_training_mode_is_refused_whatever_is_declared(public):
    model = compiled(tf.keras.layers.BatchNormalization(name="bn"))
    with pytest.raises(AccountingError, match=r"in training mode.*trainable = False.*\['bn'\] in training mode"):
        fit(model, callback(public_statistics=public))
    assert iterations(model) == 0


def frozen_by_flag():
    bn = tf.keras.layers.BatchNormalization(name="bn")
    bn.trainable = False
    return compiled(bn)


def frozen_by_call():
    tf.keras.utils.set_random_seed(0)
    inputs = tf.keras.Input((DIM,))
    hidden = tf.keras.layers.BatchNormalization(name="bn")(inputs, training=False)
    return compiled(inputs=inputs, outputs=tf.keras.layers.Dense(1)(hidden))


@pytest.mark.parametrize("make", [frozen_by_flag, frozen_by_call], ids=["trainable-false", "training-false"])
def test_a_frozen_batch_normalization_runs_in_inference_mode_and_gets_the_core_number(make):
    model = make()
    bn = model.get_layer("bn")
    before = [w.numpy().copy() for w in bn.non_trainable_weights]
    cb = callback()
    fit(model, cb)
    assert all(np.array_equal(a, w.numpy()) for a, w in zip(before, bn.non_trainable_weights, strict=True))
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)


def test_a_batch_normalization_called_in_training_mode_once_is_refused():
    inputs = tf.keras.Input((DIM,))
    bn = tf.keras.layers.BatchNormalization(name="bn")
    hidden = tf.keras.layers.Concatenate()([bn(inputs, training=False), bn(inputs)])
    model = compiled(inputs=inputs, outputs=tf.keras.layers.Dense(1)(hidden))
    with pytest.raises(AccountingError, match="in training mode"):
        fit(model, callback())


# -- training before the accounted fit


def warmed_up():
    """The issue's case: one non-private epoch on the private data, then the DP optimizer."""
    x, y = data()
    model = compiled(opt=tf.keras.optimizers.legacy.SGD(0.05))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    model.compile(optimizer=optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    return model


def test_a_non_private_warm_up_epoch_is_refused_before_any_step():
    model = warmed_up()
    with pytest.raises(
        AccountingError, match=r"trained before.*public_pretraining=True.*Found 4 training step\(s\) in Keras. count"
    ):
        fit(model, callback())
    assert iterations(model) == 0


def test_a_warm_up_declared_public_gets_the_core_number():
    model = warmed_up()
    cb = callback(public_pretraining=True)
    fit(model, cb)
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)


def test_earlier_steps_of_the_dp_optimizer_are_refused_unless_declared_public():
    x, y = data()
    model = compiled()
    model.train_on_batch(x[:16], y[:16])  # not a fit: only the optimizer's step count shows it
    with pytest.raises(AccountingError, match=r"trained before.*Found optimizer\.iterations=1 "):
        fit(model, callback())
    cb = callback(public_pretraining=True)
    fit(model, cb)
    assert cb.steps == 2 * N // 16 and iterations(model) == 1 + cb.steps
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)


# -- a layer centring each batch (checks/batch_coupling.py)


def centred():
    return tf.keras.layers.Lambda(lambda x: x - tf.reduce_mean(x, axis=0, keepdims=True), name="centre")


def test_a_layer_centring_each_batch_is_refused_before_any_step_naming_it():
    model = compiled(tf.keras.layers.Dense(8, activation="relu"), centred())
    with pytest.raises(AccountingError, match=r"from that example alone.*Found the coupling at layer 'centre'"):
        fit(model, callback(public_statistics=True, public_pretraining=True))
    assert iterations(model) == 0


def test_a_layer_centring_each_example_is_accepted():
    per_example = tf.keras.layers.Lambda(lambda x: x - tf.reduce_mean(x, axis=1, keepdims=True), name="centre")
    model = compiled(per_example)
    cb = callback()
    fit(model, cb)
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd").epsilon, rel=1e-12)
