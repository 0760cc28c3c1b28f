r"""What a deep network gets: a small CNN trained with TF Privacy's DP Adam on scikit-learn's bundled 8x8 digits
(no download), fed by a shuffled ``tf.data`` pipeline, accounted by ``LastIterateCallback``.

    python examples/tf_privacy_cnn.py [--epochs 3]

Runs on the CPU in about a minute. No loss constant is declared (none is known for a CNN) and the update is
Adam, which no last-iterate bound analyses: the callback keeps the rows that cover any update computed from the
noisy clipped gradients, the every-iterate composition of the run's sampler (here ``reshuffle``: the pipeline
shuffles all examples afresh every epoch, which the callback reads from the dataset's transformations), and its
report says which rows left and why. Beside it, what TF Privacy's own statement would print for this run: its
Poisson number assumes a sampling fit does not do, and is several times smaller than the valid one.

The routes to a smaller valid number are the sampling (Poisson sampling amplifies: Opacus'
``poisson_sampling=True``; Keras' fit passes over the data in epochs) and a linear head on frozen features
(``model="glm"``: examples/tf_privacy_logistic_regression.py), whose last-iterate bounds do not grow with the
epochs.

The 1792 private examples (of 1797; 1792 = 28 x 64, so the batch size divides the dataset, as the callback
requires) are the first ones of the bundled set; the remaining 5 are not used.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

N, BATCH = 1792, 64
DELTA = 1e-5


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args(argv)

    import tensorflow as tf
    import tensorflow_privacy as tfp
    from sklearn.datasets import load_digits

    from lastiter_plugins.adapters.tf_privacy import LastIterateCallback

    tf.get_logger().setLevel("ERROR")
    digits = load_digits()
    images = (digits.images[:N, :, :, None] / 16.0).astype("float32")
    labels = digits.target[:N]
    data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(N).batch(BATCH).prefetch(1)

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8, 8, 1)),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Conv2D(16, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10),
        ]
    )
    model.compile(
        optimizer=tfp.VectorizedDPKerasAdamOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.005),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
        metrics=["accuracy"],
    )
    accountant = LastIterateCallback(sampling="reshuffle", dataset_size=N, delta=DELTA)
    history = model.fit(data, epochs=args.epochs, callbacks=[accountant], verbose=0)
    print(f"training accuracy after {args.epochs} epochs: {history.history['accuracy'][-1]:.3f}")
    print(accountant.report)
    return accountant


if __name__ == "__main__":
    main()
