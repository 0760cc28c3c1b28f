"""One number on every route (issue "One number on every route", item 1), a story test.

One pipeline, logistic regression on the linear-model route (features clipped to norm 1, a
bias, plain SGD, a fixed order, clipping active), trained for real with Opacus and with Keras /
TF Privacy, and described to the API, the CLI, compare and dp-accounting's event with the
declarations the hosts derive (``clipped_loss_convex_smooth``, the smoothness of the clipped
logistic loss). Every route gives the same ``best``: computed by each, compared with each other,
never pinned. jax_privacy (Keras 3 on JAX) cannot share an environment with TF Privacy: its route is
compared with the routes of its own environment (.venv-jax, scripts/test_jax.sh).
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
HAVE_JAX_PRIVACY = importlib.util.find_spec("jax_privacy") is not None

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
    assert main(["epsilon", "--format", "json", "--delta", str(DELTA), *flags]) == 0
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


# ---------------------------------------------------------------- one relation (issue 36, item 1)

#: A Poisson pipeline as Opacus runs it: n examples, a loader of batch_size B (sample rate 1/len(loader)),
#: noise Z, plain SGD at LR, no declaration (best: the PLD of the Poisson-sampled Gaussian).
PN, PB, PZ, PEPOCHS = 120, 20, 1.1, 2
FUTURE = r"relation left out with sampling='poisson': accounted under add_or_remove_one"


def _opacus_poisson_run(n: int, batch: int):
    import torch
    from opacus import PrivacyEngine
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lastiter_plugins.adapters import opacus as lo

    torch.manual_seed(0)
    with pytest.warns(FutureWarning, match=FUTURE):  # the relation left out: Poisson's default
        name = lo.register(f"one-relation-{n}", force=True, sampling="poisson", dataset_size=n, learning_rate=LR)
    engine = PrivacyEngine()
    lo.attach(engine, name)
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(n, DIM)).astype("float32"))
    y = (x[:, 0] > 0).float()
    criterion = nn.BCEWithLogitsLoss()
    model = nn.Linear(DIM, 1)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        criterion=criterion,
        data_loader=DataLoader(TensorDataset(x, y), batch_size=batch),
        noise_multiplier=PZ,
        max_grad_norm=C,
        poisson_sampling=True,
    )
    for _ in range(PEPOCHS):
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb).squeeze(-1), yb).backward()
            optimizer.step()
    return engine.accountant, len(loader)


def _cli(capsys, *argv: str) -> tuple[dict, str]:
    capsys.readouterr()  # what training printed (the hosts' own warnings) is not the command's
    assert main([*argv, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


@pytest.mark.skipif(not (HAVE_OPACUS and HAVE_TF), reason="needs Opacus and TF Privacy (the [all] extra)")
def test_one_relation_for_a_poisson_pipeline_on_every_route(capsys):
    """The same Poisson pipeline, the relation left out everywhere: every route accounts it under
    add_or_remove_one (Opacus' and dp-accounting's convention), says so, warns where the default changed
    (0.2.0 used replace_one), and gives the same number."""
    from lastiter_plugins.config import poisson_batch_size

    accountant, batches = _opacus_poisson_run(PN, PB)
    rate = 1 / batches
    opacus_result = accountant.epsilon_result(DELTA)
    assert accountant.training_config().batch_size == poisson_batch_size(PN, rate) == PB
    params = dict(dataset_size=PN, batch_size=PB, noise_multiplier=PZ, steps=PEPOCHS * batches, learning_rate=LR,
                  sampling="poisson")  # fmt: skip
    flags = ["--dataset-size", str(PN), "--sample-rate", repr(rate), "--sigma", str(PZ), "--epochs", str(PEPOCHS),
             "--learning-rate", str(LR), "--sampling", "poisson"]  # fmt: skip
    results = {"opacus accountant": opacus_result}
    numbers = {"opacus report": next(r.epsilon for r in accountant.report(DELTA).rows if r.bound == lp.BEST)}
    assert "add_or_remove_one neighbours" in str(accountant.report(DELTA))  # the answer names it

    with pytest.warns(FutureWarning, match=FUTURE):
        results["api"] = lp.epsilon("best", DELTA, **params)
    with pytest.warns(FutureWarning, match=FUTURE):
        assert lp.build(**params)[0].relation is lp.Relation.ADD_OR_REMOVE_ONE
    with pytest.warns(FutureWarning, match=FUTURE):
        comparison = lp.compare.compare(DELTA, lower_bound=False, **params)
    declared = comparison.best[0]
    assert declared.declared and declared.relation == "add_or_remove_one"
    numbers["compare (API)"] = declared.epsilon
    with pytest.warns(FutureWarning, match=FUTURE):
        calibrated = lp.calibrate_noise(
            "best", opacus_result.epsilon, DELTA, **{k: v for k, v in params.items() if k != "noise_multiplier"}
        )
    assert calibrated.relation is lp.Relation.ADD_OR_REMOVE_ONE and "add_or_remove_one neighbours" in str(calibrated)
    assert calibrated.noise_multiplier == pytest.approx(PZ, rel=2e-3) and calibrated.epsilon <= opacus_result.epsilon
    with pytest.warns(FutureWarning, match=FUTURE):
        suggestions = lp.advise(DELTA, **params)
    assert any(s.relation is lp.Relation.ADD_OR_REMOVE_ONE for s in suggestions)

    cli_warning = "lastiter: warning: --relation left out with sampling='poisson': accounted under add_or_remove_one"
    for command, extra, key in [
        ("epsilon", [], None),
        ("compare", [], "compare"),
        ("advise", ["--top", "1"], "best"),
        ("calibrate", ["--target-epsilon", repr(opacus_result.epsilon)], None),
    ]:
        argv = (
            flags
            if command != "calibrate"
            else [f for i, f in enumerate(flags) if "--sigma" not in flags[i - 1 : i + 1]]
        )
        data, err = _cli(capsys, command, "--delta", str(DELTA), *extra, *argv)
        assert err.count(cli_warning) == 1, (command, err)
        if key == "compare":
            (data,) = [b for b in data["best"] if b["declared"]]
        elif key == "best":
            data = data["best"]
        assert data["relation"] == "add_or_remove_one", command
        if command == "calibrate":
            assert data["noise_multiplier"] == calibrated.noise_multiplier
        else:
            numbers[f"cli {command}"] = data["epsilon"]

    from dp_accounting import NeighboringRelation

    from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent

    event = LastIterateDpSgdEvent(**{k: v for k, v in params.items() if k != "sampling"}, sampling="poisson")
    with pytest.warns(FutureWarning, match=r"LastIterateAccountant\(\) without neighboring_relation"):
        dpa = LastIterateAccountant()
    dpa.compose(event)
    assert dpa.neighboring_relation is NeighboringRelation.ADD_OR_REMOVE_ONE
    assert "under add_or_remove_one neighbours" in dpa.statement(DELTA)
    numbers["dp-accounting"] = dpa.get_epsilon(DELTA)

    from lastiter_plugins.adapters.tf_privacy import LastIterateCallback, compute_last_iterate_privacy_statement

    statement = compute_last_iterate_privacy_statement(
        number_of_examples=PN, batch_size=PB, num_epochs=PEPOCHS, noise_multiplier=PZ, delta=DELTA, l2_norm_clip=C,
        learning_rate=LR, sampling="poisson",
    )  # fmt: skip
    first = statement.index("Example-level DP with")  # the default relation's section comes first
    assert statement[first:].startswith("Example-level DP with add-or-remove-one adjacency")
    best_line = next(line for line in statement[first:].splitlines() if line.strip().startswith("best "))
    numbers["keras statement"] = float(best_line.split()[1])
    # the Keras callback runs epoch schemes only; their default is replace_one, unchanged: no warning
    with pytest.raises(ValueError, match="sampling must be cyclic, shuffle_once, reshuffle or random_allocation"):
        LastIterateCallback(sampling="poisson", dataset_size=PN, delta=DELTA)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback = LastIterateCallback(sampling="reshuffle", dataset_size=PN, delta=DELTA)
    assert callback.relation is lp.Relation.REPLACE_ONE

    for route, result in results.items():
        assert result.relation is lp.Relation.ADD_OR_REMOVE_ONE, route
        assert "add_or_remove_one neighbours" in str(result), route
        numbers[route] = result.epsilon
    reference = opacus_result.epsilon
    assert reference < lp.epsilon("best", DELTA, relation="replace_one", **params).epsilon  # the default matters
    for route, value in numbers.items():
        assert value == pytest.approx(reference, rel=1e-3 if route == "keras statement" else 1e-12), (route, numbers)


@pytest.mark.skipif(not HAVE_OPACUS, reason="needs Opacus (the [opacus] extra)")
def test_the_cli_s_sample_rate_gives_the_opacus_adapter_s_number(capsys):
    """n = 125 and batches of 21: Opacus samples at 1/len(loader) = 1/6 and divides by int(n q) = 20; the
    core's b is ceil(n / 6) = 21 (b/n >= q); --sample-rate with that value gives the adapter's number."""
    accountant, batches = _opacus_poisson_run(125, 21)
    expected = accountant.epsilon_result(DELTA)
    flags = ["--dataset-size", "125", "--sample-rate", repr(1 / batches), "--sigma", str(PZ), "--epochs",
             str(PEPOCHS), "--sampling", "poisson", "--relation", "add_or_remove_one", "--delta", str(DELTA)]  # fmt: skip
    data, err = _cli(capsys, "epsilon", *flags)
    assert err == "" and data["epsilon"] == expected.epsilon and data["steps"] == expected.steps == PEPOCHS * 6
    assert accountant.training_config().batch_size == 21
    # the smaller rate int(n q) / n would be optimistic: a smaller number than the run's
    smaller = lp.epsilon("best", DELTA, dataset_size=125, batch_size=20, noise_multiplier=PZ, steps=PEPOCHS * 6,
                         sampling="poisson", relation="add_or_remove_one")  # fmt: skip
    assert smaller.epsilon < expected.epsilon


#: A random-allocation pipeline (no host samples it yet: the core's routes and dp-accounting's event).
ALLOCATION = dict(dataset_size=600, batch_size=60, noise_multiplier=1.5, epochs=5, sampling="random_allocation")


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_random_allocation_gives_the_same_best_on_every_route(capsys, relation):
    """Issue 39: one random-allocation pipeline, its every-iterate number on the API, the CLI (epsilon, compare),
    compare's API, advise (the change from a shuffled loader), calibration (the noise that reaches the number)
    and dp-accounting's event alone in the accountant."""
    from dp_accounting import NeighboringRelation

    from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent
    from tests.support import cli_flags

    params = {**ALLOCATION, "relation": relation}
    api = lp.epsilon("best", DELTA, **params)
    assert api.protects is lp.Protects.EVERY_ITERATE and api.winner.startswith("composition-pld-random-allocation")
    numbers = {"api": api.epsilon}
    assert main(["epsilon", "--format", "json", "--delta", str(DELTA), *cli_flags(params)]) == 0
    numbers["cli epsilon"] = json.loads(capsys.readouterr().out)["epsilon"]
    assert main(["compare", "--format", "json", "--delta", str(DELTA), *cli_flags(params)]) == 0
    numbers["cli compare"] = next(b["epsilon"] for b in json.loads(capsys.readouterr().out)["best"] if b["declared"])
    numbers["compare (API)"] = lp.compare.compare(DELTA, lower_bound=False, **params).best[0].epsilon
    shuffled = {**params, "sampling": "reshuffle", "relation": "replace_one"}
    numbers["advise"] = next(
        s.epsilon for s in lp.advise(DELTA, **shuffled)
        if s.parameters.get("sampling") == "random_allocation" and s.relation.value == relation
    )  # fmt: skip
    event_params = {k: v for k, v in params.items() if k not in ("epochs", "relation")}
    event = LastIterateDpSgdEvent(steps=ALLOCATION["epochs"] * 10, learning_rate=None, **event_params)
    host_relation = {
        "replace_one": NeighboringRelation.REPLACE_ONE,
        "add_or_remove_one": NeighboringRelation.ADD_OR_REMOVE_ONE,
    }
    dpa = LastIterateAccountant(neighboring_relation=host_relation[relation])
    dpa.compose(event)
    numbers["dp-accounting"] = dpa.get_epsilon(DELTA)
    for route, value in numbers.items():
        assert value == pytest.approx(numbers["api"], rel=1e-12), (route, numbers)
    # calibration: the smallest noise reaching the number is the run's own, to the search's precision
    calibrated = lp.calibrate_noise(
        "best", numbers["api"], DELTA, rtol=1e-2, **{k: v for k, v in params.items() if k != "noise_multiplier"}
    )
    assert calibrated.noise_multiplier == pytest.approx(ALLOCATION["noise_multiplier"], rel=2e-2)
    assert calibrated.result.winner == api.winner and calibrated.result.relation is api.relation
    again = lp.epsilon("best", DELTA, **{**params, "noise_multiplier": calibrated.noise_multiplier})
    assert again.epsilon == calibrated.result.epsilon <= numbers["api"]


