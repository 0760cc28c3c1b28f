"""Shared helpers of the run checks' tests: tiny Keras models trained by fit with the callback, and the core's
number for the pipeline that ran (computed with lastiter_plugins.epsilon, independently of the adapter)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfp_privacy = pytest.importorskip("tensorflow_privacy")

from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras_sparse as sparse  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters.tf_privacy import LastIterateCallback  # noqa: E402
from tests.support import quiet_single_threaded  # noqa: E402

quiet_single_threaded(tf)

N, B, DIM, EPOCHS = 64, 16, 4, 2
DELTA = 1e-5
Z, C, LR = 1.3, 1.0, 0.05
C_RUN = float(np.float32(C))  # what the compiled step uses: clip float32(C), noise std float32(z C) on the sum
Z_RUN = float(np.float32(Z * C)) / C_RUN
STEPS = EPOCHS * N // B
LOSS = dict(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

#: TF Privacy 0.9's DP Keras optimizers by name (the sparse ones are not exported at the package's top level).
OPTIMIZERS = {
    **{f"DPKeras{b}Optimizer": getattr(tfp_privacy, f"DPKeras{b}Optimizer") for b in ("SGD", "Adam", "Adagrad")},
    **{
        f"VectorizedDPKeras{b}Optimizer": getattr(tfp_privacy, f"VectorizedDPKeras{b}Optimizer")
        for b in ("SGD", "Adam", "Adagrad")
    },
    **{f"DPSparseKeras{b}Optimizer": getattr(sparse, f"DPSparseKeras{b}Optimizer") for b in ("SGD", "Adam", "Adagrad")},
}


def data(n: int = N, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, DIM)).astype("float32")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, (x[:, 0] > 0).astype("float32")


def optimizer(name: str = "DPKerasSGDOptimizer", **changes):
    kwargs = dict(l2_norm_clip=C, noise_multiplier=Z, num_microbatches=None, learning_rate=LR)
    kwargs.update(changes)
    return OPTIMIZERS[name](**kwargs)


def linear(opt=None, **dense):
    """A logistic regression (one Dense unit on 4 features)."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((DIM,)), tf.keras.layers.Dense(1, use_bias=False, **dense)])
    model.compile(optimizer=opt if opt is not None else optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    return model


def mlp(opt=None):
    """A small deep network: two hidden ReLU layers."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((DIM,)),
            tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=opt if opt is not None else optimizer(), loss=tf.keras.losses.BinaryCrossentropy(**LOSS))
    return model


def callback(sampling: str = "cyclic", **changes) -> LastIterateCallback:
    return LastIterateCallback(sampling=sampling, dataset_size=N, delta=DELTA, **changes)


def fit(model, cb, x=None, y=None, epochs=EPOCHS, shuffle=False, more=(), **kwargs):
    if x is None:
        x, y = data()
    if isinstance(x, tf.data.Dataset):
        return model.fit(x, epochs=epochs, callbacks=[cb, *more], verbose=0, **kwargs)
    return model.fit(x, y, batch_size=B, epochs=epochs, shuffle=shuffle, callbacks=[cb, *more], verbose=0, **kwargs)


def core(sampling: str, *, update: str = "any", steps: int = STEPS, learning_rate=LR, **assumptions):
    """The core's best for the pipeline that ran: ``update="any"`` (Adam, momentum, a schedule) leaves only the
    every-iterate rows, whatever the loss assumptions."""
    config = lp.TrainingConfig(
        dataset_size=N,
        batch_size=B,
        noise_multiplier=Z_RUN,
        steps=steps,
        sampling=sampling,
        learning_rate=learning_rate if update == "sgd" else None,
        clip_norm=C_RUN,
        update=update,
    )
    return lp.epsilon("best", DELTA, config=config, assumptions=lp.LossAssumptions(**assumptions))


def iterations(model) -> int:
    return int(model.optimizer.iterations.numpy())
