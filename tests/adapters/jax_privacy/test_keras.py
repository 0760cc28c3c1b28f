"""lastiter_plugins/adapters/jax_privacy (the Keras route): real small models trained with jax_privacy's Keras API on
CPU, each compared with the core's number for the pipeline that ran; jax_privacy's own number beside it, NOT VALID
when fit shuffles (its default); the checks that gate rows or refuse the run; the calibration."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tests.adapters.jax_privacy.support import DELTA, NEEDS_JAX_PRIVACY, logistic_data, regression_data

pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)
import keras
from jax_privacy import keras_api

import lastiter_plugins as lp
from lastiter_plugins.adapters import jax_privacy as ljp
from lastiter_plugins.glm import certify_linear_model

N, B, Z, C, LR = 32, 8, 1.5, 1.0, 0.25
LR32 = float(np.float32(LR))  # the rate Keras stores and applies


def _private_model(dim: int = 3, *, poisson: bool = False, k: int = 1, clip: float = C, seed: int | None = 1,
                   rescale: bool = True, steps: int = 64):  # fmt: skip
    model = keras.Sequential([keras.Input(shape=(dim,)), keras.layers.Dense(1)])
    config = keras_api.DPKerasConfig(
        epsilon=1e4, delta=DELTA, clipping_norm=clip, batch_size=B, gradient_accumulation_steps=k, train_steps=steps,
        train_size=N, noise_multiplier=Z, poisson_sampling_in_fit=poisson, seed=seed, rescale_to_unit_norm=rescale,
    )  # fmt: skip
    return keras_api.make_private(model, config)


def _core(sampling: str, relation: str, steps: int, *, batch_size: int = B, learning_rate: float | None = None,
          clip: float = C, assumptions: lp.LossAssumptions | None = None, update: str = "sgd") -> lp.EpsilonResult:  # fmt: skip
    cfg = lp.TrainingConfig(dataset_size=N, batch_size=batch_size, noise_multiplier=Z, steps=steps, sampling=sampling,
                            learning_rate=learning_rate, clip_norm=clip, relation=relation, update=update)  # fmt: skip
    return lp.epsilon("best", DELTA, config=cfg, assumptions=assumptions or lp.LossAssumptions())


def test_declarations_no_loss_meets_are_refused_at_the_first_fit():
    """issue 41: a real run has real losses: strongly convex with every gradient within the clip and no projection
    is refused before the first step (nothing watched yet: the same accountant takes a possible declaration)."""
    x, y = regression_data(N)
    model = _private_model()
    impossible = lp.LossAssumptions(smoothness=1.0, strong_convexity=0.1, gradient_norms_within_clip=True)
    ljp.watch(model, delta=DELTA, assumptions=impossible)
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    with pytest.raises(lp.NotApplicableError, match=r"no loss meets these declarations: .*strong_convexity=0\.1 "
                                                    r"with gradient_norms_within_clip=True and no projection"):  # fmt: skip
        model.fit(x, y, batch_size=B, epochs=1, verbose=0)


def test_shuffled_fit_is_reshuffle_and_jax_privacys_poisson_number_is_not_valid():
    """The common mistake: DPKerasConfig's default fit shuffles, jax_privacy's number is Poisson's."""
    x, y = regression_data(N)
    model = _private_model()
    accountant = ljp.watch(model, delta=DELTA)  # the relation left out: reshuffle's default, replace-one
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, batch_size=B, epochs=2, verbose=0)
    account = accountant.account()
    assert accountant.steps == 8 and account.config.sampling is lp.Sampling.RESHUFFLE
    assert account.config.relation is lp.Relation.REPLACE_ONE
    expected = _core("reshuffle", "replace_one", 8, learning_rate=LR32)
    assert account.result.epsilon == expected.epsilon and account.result.winner == expected.winner
    host = accountant.host_number()
    assert not host.valid and "Poisson" in host.why_not
    assert host.epsilon < account.result.epsilon / 2  # what jax_privacy would print: far below the valid number
    text = str(accountant.report())
    assert text.startswith(f"epsilon = {expected.epsilon:.4g} at delta = 1e-05 for every iterate; replace_one")
    assert "reshuffle sampling" in text and "Host libraries: NOT VALID here: jax-privacy-poisson" in text