def _routes_without_hosts(params: dict, capsys) -> dict[str, float]:
    """The API, the CLI (epsilon and compare), compare's API and dp-accounting's event for the pipeline."""
    from dp_accounting import NeighboringRelation

    from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent

    numbers = {"api": lp.epsilon("best", DELTA, **params).epsilon}
    flags = ["--dataset-size", str(N), "--batch-size", str(B), "--noise-multiplier", str(Z), "--clip-norm", str(C),
             "--learning-rate", str(LR), "--epochs", str(EPOCHS), "--sampling", "cyclic", "--smoothness",
             repr(params["smoothness"]), "--clipped-loss-convex-smooth"]  # fmt: skip
    assert main(["epsilon", "--format", "json", "--delta", str(DELTA), *flags]) == 0
    numbers["cli epsilon"] = json.loads(capsys.readouterr().out)["epsilon"]
    assert main(["compare", "--format", "json", "--delta", str(DELTA), *flags]) == 0
    data = json.loads(capsys.readouterr().out)
    numbers["cli compare"] = next(b["epsilon"] for b in data["best"] if b["declared"])
    numbers["compare (API)"] = lp.compare.compare(DELTA, lower_bound=False, **params).best[0].epsilon
    event = LastIterateDpSgdEvent(steps=EPOCHS * (N // B), **{k: v for k, v in params.items() if k != "epochs"})
    dpa = LastIterateAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    dpa.compose(event)
    numbers["dp-accounting"] = dpa.get_epsilon(DELTA)
    return numbers


@pytest.mark.skipif(not HAVE_JAX_PRIVACY, reason="needs jax_privacy (the jax extra: scripts/test_jax.sh, .venv-jax)")
def test_the_jax_privacy_route_gives_the_same_best(capsys, monkeypatch):
    """The same pipeline trained with jax_privacy's Keras API (Keras 3 on JAX): features clipped before fit (the
    adapter checks the array fit receives), shuffle=False, plain SGD; the adapter derives the same constants."""
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    import keras
    from jax_privacy import keras_api

    from lastiter_plugins.adapters import jax_privacy as ljp
    from lastiter_plugins.feature_clip import clip_features

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((DIM,)), keras.layers.Dense(1)])
    config = keras_api.DPKerasConfig(epsilon=1e3, delta=DELTA, clipping_norm=C, batch_size=B,
                                     gradient_accumulation_steps=1, train_steps=EPOCHS * (N // B), train_size=N,
                                     noise_multiplier=Z, rescale_to_unit_norm=False, seed=0)  # fmt: skip
    model = keras_api.make_private(model, config)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one", model_kind="glm", loss="binary_logistic",
                           feature_norm=A)  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    x, y = _data()
    model.fit(clip_features(x, A), y[:, None], batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0)
    assumptions = accountant.assumptions
    assert assumptions.clipped_loss_convex_smooth
    params = _core_params(assumptions)
    numbers = _routes_without_hosts(params, capsys)
    numbers["jax_privacy keras"] = accountant.epsilon()
    numbers["jax_privacy report"] = accountant.report().epsilon
    reference = numbers["api"]
    assert reference < lp.epsilon("best", DELTA, **{**params, "clipped_loss_convex_smooth": False}).epsilon
    for route, value in numbers.items():
        assert value == pytest.approx(reference, rel=1e-12), (route, numbers)
