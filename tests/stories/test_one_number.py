"""One number on every route (issue "One number on every route", item 1), a story test.

One pipeline, logistic regression on the linear-model route (features clipped to norm 1, a
bias, plain SGD, a fixed order, clipping active), trained for real with Opacus and with Keras /
TF Privacy, and described to the API, the CLI, compare and dp-accounting's event with the
declarations the hosts derive (``clipped_loss_convex_smooth``, the smoothness of the clipped
logistic loss). Every route gives the same ``best``: computed by each, compared with each other,
never pinned.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins.cli import main

HAVE_OPACUS = importlib.util.find_spec("opacus") is not None
HAVE_TF = importlib.util.find_spec("tensorflow_privacy") is not None

N, B, DIM, EPOCHS, LR, Z, C, A = 120, 20, 5, 2, 0.5, 1.0, 1.0, 1.0
DELTA = 1e-5


def _data():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(N, DIM)) * 2.0).astype("float32")  # many rows beyond the feature clip
    y = (x[:, 0] > 0).astype("float32")
    return x, y


def _core_params(assumptions: lp.LossAssumptions) -> dict:
    return dict(
        dataset_size=N,
        batch_size=B,
        noise_multiplier=Z,
        clip_norm=C,
        learning_rate=LR,
        epochs=EPOCHS,
        sampling="cyclic",
        smoothness=assumptions.smoothness,
        strong_convexity=assumptions.strong_convexity,
        clipped_loss_convex_smooth=assumptions.clipped_loss_convex_smooth,
        gradient_norms_within_clip=assumptions.gradient_norms_within_clip,
    )


def _opacus_run():
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lastiter_plugins.adapters import opacus as lo

    torch.manual_seed(0)
    name = lo.register("one-number", force=True, sampling="cyclic", dataset_size=N, learning_rate=LR, model="glm",
                       loss="logistic", feature_norm=A)  # fmt: skip
    model = nn.Sequential(lo.FeatureNormClip(A), nn.Linear(DIM, 1))
    engine = PrivacyEngine()
    lo.attach(engine, name)
    x, y = _data()
    criterion = nn.BCEWithLogitsLoss()
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        criterion=criterion,
        data_loader=DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B),
        noise_multiplier=Z,
        max_grad_norm=C,
        poisson_sampling=False,
    )
    for _ in range(EPOCHS):
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb).squeeze(-1), yb).backward()
            optimizer.step()
    return engine.accountant


def _keras_run():
    import tensorflow as tf
    from tensorflow_privacy.privacy.optimizers import dp_optimizer_keras as tfp_privacy

    from lastiter_plugins.adapters import tf_privacy as ltf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((DIM,)), ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)])
    optimizer = tfp_privacy.DPKerasSGDOptimizer(l2_norm_clip=C, noise_multiplier=Z, num_microbatches=None,
                                                learning_rate=LR)  # fmt: skip
    model.compile(optimizer=optimizer, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="none"))
    callback = ltf.LastIterateCallback(sampling="cyclic", dataset_size=N, delta=DELTA, model="glm", feature_norm=A)
    x, y = _data()
    model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, callbacks=[callback], verbose=0)
    return callback


@pytest.mark.skipif(not (HAVE_OPACUS and HAVE_TF), reason="needs Opacus and TF Privacy (the [all] extra)")
def test_every_route_gives_the_same_best(capsys):
    accountant = _opacus_run()
    opacus_result = accountant.epsilon_result(DELTA)
    assumptions = accountant.registration.assumptions
    assert assumptions.clipped_loss_convex_smooth  # the route the hosts derived: clipping may be active
    params = _core_params(assumptions)
    numbers = {
        "opacus accountant": opacus_result.epsilon,
        "opacus report": next(row.epsilon for row in accountant.report(DELTA).rows if row.bound == lp.BEST),
        "api": lp.epsilon("best", DELTA, **params).epsilon,
    }

    import tensorflow as tf

    callback = _keras_run()
    numbers["keras callback"] = callback.epsilon
    assert callback.assumptions == assumptions  # both hosts derived the same constants
    from lastiter_plugins.adapters.tf_privacy import compute_last_iterate_privacy_statement

    statement = compute_last_iterate_privacy_statement(
        number_of_examples=N, batch_size=B, num_epochs=EPOCHS, noise_multiplier=Z, delta=DELTA, l2_norm_clip=C,
        learning_rate=LR, sampling="cyclic", model="glm", feature_norm=A,
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
    )  # fmt: skip
    best_line = next(line for line in statement.splitlines() if line.strip().startswith("best ") and "via" in line)
    numbers["keras statement"] = float(best_line.split()[1])

    flags = ["--dataset-size", str(N), "--batch-size", str(B), "--noise-multiplier", str(Z), "--clip-norm", str(C),
             "--learning-rate", str(LR), "--epochs", str(EPOCHS), "--sampling", "cyclic", "--smoothness",
             repr(assumptions.smoothness), "--clipped-loss-convex-smooth"]  # fmt: skip
    assert main(["epsilon", "--json", "--delta", str(DELTA), *flags]) == 0
    numbers["cli epsilon"] = json.loads(capsys.readouterr().out)["epsilon"]
    assert main(["compare", "--format", "json", "--delta", str(DELTA), *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    numbers["cli compare"] = next(b["epsilon"] for b in data["best"] if b["declared"])
    numbers["compare (API)"] = lp.compare.compare(DELTA, lower_bound=False, **params).best[0].epsilon

    from dp_accounting import NeighboringRelation

    from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent

    event_params = {k: v for k, v in params.items() if k != "epochs"}
    event = LastIterateDpSgdEvent(steps=EPOCHS * (N // B), **event_params)
    dpa = LastIterateAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    dpa.compose(event)
    numbers["dp-accounting"] = dpa.get_epsilon(DELTA)

    reference = numbers["api"]
    assert reference < lp.epsilon("best", DELTA, **{**params, "clipped_loss_convex_smooth": False}).epsilon
    for route, value in numbers.items():
        assert value is not None, route
        assert value == pytest.approx(reference, rel=1e-4 if route == "keras statement" else 1e-12), (
            route,
            numbers,
        )
