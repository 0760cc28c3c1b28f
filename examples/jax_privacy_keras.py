r"""Last-iterate accounting for jax_privacy's Keras API (Keras 3 on JAX): logistic regression on synthetic data,
three ways of running ``fit``, each with the valid epsilon of what ran and jax_privacy's own number beside it.

    KERAS_BACKEND=jax python examples/jax_privacy_keras.py [--epochs 4]

Needs ``pip install "lastiter-plugins[jax]"`` (Python >= 3.11; no dataset download: the data are drawn here).
Runs on the CPU in about half a minute.

1. ``DPKerasConfig``'s default: ``fit`` shuffles the arrays every epoch, while jax_privacy's number (what it
   calibrates the noise with) composes Poisson-sampled steps: NOT VALID for the run. The valid number for the
   shuffled run is beside it, and :func:`calibrate` gives the noise that meets the target for that run.
2. ``DPKerasConfig(poisson_sampling_in_fit=True)``: ``fit`` samples by Poisson, jax_privacy's number is valid.
3. The certified linear model (``model_kind="glm"``): the features are clipped to norm A before ``fit``, the
   model is one ``Dense(1)`` on ``BinaryCrossentropy(from_logits=True)``, plain SGD in a fixed order
   (``shuffle=False``): the adapter derives the loss constants, and a last-iterate row certifies the final model.

Its output, as run for docs/jax_privacy.md ("The example"): the three reports and the calibration, numbers that
tests/adapters/jax_privacy/test_example.py checks against the core.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras
import numpy as np
from jax_privacy import keras_api

from lastiter_plugins.adapters import jax_privacy as ljp
from lastiter_plugins.feature_clip import clip_features

N, DIM, BATCH, DELTA = 512, 8, 64, 1e-5
CLIP, NOISE, LEARNING_RATE, FEATURE_NORM = 1.0, 1.0, 0.5, 1.0
TARGET = 8.0


def data(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Features clipped to norm A (lastiter_plugins.feature_clip) and labels in {0, 1}."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, DIM)).astype("float32")
    y = (x @ rng.normal(size=DIM) + 0.5 * rng.normal(size=N) > 0).astype("float32")[:, None]
    return clip_features(x, FEATURE_NORM), y


def config(epochs: int, *, poisson: bool = False, noise: float = NOISE) -> keras_api.DPKerasConfig:
    return keras_api.DPKerasConfig(
        epsilon=1e3,  # jax_privacy's budget for its own accountant (the numbers below are what counts)
        delta=DELTA,
        clipping_norm=CLIP,
        batch_size=BATCH,
        gradient_accumulation_steps=1,
        train_steps=epochs * (N // BATCH),
        train_size=N,
        noise_multiplier=noise,
        poisson_sampling_in_fit=poisson,
        rescale_to_unit_norm=False,
        seed=None if poisson else 0,  # a fixed public seed would make Poisson draws reproducible: none
    )


def train(dp: keras_api.DPKerasConfig, epochs: int, *, glm: bool = False, shuffle: bool = True) -> ljp.KerasAccountant:
    keras.utils.set_random_seed(1)
    model = keras_api.make_private(keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1)]), dp)
    relation = "add_or_remove_one" if dp.poisson_sampling_in_fit else "replace_one"
    if glm:
        accountant = ljp.watch(model, delta=DELTA, relation=relation, model_kind="glm", loss="binary_logistic",
                               feature_norm=FEATURE_NORM)  # fmt: skip
    else:
        accountant = ljp.watch(model, delta=DELTA, relation=relation)
    model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=epochs, shuffle=shuffle, verbose=0)
    return accountant


def main(argv: list[str] | None = None) -> dict[str, ljp.KerasAccountant]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args(argv)
    runs = {}
    print("1. fit shuffles (DPKerasConfig's default):")
    runs["shuffled"] = train(config(args.epochs), args.epochs)
    print(runs["shuffled"].report())
    found = ljp.calibrate(config(args.epochs), TARGET, relation="replace_one", learning_rate=LEARNING_RATE)
    print(
        f"   noise multiplier for epsilon <= {TARGET} on this shuffled run: {found.noise_multiplier:.4g} "
        f"(epsilon {found.result.epsilon:.4g} via {found.result.winner}); jax_privacy's number for it: "
        f"{found.host.epsilon:.4g}, NOT VALID"
    )
    print("2. poisson_sampling_in_fit=True:")
    runs["poisson"] = train(config(args.epochs, poisson=True), args.epochs)
    print(runs["poisson"].report())
    print("3. the certified linear model, fixed order:")
    runs["glm"] = train(config(args.epochs), args.epochs, glm=True, shuffle=False)
    print(runs["glm"].report())
    return runs


if __name__ == "__main__":
    main()
