r"""DP-SGD with random allocation (balls in bins) in Keras: every example once per epoch, in a secret random step.

    python examples/tf_privacy_random_allocation.py [--epochs 3]

Runs on the CPU in under a minute. The same small CNN as examples/tf_privacy_cnn.py (TF Privacy's DP Adam,
scikit-learn's bundled 8x8 digits), fed two ways: a shuffled ``tf.data`` pipeline (every example once per
epoch, a new permutation every epoch: its valid number has no amplification by sampling), and a
``RandomAllocationDataset``: every epoch, each example is put in one of the epoch's ``t = ceil(n / b)`` steps,
drawn uniformly at random, secretly and afresh every epoch (docs/sampling.md, "Random allocation"). Its valid
number is close to the Poisson number TF Privacy's statement prints, which no Keras ``fit`` earns.

TF Privacy's optimizers divide each step's noisy sum by the rows they get, and random allocation's batches vary
in size: the dataset pads every batch to one length ``L`` with rows of weight 0, which add nothing (the
callback checks it at every step), so the divisor is ``L``; a batch above ``L`` (probability 1e-9 over the
run) would be cut, and the delta carries that probability (docs/derivations/fixed-length-batches.md). Padding
costs compute: ``L / b`` is about 1.9 at b = 64, less for larger batches.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

N, BATCH = 1792, 64
DELTA = 1e-5


def _model(tf: Any, tfp: Any) -> Any:
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
    return model


def main(epochs: int = 3) -> dict[str, Any]:

    import tensorflow as tf
    import tensorflow_privacy as tfp
    from sklearn.datasets import load_digits

    import lastiter_plugins as lp
    from lastiter_plugins.adapters.tf_privacy import LastIterateCallback, RandomAllocationDataset

    tf.get_logger().setLevel("ERROR")
    digits = load_digits()
    images = (digits.images[:N, :, :, None] / 16.0).astype("float32")
    labels = digits.target[:N]

    shuffled = LastIterateCallback(sampling="reshuffle", dataset_size=N, delta=DELTA)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(N).batch(BATCH).prefetch(1)
    _model(tf, tfp).fit(data, epochs=epochs, callbacks=[shuffled], verbose=0)

    allocation = RandomAllocationDataset(images, labels, batch_size=BATCH, epochs=epochs)
    accountant = LastIterateCallback(sampling="random_allocation", dataset_size=N, delta=DELTA)
    _model(tf, tfp).fit(allocation.dataset, epochs=epochs, callbacks=[accountant], verbose=0)
    print(accountant.report)
    # the shuffled pipeline's rows are replace-one: this run's number in that relation, for a like-for-like comparison
    same_relation = lp.epsilon("best", DELTA, config=accountant.config.replace(relation="replace_one"))
    print(
        f"The same model on a shuffled tf.data pipeline: epsilon = {shuffled.epsilon:.4g} ({shuffled.result.relation}, "
        f"every iterate); this run under {same_relation.relation}: {same_relation.epsilon:.4g}."
    )
    return {
        "accountant": accountant,
        "allocation": allocation,
        "shuffled": shuffled.epsilon,
        "replace_one": same_relation.epsilon,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    main(parser.parse_args().epochs)