def test_poisson_fit_is_poisson_and_jax_privacys_number_is_valid():
    x, y = regression_data(N)
    model = _private_model(poisson=True)
    accountant = ljp.watch(model, delta=DELTA, relation="add_or_remove_one")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, epochs=2, verbose=0)
    account = accountant.account()
    assert accountant.steps == 2 * (N // B) and account.config.sampling is lp.Sampling.POISSON
    assert account.result.epsilon == _core("poisson", "add_or_remove_one", 8, learning_rate=LR32).epsilon
    host = accountant.host_number()
    assert host.valid
    pld = _core("poisson", "add_or_remove_one", 8, update="any").epsilon
    assert host.epsilon == pytest.approx(pld, rel=0.02)  # the same PLD, another discretisation


def test_a_seeded_poisson_fit_called_twice_draws_the_same_batches_and_is_refused():
    """DPKerasConfig(seed=...) re-seeds jax_privacy's Poisson dataset at every fit call: not independent draws."""
    x, y = regression_data(N)
    model = _private_model(poisson=True, seed=3)
    accountant = ljp.watch(model, delta=DELTA, relation="add_or_remove_one")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(lp.PipelineChangedError, match="independent batches"):
        model.fit(x, y, epochs=1, verbose=0)
    with pytest.raises(lp.PipelineChangedError):
        accountant.epsilon()


@pytest.mark.parametrize("shuffle", [False, "batch"])
def test_linear_model_in_a_fixed_order_gets_the_last_iterate_rows(shuffle):
    """model_kind='glm': logistic regression on clipped features, fixed order (cyclic): the certified assumptions,
    and the core's best for them, a last-iterate row."""
    x, y = logistic_data(N)
    model = _private_model(dim=4, rescale=False)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one", model_kind="glm", loss="binary_logistic",
                           feature_norm=1.0)  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=B, epochs=3, shuffle=shuffle, verbose=0)
    certified = lp.LossAssumptions(
        **certify_linear_model(
            "binary_logistic", feature_norm_bound=1.0, clip_norm=C, bias=True
        ).loss_assumption_kwargs()
    )
    expected = _core("cyclic", "replace_one", 12, learning_rate=LR32, assumptions=certified)
    result = accountant.account().result
    assert result.protects is lp.Protects.FINAL_MODEL and result.sampling is lp.Sampling.CYCLIC
    assert (result.epsilon, result.winner) == (expected.epsilon, expected.winner)
    assert result.epsilon < _core("cyclic", "replace_one", 12, update="any").epsilon


def test_linear_model_refuses_features_beyond_the_declared_norm():
    x, y = logistic_data(N)
    model = _private_model(dim=4, rescale=False)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one", model_kind="glm", loss="binary_logistic",
                           feature_norm=0.5)  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    with pytest.raises(lp.NotApplicableError, match="feature_norm"):
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    assert accountant.steps == 0


def test_adam_and_a_schedule_keep_only_the_every_iterate_rows():
    """A departure removes the rows it breaks (the last-iterate rows), not the run."""
    x, y = logistic_data(N)
    model = _private_model(dim=4, rescale=False)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one", model_kind="glm", loss="binary_logistic",
                           feature_norm=1.0)  # fmt: skip
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0)
    account = accountant.account()
    assert account.result.protects is lp.Protects.EVERY_ITERATE
    assert account.rows_left and all(row.step == 1 and "Adam" in row.fact for row in account.rows_left)
    assert account.result.epsilon == _core("cyclic", "replace_one", 8, update="any").epsilon


