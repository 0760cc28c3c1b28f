r"""Last-iterate accounting for Keras + TF Privacy: logistic regression on scikit-learn's bundled
breast-cancer data (no download), with the loss assumptions derived from the model.

    python examples/tf_privacy_logistic_regression.py [--epochs 20] [--sampling both]

Runs on the CPU (or a GPU when TensorFlow sees one) in a few seconds.

No loss constant is declared by hand: ``LastIterateCallback(..., model="glm",
feature_norm=A)`` derives them before the first step from the Keras model and the
loss given to ``compile`` (docs/tf_privacy.md, "Certified linear models"):

* The model is ``FeatureNormClip(A)`` followed by one ``Dense(1)`` without
  activation, trained on ``BinaryCrossentropy(from_logits=True, reduction=NONE)``:
  every feature vector has norm <= A for every possible example (the clip holds by
  construction, float rounding included), so the per-example loss is convex and
  (A^2 + 1)/4-smooth in the weights and bias, with gradient norm <= sqrt(A^2 + 1)
  for labels in [0, 1].
* ``l2_norm_clip = C`` is chosen where clipping is provably never active on the
  whole domain (``certify_linear_model(...).clip_norm_never_active``), so the bounds
  that need an unclipped update apply and the privacy statement below, which takes
  the constants explicitly, gives the same number as the callback.
* No l2 term: TF Privacy clips the per-example loss's gradient, so an l2 term in
  the loss is inside the clip and Keras' ``kernel_regularizer`` fails with
  per-example losses; the callback refuses both on this route.
* The data are split once with a fixed seed into 512 private training examples
  and 57 public ones, which give the feature standardisation (so the preprocessing
  reveals nothing about the private examples) and the test accuracy.
  512 = 16 x 32: the batch size divides the dataset, as the callback requires.
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer
from tensorflow_privacy import DPKerasSGDOptimizer

from lastiter_plugins import epsilon
from lastiter_plugins.adapters.tf_privacy import (
    FeatureNormClip,
    LastIterateCallback,
    compute_last_iterate_privacy_statement,
)
from lastiter_plugins.glm import certify_linear_model

PRIVATE_EXAMPLES = 512
SEED = 0
FEATURE_NORM = 1.0  # A: the FeatureNormClip bound


def load_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_private, y_private, x_public, y_public), standardised with the public examples' statistics."""
    features, labels = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(SEED).permutation(len(features))
    private, public = order[:PRIVATE_EXAMPLES], order[PRIVATE_EXAMPLES:]
    mean, std = features[public].mean(axis=0), features[public].std(axis=0) + 1e-12
    rows = ((features - mean) / std).astype("float32")
    labels = labels.astype("float32")
    return rows[private], labels[private], rows[public], labels[public]


def plan() -> tuple[float, float]:
    """(clip norm, learning rate): C where clipping is never active, and 90% of 1/M."""
    certificate = certify_linear_model("binary_logistic", feature_norm_bound=FEATURE_NORM, clip_norm=1.0, bias=True)
    clip = math.ceil(certificate.clip_norm_never_active * 1000) / 1000
    return clip, 0.9 / certificate.smoothness


def train(sampling: str, args: argparse.Namespace, data):
    x, y, x_public, y_public = data
    clip, learning_rate = plan()
    tf.keras.utils.set_random_seed(SEED)
    model = tf.keras.Sequential(
        [tf.keras.Input(shape=(x.shape[1],)), FeatureNormClip(FEATURE_NORM), tf.keras.layers.Dense(1)]
    )
    optimizer = DPKerasSGDOptimizer(
        l2_norm_clip=clip,
        noise_multiplier=args.noise_multiplier,
        num_microbatches=None,  # one example per microbatch
        learning_rate=learning_rate,
    )
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    model.compile(optimizer=optimizer, loss=loss)
    accountant = LastIterateCallback(
        sampling=sampling, dataset_size=len(x), delta=args.delta, model="glm", feature_norm=FEATURE_NORM
    )
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=(sampling == "reshuffle"),  # shuffle=False is cyclic, shuffle=True reshuffles every epoch
        callbacks=[accountant],
        verbose=args.verbose,
    )
    logits = model.predict(x_public, batch_size=len(x_public), verbose=0).reshape(-1)
    accuracy = float(np.mean((logits > 0) == (y_public > 0.5)))
    return accountant, accuracy


def main(argv: list[str] | None = None) -> dict[str, LastIterateCallback]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--noise-multiplier", type=float, default=2.0)
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
    clip, learning_rate = plan()
    device = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    print(
        f"breast cancer: {len(data[0])} private / {len(data[2])} public examples, {data[0].shape[1]} features, {device}"
    )
    print(f"C = {clip:g} (clipping never active), learning rate = {learning_rate:.4f}")
    samplings = ["cyclic", "reshuffle"] if args.sampling == "both" else [args.sampling]
    accountants = {}
    for sampling in samplings:
        start = time.perf_counter()
        accountant, accuracy = train(sampling, args, data)
        accountants[sampling] = accountant
        derived = accountant.assumptions
        result = accountant.result
        baseline = epsilon("composition", args.delta, config=accountant.config, assumptions=derived)
        print(
            f"[{sampling}] test accuracy {accuracy:.3f} ({time.perf_counter() - start:.1f}s)\n"
            f"    derived: M = {derived.smoothness:.4f}, lam = {derived.strong_convexity:g}, gradient norms within "
            f"clip: {derived.gradient_norms_within_clip}\n"
            f"    best:        {result}\n"
            f"    composition: {baseline}"
        )
    print()
    derived = accountants[samplings[0]].assumptions
    print(
        compute_last_iterate_privacy_statement(
            number_of_examples=len(data[0]),
            batch_size=args.batch_size,
            num_epochs=args.epochs,
            noise_multiplier=args.noise_multiplier,
            delta=args.delta,
            l2_norm_clip=clip,
            learning_rate=learning_rate,
            sampling=samplings[0],
            smoothness=derived.smoothness,
            strong_convexity=derived.strong_convexity,
            gradient_norms_within_clip=derived.gradient_norms_within_clip,
        )
    )
    return accountants


if __name__ == "__main__":
    main()
