r"""Last-iterate accounting for Keras + TF Privacy: l2-regularised logistic regression
on scikit-learn's bundled breast-cancer data (no download).

    python examples/tf_privacy_logistic_regression.py [--epochs 20] [--sampling both]

Runs on the CPU (or a GPU when TensorFlow sees one) in a few seconds.

How every constant is derived, so that the declarations are true:

* The data are split once with a fixed seed into 512 private training examples
  and 57 public ones. The public ones give the feature standardisation (so the
  preprocessing reveals nothing about the private examples) and the test
  accuracy. Each feature vector is standardised, a constant 1 is appended (the
  intercept), and the row is scaled to norm 1: ``|x_i| = 1`` for every example.
* Per-example loss ``f_i(w) = log(1 + exp(-s_i <w, x_i>)) + (lam/2)|w|^2``. The
  regulariser is folded into the per-example loss: TF Privacy needs a vector of
  per-example losses, and Keras 2.14 cannot add a layer's ``kernel_regularizer``
  (a scalar) to them (``tf.add_n`` refuses the shapes), so the loss class below
  adds it to every example's loss, where it is clipped with it.
* Hessian ``sigma'(.) x x^T + lam I`` with ``sigma' <= 1/4``: the losses are
  ``lam``-strongly convex and M-smooth with ``M = max_i |x_i|^2 / 4 + lam``.
* The minimiser satisfies ``lam w* = -mean_i grad log-loss_i``, so
  ``|w*| <= max_i |x_i| / lam = R``: the ball of radius R = 1/lam (diameter
  D = 2R) contains it, and :class:`ProjectionCallback` keeps every iterate in it.
* On that ball ``|grad f_i(w)| <= |x_i| + lam |w| <= 1 + lam R = C``: with
  ``l2_norm_clip = C`` clipping never changes a gradient anywhere on the domain,
  so ``gradient_norms_within_clip=True`` is an honest declaration (Kong & Ribero 2024, arXiv 2407.05237, Prop. 2.1(c)).
* The learning rate is 90% of the smallest step-size limit of the bounds that
  can apply (``1/(M+m)`` for Kong & Ribero without clipping, ``2/(lam+M)`` for
  Ye & Shokri).
* 512 = 16 x 32: the batch size divides the dataset, as the callback requires.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer
from tensorflow_privacy import DPKerasSGDOptimizer

from lastiter_plugins import compute_epsilon
from lastiter_plugins.adapters.tf_privacy import (
    LastIterateCallback,
    ProjectionCallback,
    compute_last_iterate_privacy_statement,
)

PRIVATE_EXAMPLES = 512
SEED = 0


class RegularisedLogisticLoss(tf.keras.losses.Loss):
    """Per-example logistic loss on logits plus (lam/2)|w|^2, unreduced (TF Privacy needs one loss per example)."""

    def __init__(self, weights: tf.Variable, lam: float) -> None:
        super().__init__(reduction=tf.keras.losses.Reduction.NONE, name="regularised_logistic")
        self._weights = weights
        self._lam = lam

    def call(self, y_true, y_pred):
        labels = tf.cast(tf.reshape(y_true, [-1]), y_pred.dtype)
        logits = tf.reshape(y_pred, [-1])
        data_loss = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        return data_loss + 0.5 * self._lam * tf.reduce_sum(tf.square(self._weights))


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_private, y_private, x_public, y_public), rows of norm 1 with an intercept feature."""
    features, labels = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(SEED).permutation(len(features))
    private, public = order[:PRIVATE_EXAMPLES], order[PRIVATE_EXAMPLES:]
    mean, std = features[public].mean(axis=0), features[public].std(axis=0) + 1e-12
    rows = np.hstack([(features - mean) / std, np.ones((len(features), 1))])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows, labels = rows.astype("float32"), labels.astype("float32")
    return rows[private], labels[private], rows[public], labels[public]