def test_a_learning_rate_changed_between_epochs_is_a_departure_from_the_next_step():
    x, y = logistic_data(N)
    model = _private_model(dim=4, rescale=False)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one", model_kind="glm", loss="binary_logistic",
                           feature_norm=1.0)  # fmt: skip
    model.compile(optimizer=keras.optimizers.SGD(LR), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate if epoch == 0 else rate / 2)
    model.fit(x, y, batch_size=B, epochs=2, shuffle=False, verbose=0, callbacks=[halve])
    account = accountant.account()
    assert account.result.protects is lp.Protects.EVERY_ITERATE
    assert {row.step for row in account.rows_left} == {N // B + 1}


def test_gradient_accumulation_inside_passes_is_one_step_on_the_group():
    """k = 2 batches of 8 per update, 4 batches per pass: reshuffle with batches of 16 at noise multiplier z."""
    x, y = regression_data(N)
    model = _private_model(k=2)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one")
    model.compile(optimizer=keras.optimizers.SGD(LR, gradient_accumulation_steps=2), loss="mse")
    model.fit(x, y, batch_size=B, epochs=2, verbose=0)
    cfg = accountant.config()
    assert (accountant.steps, cfg.steps, cfg.batch_size) == (8, 4, 16)
    assert cfg.noise_multiplier == pytest.approx(Z)  # the traced std is z C / (b sqrt(k)) per physical batch
    assert accountant.epsilon() == _core("reshuffle", "replace_one", 4, batch_size=16, learning_rate=LR32).epsilon


def test_gradient_accumulation_with_poisson_batches_counts_the_physical_steps():
    x, y = regression_data(N)
    model = _private_model(poisson=True, k=2)
    accountant = ljp.watch(model, delta=DELTA, relation="add_or_remove_one")
    model.compile(optimizer=keras.optimizers.SGD(LR, gradient_accumulation_steps=2), loss="mse")
    model.fit(x, y, epochs=2, verbose=0)
    cfg = accountant.config()
    assert (cfg.steps, cfg.batch_size, cfg.update) == (8, 8, lp.Update.ANY)
    assert cfg.noise_multiplier == pytest.approx(Z / math.sqrt(2))
    assert not accountant.host_number().valid  # k independent Poisson batches are not one batch of 2b


def test_rescaled_gradients_take_the_learning_rate_over_the_clip():
    """rescale_to_unit_norm (jax_privacy's default) divides the clipped gradients by C: eta = lr / C."""
    x, y = regression_data(N)
    model = _private_model(clip=2.0)
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    model.fit(x, y, batch_size=B, epochs=1, verbose=0)
    assert accountant.mechanism is not None and accountant.mechanism.rescaled
    cfg = accountant.config()
    assert cfg.learning_rate == pytest.approx(LR32 / 2.0) and cfg.clip_norm == 2.0


def test_rules_reading_the_training_loss_are_refused_before_the_first_step():
    x, y = regression_data(N)
    model = _private_model()
    accountant = ljp.watch(model, delta=DELTA, relation="replace_one")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")
    with pytest.raises(lp.NotApplicableError, match="EarlyStopping"):
        model.fit(x, y, batch_size=B, epochs=2, verbose=0, callbacks=[keras.callbacks.EarlyStopping(monitor="loss")])
    assert accountant.steps == 0 and ljp._internals.host_steps(model) == 0


def test_inputs_whose_batches_cannot_be_observed_are_refused():
    x, y = regression_data(N)
    model = _private_model()
    ljp.watch(model, delta=DELTA, relation="replace_one")
    model.compile(optimizer=keras.optimizers.SGD(LR), loss="mse")

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return N // B

        def __getitem__(self, i):
            return x[i * B : (i + 1) * B], y[i * B : (i + 1) * B]

    with pytest.raises(lp.NotApplicableError, match="arrays"):
        model.fit(Batches(), epochs=1, verbose=0)


def test_watch_refuses_a_model_not_made_private_or_already_trained():
    with pytest.raises(ValueError, match="make_private"):
        ljp.watch(
            keras.Sequential([keras.Input(shape=(3,)), keras.layers.Dense(1)]), delta=DELTA, relation="replace_one"
        )


def test_calibration_is_for_the_scheme_fit_runs():
    """The shuffled fit's noise meets the target for reshuffle (jax_privacy's Poisson calibration would not)."""
    config = keras_api.DPKerasConfig(epsilon=8.0, delta=DELTA, clipping_norm=C, batch_size=B,
                                     gradient_accumulation_steps=1, train_steps=16, train_size=N, noise_multiplier=4.0)  # fmt: skip
    found = ljp.calibrate(config, 8.0, relation="replace_one", learning_rate=LR)
    assert found.result.epsilon <= 8.0 and found.result.sampling is lp.Sampling.RESHUFFLE
    again = _core("reshuffle", "replace_one", 16, learning_rate=LR)
    assert again.epsilon > 0
    above = lp.epsilon("best", DELTA, dataset_size=N, batch_size=B, noise_multiplier=found.noise_multiplier * 0.99,
                       steps=16, sampling="reshuffle", relation="replace_one", learning_rate=LR).epsilon  # fmt: skip
    assert above > 8.0  # the smallest noise that meets the target (to 1%)
    assert not found.host.valid and found.host.epsilon < 8.0
    applied = found.apply(config)
    assert applied.noise_multiplier == found.noise_multiplier
    poisson = dataclasses.replace(config, poisson_sampling_in_fit=True)
    assert ljp.calibrate(poisson, 8.0, relation="add_or_remove_one").host.valid
    impossible = lp.LossAssumptions(smoothness=1.0, strong_convexity=0.1, gradient_norms_within_clip=True)
    with pytest.raises(
        lp.NotApplicableError, match=r"no loss meets these declarations: .*Found them declared to calib"
    ):
        ljp.calibrate(config, 8.0, relation="replace_one", learning_rate=LR, assumptions=impossible)