def derive_constants(x: np.ndarray, lam: float) -> dict[str, float]:
    """M, R, D, C and the learning rate, as in the module docstring."""
    max_norm = float(np.linalg.norm(x, axis=1).max())
    smoothness = max_norm**2 / 4.0 + lam
    radius = max_norm / lam
    clip = max_norm + lam * radius
    learning_rate = 0.9 * min(1.0 / smoothness, 2.0 / (lam + smoothness))
    return dict(smoothness=smoothness, radius=radius, diameter=2 * radius, clip=clip, learning_rate=learning_rate)


def train(sampling: str, args: argparse.Namespace, data, constants: dict[str, float]):
    x, y, x_public, y_public = data
    tf.keras.utils.set_random_seed(SEED)
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros", input_shape=(x.shape[1],))]
    )
    optimizer = DPKerasSGDOptimizer(
        l2_norm_clip=constants["clip"],
        noise_multiplier=args.noise_multiplier,
        num_microbatches=None,  # one example per microbatch
        learning_rate=constants["learning_rate"],
    )
    model.compile(optimizer=optimizer, loss=RegularisedLogisticLoss(model.layers[0].kernel, args.lam))
    accountant = LastIterateCallback(
        sampling=sampling,
        dataset_size=len(x),
        delta=args.delta,
        smoothness=constants["smoothness"],
        strong_convexity=args.lam,
        diameter=constants["diameter"],
        gradient_norms_within_clip=True,
    )
    projection = ProjectionCallback(diameter=constants["diameter"])
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=(sampling == "reshuffle"),  # shuffle=False is cyclic, shuffle=True reshuffles every epoch
        callbacks=[accountant, projection],
        verbose=args.verbose,
    )
    logits = model.predict(x_public, batch_size=len(x_public), verbose=0).reshape(-1)
    accuracy = float(np.mean((logits > 0) == (y_public > 0.5)))
    return accountant, accuracy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--noise-multiplier", type=float, default=2.0)
    parser.add_argument("--lam", type=float, default=0.05, help="l2 regularisation strength (strong convexity)")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--sampling", choices=["cyclic", "reshuffle", "both"], default="both")
    parser.add_argument("--verbose", type=int, default=0, help="Keras fit verbosity (2 prints epsilon per epoch)")
    args = parser.parse_args(argv)

    try:
        tf.config.threading.set_inter_op_parallelism_threads(1)
        tf.config.threading.set_intra_op_parallelism_threads(2)
    except RuntimeError:  # TensorFlow already initialised (e.g. when run from the tests)
        pass
    data = load_data()
    constants = derive_constants(data[0], args.lam)
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(
        f"breast cancer: {len(data[0])} private / {len(data[2])} public examples, {data[0].shape[1]} features, {device}"
    )
    print(
        "constants: M = {smoothness:.4f}, lam = {lam:g}, R = {radius:g} (D = {diameter:g}), C = {clip:g}, "
        "learning rate = {learning_rate:.4f}".format(lam=args.lam, **constants)
    )
    samplings = ["cyclic", "reshuffle"] if args.sampling == "both" else [args.sampling]
    for sampling in samplings:
        start = time.perf_counter()
        accountant, accuracy = train(sampling, args, data, constants)
        result = accountant.result
        baseline = compute_epsilon("composition", accountant.config, accountant.assumptions, args.delta)
        print(
            f"[{sampling}] test accuracy {accuracy:.3f} ({time.perf_counter() - start:.1f}s)\n"
            f"    last iterate: {result}\n"
            f"    composition:  {baseline}"
        )
    print()
    print(
        compute_last_iterate_privacy_statement(
            number_of_examples=len(data[0]),
            batch_size=args.batch_size,
            num_epochs=args.epochs,
            noise_multiplier=args.noise_multiplier,
            delta=args.delta,
            l2_norm_clip=constants["clip"],
            learning_rate=constants["learning_rate"],
            sampling=samplings[0],
            smoothness=constants["smoothness"],
            strong_convexity=args.lam,
            diameter=constants["diameter"],
            gradient_norms_within_clip=True,
        )
    )


if __name__ == "__main__":
    main()
