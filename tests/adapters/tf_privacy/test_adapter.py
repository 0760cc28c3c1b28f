"""TF Privacy adapter: the Keras callback's epsilon equals the core's, every
refusal fires before the first step, the projection holds, the statement says
what it must."""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
tfp_privacy = pytest.importorskip("tensorflow_privacy")

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters.tf_privacy import (  # noqa: E402
    AccountingError,
    LastIterateCallback,
    ProjectionCallback,
    compute_last_iterate_privacy_statement,
)
from lastiter_plugins.adapters.tf_privacy import _statement as statement_module  # noqa: E402
from tests.support import ROOT, quiet_single_threaded  # noqa: E402

quiet_single_threaded(tf)

N, B, DIM = 64, 16, 4
DELTA = 1e-5
Z, C, LR = 1.3, 1.0, 0.5
# What the compiled step uses: clip float32(C), noise std float32(z C) on the clipped sum.
C_RUN = float(np.float32(C))
Z_RUN = float(np.float32(Z * C)) / C_RUN


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N + 16, DIM)).astype("float32")
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = (x[:, 0] > 0).astype("float32")
    return x, y


def dp_sgd(**changes):
    kwargs = dict(l2_norm_clip=C, noise_multiplier=Z, num_microbatches=None, learning_rate=LR)
    kwargs.update(changes)
    return tfp_privacy.DPKerasSGDOptimizer(**kwargs)


def make_model(optimizer=None, **dense):
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(DIM,), use_bias=False, **dense)])
    model.compile(
        optimizer=optimizer if optimizer is not None else dp_sgd(),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
    )
    return model


def accountant(**changes):
    kwargs = dict(sampling="cyclic", dataset_size=N, delta=DELTA, smoothness=0.25, gradient_norms_within_clip=True)
    kwargs.update(changes)
    return LastIterateCallback(**kwargs)


def core(bound, steps, sampling, update="sgd", **assumptions):
    config = lp.TrainingConfig(
        dataset_size=N,
        batch_size=B,
        noise_multiplier=Z_RUN,
        steps=steps,
        sampling=sampling,
        learning_rate=LR if update == "sgd" else None,
        clip_norm=C_RUN,
        update=update,
    )
    defaults = dict(smoothness=0.25, gradient_norms_within_clip=True)
    defaults.update(assumptions)
    return lp.epsilon(bound, DELTA, config=config, assumptions=lp.LossAssumptions(**defaults))


# ---------------------------------------------------------------- epsilon == core


@pytest.mark.parametrize(
    ("optimizer_class", "sampling", "bound"),
    [
        ("DPKerasSGDOptimizer", "cyclic", "best"),
        ("VectorizedDPKerasSGDOptimizer", "reshuffle", "best"),
        ("DPKerasSGDOptimizer", "cyclic", "kong-ribero-cyclic"),
    ],
    ids=["generic-cyclic-best", "vectorized-reshuffle-best", "generic-cyclic-kong-ribero"],
)
def test_epsilon_equals_core_and_reaches_logs(data, capsys, optimizer_class, sampling, bound):
    x, y = data
    optimizer = getattr(tfp_privacy, optimizer_class)(l2_norm_clip=C, noise_multiplier=Z, learning_rate=LR)
    model = make_model(optimizer)
    cb = accountant(sampling=sampling, bound=bound)
    history = model.fit(
        x[:N], y[:N], batch_size=B, epochs=2, shuffle=sampling == "reshuffle", callbacks=[cb], verbose=2
    )
    steps_per_epoch = N // B
    assert cb.steps == 2 * steps_per_epoch == int(optimizer.iterations.numpy())
    assert cb.optimizer_settings.noise_multiplier == Z_RUN
    assert cb.optimizer_settings.l2_norm_clip == C
    assert cb.config.batch_size == B and cb.config.dataset_size == N and cb.config.learning_rate == LR
    expected = [core(bound, (e + 1) * steps_per_epoch, sampling).epsilon for e in range(2)]
    assert history.history["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert cb.epsilon == pytest.approx(expected[-1], rel=1e-12)
    keyword = lp.epsilon(
        bound,
        DELTA,
        dataset_size=N,
        batch_size=B,
        noise_multiplier=Z_RUN,
        clip_norm=C_RUN,
        learning_rate=LR,
        steps=2 * steps_per_epoch,
        sampling=sampling,
        smoothness=0.25,
        gradient_norms_within_clip=True,
    ).epsilon
    assert cb.epsilon == pytest.approx(keyword, rel=1e-12)
    assert cb.result.relation is lp.Relation.REPLACE_ONE
    assert "epsilon:" in capsys.readouterr().out  # Keras' progress output shows it
    # The epsilon grows with the steps: the second epoch's value is not the first's.
    assert expected[1] > expected[0]


def test_validation_split_counts_only_training_examples(data):
    x, y = data  # N + 16 rows; validation_split=0.2 keeps 64 = N for training
    model = make_model()
    cb = accountant(dataset_size=N)
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, validation_split=0.2, callbacks=[cb], verbose=0)
    assert cb.fit_settings.dataset_size == N
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic").epsilon, rel=1e-12)


def test_epsilon_before_training_is_refused():
    with pytest.raises(AccountingError, match="no optimizer step has been counted yet"):
        _ = accountant().epsilon


# ---------------------------------------------------------------- refusals


def _schedule():
    return tf.keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=10, decay_rate=0.9)


OPTIMIZER_REFUSALS = [
    ("plain-sgd", lambda: tf.keras.optimizers.legacy.SGD(0.1), "must be one of TF Privacy's DP Keras optimizers"),
    ("callable-lr", lambda: dp_sgd(learning_rate=lambda: 0.1), "a callable may compute the rate from anything"),
    ("microbatches", lambda: dp_sgd(num_microbatches=4), r"num_microbatches must be None or equal to batch_size = 16"),
    ("accumulation", lambda: dp_sgd(gradient_accumulation_steps=2), "gradient_accumulation_steps must be 1"),
    ("transformers", lambda: dp_sgd(gradient_transformers=[lambda gv: gv]), "gradient_transformers must be empty"),
]


@pytest.mark.parametrize(
    ("make_optimizer", "fragment"),
    [case[1:] for case in OPTIMIZER_REFUSALS],
    ids=[case[0] for case in OPTIMIZER_REFUSALS],
)
def test_optimizer_refusals_before_any_step(data, make_optimizer, fragment):
    x, y = data
    model = make_model(make_optimizer())
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(AccountingError, match=fragment):
        model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[accountant()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_microbatch_message_explains_the_sensitivity(data):
    x, y = data
    with pytest.raises(AccountingError) as caught:
        make_model(dp_sgd(num_microbatches=4)).fit(
            x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[accountant()], verbose=0
        )
    message = str(caught.value)
    assert "microbatches of 4 examples" in message
    assert "clips the mean gradient of each microbatch" in message
    assert "2*eta*C/4, not 2*eta*C/16" in message


def test_num_microbatches_equal_to_batch_size_is_accepted(data):
    x, y = data
    cb = accountant()
    make_model(dp_sgd(num_microbatches=B)).fit(
        x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0
    )
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic").epsilon, rel=1e-12)


FIT_REFUSALS = [
    ("cyclic-vs-shuffle-true", {}, dict(shuffle=True), "sampling must be reshuffle for fit\\(shuffle=True\\)"),
    ("shuffle-once-vs-shuffle-true", dict(sampling="shuffle_once"), dict(shuffle=True), "sampling must be reshuffle"),
    ("shuffle-batch", {}, dict(shuffle="batch"), "shuffle='batch' keeps the batches"),
    ("dataset-size", dict(dataset_size=N + 1), {}, "dataset_size must equal the number of examples fit trains on = 64"),
    ("short-last-batch", {}, dict(batch_size=24), "batch_size must divide dataset_size = 64"),
    ("steps-per-epoch", {}, dict(steps_per_epoch=2), "steps_per_epoch must be None"),
    (
        "sample-weight",
        {},
        dict(sample_weight=np.r_[np.ones(N - 1), 2.0]),
        r"sample_weight and class_weight must be None or all 1.*Found sample_weight with values in \[1, 2\]",
    ),
    (
        "class-weight",
        {},
        dict(class_weight={0: 1.0, 1: 0.5}),
        r"sample_weight and class_weight must be None or all 1.*Found class_weight=\{0: 1.0, 1: 0.5\}",
    ),
    ("diameter-without-projection", dict(diameter=2.0), {}, "needs exactly one ProjectionCallback"),
    (
        "projection-larger-than-declared",
        dict(diameter=1.0),
        dict(callbacks=[ProjectionCallback(2.0)]),
        "diameter must be >= the ProjectionCallback's diameter = 2",
    ),
    (
        "projection-undeclared",
        {},
        dict(callbacks=[ProjectionCallback(2.0)]),
        "diameter must be declared when a ProjectionCallback is used",
    ),
    (
        "two-projections",
        dict(diameter=2.0),
        dict(callbacks=[ProjectionCallback(2.0), ProjectionCallback(2.0)]),
        "Found 2",
    ),
]


@pytest.mark.parametrize(
    ("cb_changes", "fit_changes", "fragment"),
    [case[1:] for case in FIT_REFUSALS],
    ids=[case[0] for case in FIT_REFUSALS],
)
def test_fit_refusals_before_any_step(data, cb_changes, fit_changes, fragment):
    x, y = data
    model = make_model()
    fit = dict(batch_size=B, epochs=1, shuffle=False, verbose=0)
    fit.update(fit_changes)
    fit["callbacks"] = [accountant(**cb_changes), *fit.get("callbacks", [])]
    with pytest.raises(ValueError, match=fragment):
        model.fit(x[:N], y[:N], **fit)
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.parametrize(
    "weights",
    [
        dict(sample_weight=np.ones(N)),
        dict(class_weight={0: 1.0, 1: 1.0}),
        dict(sample_weight=np.ones(N), class_weight={0: 1, 1: 1}),
    ],
    ids=["sample-weight-ones", "class-weight-ones", "both"],
)
def test_weights_that_are_all_one_are_accepted_with_the_same_number(data, weights):
    # Weights of 1 leave every per-example loss, hence the run, unchanged (issue 29).
    x, y = data
    cb = accountant()
    model = make_model()
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0, **weights)
    assert cb.steps == N // B
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic").epsilon, rel=1e-12)


def test_a_step_fed_weights_other_than_one_voids_the_epsilon(data, monkeypatch):
    # The compiled step records the loss weights it received: were fit's arguments misread before the first
    # step (simulated by switching that check off), the step's own record still refuses the run.
    from lastiter_plugins.adapters.tf_privacy import _settings

    monkeypatch.setattr(_settings, "weights_other_than_one", lambda *weights: "")
    x, y = data
    cb = accountant()
    weights = np.r_[np.ones(N - B), np.full(B, 2.0)].astype("float32")
    with pytest.raises(lp.PipelineChangedError, match=r"every example's loss weight must be 1: step 4 .* entry 1 away"):
        make_model().fit(
            x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0, sample_weight=weights
        )


def test_reduce_lr_on_plateau_is_refused_whether_it_fires_or_not(data):
    # Its rule reads the losses of intermediate models on the private data: it could fire on a neighbouring
    # dataset even when it did not here (issue 29). patience=10**6 never fires in this run.
    x, y = data
    plateau = tf.keras.callbacks.ReduceLROnPlateau(monitor="loss", patience=10**6)
    model = make_model()
    with pytest.raises(AccountingError, match=r"ReduceLROnPlateau must not be in fit's callbacks, whether it fires"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=[accountant(), plateau], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_not_applicable_bound_raises_the_core_error(data):
    x, y = data
    cb = accountant(sampling="reshuffle", bound="kong-ribero-cyclic")
    with pytest.raises(lp.NotApplicableError, match="kong-ribero-cyclic"):
        make_model().fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=True, callbacks=[cb], verbose=0)


def test_a_generator_input_is_refused_naming_the_statement_route(data):
    x, y = data
    model = make_model()

    def batches():
        while True:
            yield x[:B], y[:B]

    with pytest.raises(AccountingError, match=r"or a tf.data.Dataset.*compute_last_iterate_privacy_statement"):
        model.fit(batches(), steps_per_epoch=N // B, epochs=1, callbacks=[accountant()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_constraint_leaves_the_sgd_rows_and_keeps_composition(data):
    # A constraint maps each iterate after the update: post-processing of the noisy steps (every-iterate rows only).
    x, y = data
    model = make_model(kernel_constraint=tf.keras.constraints.MaxNorm(1.0))
    cb = accountant()
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0)
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic", update="any").epsilon, rel=1e-12)
    assert cb.result.protects is lp.Protects.EVERY_ITERATE
    assert cb.rows_left and all("Keras constraints" in str(row) and row.step == 1 for row in cb.rows_left)


def test_batch_normalization_is_refused(data):
    x, y = data
    model = tf.keras.Sequential(
        [tf.keras.layers.BatchNormalization(input_shape=(DIM,)), tf.keras.layers.Dense(1, use_bias=False)]
    )
    model.compile(
        optimizer=dp_sgd(),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
    )
    with pytest.raises(AccountingError, match="no batch-normalization layer"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[accountant()], verbose=0)


def test_sampling_that_fit_cannot_do_is_refused_at_construction():
    for sampling in ("poisson", "random_batch"):
        with pytest.raises(ValueError, match="sampling must be cyclic, shuffle_once, reshuffle or random_allocation"):
            accountant(sampling=sampling)
    with pytest.raises(ValueError, match="bound must be one of"):
        accountant(bound="nope")
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\)"):
        accountant(delta=0.0)


def test_outside_model_fit_is_refused(data):
    model = make_model()
    cb = accountant()
    cb.set_model(model)
    with pytest.raises(AccountingError, match=r"must be passed to Keras' Model\.fit"):
        cb.on_train_begin()


def test_second_fit_with_a_used_optimizer_is_refused(data):
    x, y = data
    model = make_model()
    first = accountant()
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[first], verbose=0)
    assert first.steps == N // B
    with pytest.raises(AccountingError, match="a LastIterateCallback already accounted"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[accountant()], verbose=0)


def _more_fit(model, x, y):
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, verbose=0)


def _train_on_batch(model, x, y):
    model.train_on_batch(x[:B], y[:B])


def _recompile_and_fit(model, x, y):
    # A new optimizer starts at iterations = 0: its count alone would match the accounted 4 steps.
    model.compile(optimizer=dp_sgd(), loss=model.loss)
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, verbose=0)


UNSEEN_STEPS = [
    ("fit-without-callback", _more_fit, "model took 4 optimizer step\\(s\\) it did not see"),
    ("train-on-batch", _train_on_batch, "model took 1 optimizer step\\(s\\) it did not see"),
    ("recompiled", _recompile_and_fit, "model.optimizer must be the optimizer whose steps this callback counted"),
]


@pytest.mark.parametrize(
    ("train_more", "fragment"), [case[1:] for case in UNSEEN_STEPS], ids=[case[0] for case in UNSEEN_STEPS]
)
def test_steps_the_callback_did_not_see_void_the_epsilon(data, train_more, fragment):
    x, y = data
    model = make_model()
    cb = accountant()
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0)
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic").epsilon, rel=1e-12)
    train_more(model, x, y)
    for read in ("epsilon", "result", "config"):
        with pytest.raises(lp.PipelineChangedError, match=fragment):
            getattr(cb, read)


STOPPING_REFUSALS = [
    (
        "early-stopping-restore",
        lambda: tf.keras.callbacks.EarlyStopping(monitor="loss", restore_best_weights=True),
        "EarlyStopping must not be used with restore_best_weights=True",
    ),
    (
        "early-stopping",
        lambda: tf.keras.callbacks.EarlyStopping(monitor="loss"),
        "EarlyStopping must not be in fit's callbacks.*stopping time chosen from the private data",
    ),
    ("terminate-on-nan", tf.keras.callbacks.TerminateOnNaN, "TerminateOnNaN must not be in fit's callbacks"),
]


@pytest.mark.parametrize(
    ("make_callback", "fragment"), [case[1:] for case in STOPPING_REFUSALS], ids=[case[0] for case in STOPPING_REFUSALS]
)
def test_data_dependent_stopping_is_refused_before_any_step(data, make_callback, fragment):
    x, y = data
    model = make_model()
    callbacks = [accountant(), make_callback()]
    with pytest.raises(AccountingError, match=fragment):
        model.fit(x[:N], y[:N], batch_size=B, epochs=3, shuffle=False, callbacks=callbacks, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_model_checkpoint_save_best_only_is_accepted(data, tmp_path):
    # It only saves: the model fit returns is still the last iterate (the docs say the files must stay private).
    x, y = data
    model = make_model()
    cb = accountant()
    checkpoint = tf.keras.callbacks.ModelCheckpoint(
        str(tmp_path / "best.weights.h5"), monitor="loss", save_best_only=True, save_weights_only=True
    )
    model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb, checkpoint], verbose=0)
    assert cb.epsilon == pytest.approx(core("best", N // B, "cyclic").epsilon, rel=1e-12)


def test_training_stopped_by_a_callback_voids_the_epsilon(data):
    x, y = data

    class StopAfterFirstEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    model = make_model()
    cb = accountant()
    callbacks = [cb, StopAfterFirstEpoch()]
    fragment = r"model\.stop_training must stay False.*after 4 of the 8 planned steps"
    with pytest.raises(lp.PipelineChangedError, match=fragment):  # raised by fit, at on_train_end
        model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=callbacks, verbose=0)
    assert cb.steps == N // B  # stopped after one of the two planned epochs
    with pytest.raises(lp.PipelineChangedError, match=fragment):
        _ = cb.epsilon


def test_training_stopped_within_an_epoch_names_the_stop(data):
    x, y = data
    stop = tf.keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: setattr(model, "stop_training", True)
    )
    model = make_model()
    fragment = r"model\.stop_training must stay False.*after 1 of the 8 planned steps"
    with pytest.raises(lp.PipelineChangedError, match=fragment):  # raised at the end of the cut epoch
        model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=[accountant(), stop], verbose=0)


@pytest.mark.parametrize(
    ("loss", "found"),
    [
        ("binary_crossentropy", "Found 'binary_crossentropy'"),
        (
            tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction="sum"),
            "Found BinaryCrossentropy\\(reduction='sum'\\)",
        ),
    ],
    ids=["string", "reduction-sum"],
)
def test_a_loss_reducing_the_batch_is_refused_before_any_step(data, loss, found):
    # TF Privacy needs one loss value per example; a reduced loss used to fail inside the step with a shape error.
    x, y = data
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(DIM,), use_bias=False)])
    model.compile(optimizer=dp_sgd(), loss=loss)
    with pytest.raises(AccountingError, match=f"reduction=tf.keras.losses.Reduction.NONE.*{found}"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[accountant()], verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_learning_rate_scheduler_leaves_the_sgd_rows_from_the_first_step_it_changed(data):
    x, y = data
    model = make_model()
    cb = accountant()
    scheduler = tf.keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr if epoch == 0 else lr / 2)
    history = model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=[scheduler, cb], verbose=0)
    per_epoch = N // B
    assert history.history["epsilon"][0] == pytest.approx(core("best", per_epoch, "cyclic").epsilon, rel=1e-12)
    assert cb.epsilon == pytest.approx(core("best", 2 * per_epoch, "cyclic", update="any").epsilon, rel=1e-12)
    (departure,) = cb.departures
    assert departure.step == per_epoch + 1 and "changed from 0.5 to 0.25" in departure.fact
    assert {row.bound for row in cb.rows_left} >= {"kong-ribero-cyclic"}
    assert all(row.step == per_epoch + 1 for row in cb.rows_left)


def test_learning_rate_changed_by_an_unknown_callback_voids_the_epsilon(data):
    # Nothing shows the rule to be fixed in advance: it may have read the private data.
    x, y = data
    model = make_model()
    cb = accountant()
    halve = tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: epoch and model.optimizer.learning_rate.assign(LR / 2)
    )
    with pytest.raises(lp.PipelineChangedError, match="the learning rate must stay constant or follow a schedule"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=[halve, cb], verbose=0)
    with pytest.raises(lp.PipelineChangedError, match="metric_source='public'"):
        _ = cb.epsilon


def test_steps_per_execution_above_one_is_refused(data):
    x, y = data
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(DIM,), use_bias=False)])
    model.compile(
        optimizer=dp_sgd(),
        loss=tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE),
        steps_per_execution=2,
    )
    callbacks = [accountant(diameter=2.0), ProjectionCallback(2.0)]
    with pytest.raises(AccountingError, match="steps_per_execution must be 1"):
        model.fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=callbacks, verbose=0)


# ---------------------------------------------------------------- projection


def test_projection_keeps_every_iterate_in_the_ball(data):
    x, y = data
    model = make_model(dp_sgd(learning_rate=2.0), kernel_initializer=tf.keras.initializers.Constant(3.0))
    diameter = 0.2
    distances = []

    class Recorder(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            distances.append(float(np.linalg.norm(self.model.get_weights()[0])))

    projection = ProjectionCallback(diameter)
    cb = accountant(diameter=diameter)
    # The recorder runs after the projection, so it sees the projected iterate.
    model.fit(x[:N], y[:N], batch_size=B, epochs=2, shuffle=False, callbacks=[cb, projection, Recorder()], verbose=0)
    assert len(distances) == 2 * N // B
    assert max(distances) <= diameter / 2
    assert max(distances) > 0.99 * diameter / 2  # the projection was active (lr 2 leaves the ball)
    assert cb.epsilon == pytest.approx(
        lp.epsilon(
            "best",
            DELTA,
            config=cb.config,
            assumptions=lp.LossAssumptions(smoothness=0.25, diameter=diameter, gradient_norms_within_clip=True),
        ).epsilon,
        rel=1e-12,
    )


def test_projection_projects_the_initial_point_and_respects_the_center(data):
    model = make_model(kernel_initializer=tf.keras.initializers.Constant(5.0))
    center = [np.full((DIM, 1), 1.0, dtype="float32")]
    projection = ProjectionCallback(diameter=2.0, center=center)
    projection.set_model(model)
    projection.on_train_begin()
    weights = model.get_weights()[0]
    assert np.linalg.norm(weights - center[0]) <= 1.0
    assert np.linalg.norm(weights - center[0]) > 0.999
    direction = (weights - center[0]).reshape(-1)
    assert np.allclose(direction, direction[0])  # moved along the line to the center
    bad = ProjectionCallback(diameter=2.0, center=[np.zeros((DIM + 1, 1))])
    bad.set_model(model)
    with pytest.raises(AccountingError, match="center must match the shapes"):
        bad.on_train_begin()
    with pytest.raises(ValueError, match="diameter must be a finite number > 0"):
        ProjectionCallback(0.0)


# ---------------------------------------------------------------- the statement

STATEMENT = dict(
    number_of_examples=512,
    batch_size=32,
    num_epochs=20,
    noise_multiplier=2.0,
    delta=DELTA,
    l2_norm_clip=2.0,
    learning_rate=3.0,
    sampling="cyclic",
    smoothness=0.3,
    strong_convexity=0.05,
    diameter=40.0,
    gradient_norms_within_clip=True,
)


def _keyword(**changes):
    params = dict(STATEMENT)
    params.update(changes)
    return dict(
        dataset_size=params["number_of_examples"],
        batch_size=params["batch_size"],
        epochs=params["num_epochs"],
        noise_multiplier=params["noise_multiplier"],
        clip_norm=params["l2_norm_clip"],
        learning_rate=params["learning_rate"],
        sampling=params["sampling"],
        smoothness=params["smoothness"],
        strong_convexity=params["strong_convexity"],
        diameter=params["diameter"],
        gradient_norms_within_clip=params["gradient_norms_within_clip"],
    )


def test_statement_content():
    text = compute_last_iterate_privacy_statement(**STATEMENT)
    flat = " ".join(text.split())
    assert "protects the release of the FINAL model only" in flat
    assert "It does not protect intermediate checkpoints" in flat
    assert "It covers the model after the 320 iterations stated, a number fixed before training" in flat
    assert "early stopping on a training or validation metric" in flat
    assert "restoring the best weights, releasing the best checkpoint) are not covered" in flat
    assert "512 examples with 32 examples per iteration (16 iterations per epoch)" in flat
    assert "20 epochs = 320 iterations" in flat
    assert "replace-one adjacency" in flat
    assert "smoothness M = 0.3" in flat and "lam = 0.05 (strongly convex)" in flat
    assert "diameter D = 40" in flat and "every per-example gradient norm <= C = 2 on the whole domain" in flat
    params = _keyword()
    applicable = [bid for bid, app in lp.applicable_bounds(**params).items() if app.applies and bid != "best"]
    assert "ye-shokri-cyclic" in applicable and "composition" in applicable
    for bid in applicable:
        eps = lp.epsilon(bid, DELTA, **params).epsilon
        assert f"{bid:<28}{eps:12.3f}" in text, bid
    best = lp.epsilon("best", DELTA, **params)
    assert f"{'best':<28}{best.epsilon:12.3f}   (via {best.winner}" in text
    assert "No bound covers sampling=cyclic under add-or-remove-one adjacency" in flat
    # TF Privacy's own numbers, as its library computes them (add-or-remove, all checkpoints).
    tf_eps = statement_module._tfp_statement._compute_dp_sgd_example_privacy(20, 2.0, DELTA, used_microbatching=False)
    assert "protects the release of all model checkpoints in addition to the final model" in flat
    assert (
        f"Epsilon with each example occurring once per epoch: {tf_eps:12.3f}".split()
        == (flat[flat.index("Epsilon with each example") :].split()[:9])
    )
    assert "without microbatching" in flat
    assert best.epsilon < tf_eps  # the point of the exercise, on this configuration


def test_statement_lists_both_relations_for_poisson():
    """Both relations, the sampling scheme's default first (add-or-remove for Poisson, replace-one otherwise)."""
    params = dict(STATEMENT, sampling="poisson")
    text = " ".join(compute_last_iterate_privacy_statement(**params).split())
    assert "replace-one adjacency" in text and "add-or-remove-one adjacency" in text
    head = "Example-level DP with {}-one adjacency"
    assert text.index(head.format("add-or-remove")) < text.index(head.format("replace"))
    cyclic = " ".join(compute_last_iterate_privacy_statement(**dict(STATEMENT, sampling="cyclic")).split())
    assert cyclic.index(head.format("replace")) < cyclic.index("add-or-remove-one adjacency")
    eps = lp.epsilon("liang-unbounded", DELTA, relation="add_or_remove_one", **_keyword(sampling="poisson")).epsilon
    assert f"liang-unbounded {eps:.3f}" in text


@pytest.mark.parametrize(
    ("sampling", "relation", "row"),
    [
        ("random_batch", "replace_one", "shifted-interpolation-random-batch"),
        ("poisson", "add_or_remove_one", "shifted-interpolation-poisson"),
        ("poisson", "replace_one", "shifted-interpolation-poisson-replace-one"),
    ],
    ids=["random-batch", "poisson", "poisson-replace-one"],
)
def test_statement_for_independent_memberships_lists_their_last_iterate_rows(sampling, relation, row):
    # Keras fit passes over the data in epochs (the callback refuses random_batch and poisson); a pipeline
    # that samples this way is described through the statement (or lp.epsilon), where the rows are taken up
    # diameter 80: the largest a 0.05-strongly convex loss within the clip C = 2 can have (lam D / 2 <= C); with
    # no projection no loss meets these declarations (refused); the rows' numbers are the same
    changes = dict(sampling=sampling, learning_rate=2.5, diameter=80.0)
    text = " ".join(compute_last_iterate_privacy_statement(**{**STATEMENT, **changes}).split())
    eps = lp.epsilon(row, DELTA, relation=relation, **_keyword(**changes)).epsilon
    assert f"{row} {eps:.3f} (protects the final model only;" in text
    declared_inside = {**STATEMENT, **changes, "strong_convexity": 0.0, "gradient_norms_within_clip": False}
    text = " ".join(compute_last_iterate_privacy_statement(**declared_inside).split())
    assert f"- {row}: gradient_norms_within_clip or clipped_loss_convex_smooth" in text


NO_LOSS = (
    r"no loss meets these declarations: .*strong_convexity=0\.1 with gradient_norms_within_clip=True and no projection"
)


def test_the_callback_refuses_declarations_no_loss_meets(data):
    """issue 41: a real run has real losses: strongly convex with every gradient within the clip and no projection
    is refused before the first step; with a projection of diameter D, lam D / 2 <= C, the run is accounted."""
    x, y = data
    with pytest.raises(AccountingError, match=NO_LOSS + r".*Found them declared to LastIterateCallback"):
        make_model().fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, verbose=0,
                         callbacks=[accountant(strong_convexity=0.1)])  # fmt: skip
    possible = accountant(strong_convexity=0.1, diameter=20.0)  # 0.1 * 20 / 2 = C
    make_model().fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, verbose=0,
                     callbacks=[possible, ProjectionCallback(20.0)])  # fmt: skip
    assert possible.epsilon > 0


def test_the_statement_refuses_declarations_no_loss_meets():
    impossible = {**STATEMENT, "strong_convexity": 0.1, "diameter": None}
    with pytest.raises(ValueError, match=NO_LOSS + r".*compute_last_iterate_privacy_statement"):
        compute_last_iterate_privacy_statement(**impossible)
    too_wide = {**STATEMENT, "strong_convexity": 0.1, "diameter": 41.0}  # 0.1 * 41 / 2 > C = 2
    with pytest.raises(ValueError, match=r"strong_convexity \* diameter / 2 = 2\.05 > clip_norm = 2"):
        compute_last_iterate_privacy_statement(**too_wide)


def test_the_statement_starts_with_the_answer_and_advises_in_keras_terms():
    """issue 41: the statement's first lines are the answer (the default relation's best: its number, what it
    protects, the winner and its provenance, TF Privacy's numbers NOT VALID where they fail); its advice is what a
    Keras user can do: never Opacus' poisson_sampling=True nor torch's weight_decay."""
    params = {**STATEMENT, "sampling": "reshuffle", "update": "any", "learning_rate": None}
    text = compute_last_iterate_privacy_statement(**params)
    best = lp.epsilon("best", DELTA, **_keyword(**params), update="any")
    first = text.split("\n\n")[0].split("\n")
    assert first[0].startswith(f"epsilon = {best.epsilon:.4g} at delta = 1e-05 for every iterate; replace_one")
    assert f"From {best.winner}: published (" in " ".join(first)
    assert "NOT VALID" in " ".join(first) and len(first) <= 10 and max(map(len, first)) <= 80
    assert "Single changes that would lower it" in text  # a standard baseline: the advice is there
    for foreign in ("poisson_sampling", "make_private", "torch", "weight_decay", "Opacus"):
        assert foreign not in text


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (dict(num_epochs=2.5 + 1 / 32), "must be a whole number of steps"),
        (dict(num_epochs=0), "num_epochs must be a finite number > 0"),
        (dict(batch_size=24), "batch_size must divide number_of_examples = 512"),
        (dict(batch_size=0), "batch_size must be an integer >= 1"),
        (dict(delta=2.0), "delta must be in"),
        (dict(sampling="sometimes"), "sampling must be one of"),
    ],
    ids=["fractional-steps", "zero-epochs", "short-batch", "zero-batch", "delta", "sampling"],
)
def test_statement_refusals(changes, fragment):
    with pytest.raises(ValueError, match=fragment):
        compute_last_iterate_privacy_statement(**dict(STATEMENT, **changes))


def test_statement_accepts_whole_fractional_epochs():
    text = compute_last_iterate_privacy_statement(**dict(STATEMENT, num_epochs=2.5))
    assert "2.5 epochs = 40 iterations" in " ".join(text.split())
    assert math.isfinite(lp.epsilon("best", DELTA, **dict(_keyword(), epochs=None, steps=40)).epsilon)


# ---------------------------------------------------------------- the example


def test_example_runs_and_prints_the_statement(capsys):
    import importlib.util

    path = ROOT / "examples" / "tf_privacy_logistic_regression.py"
    spec = importlib.util.spec_from_file_location("tf_privacy_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    accountants = example.main(["--epochs", "2", "--sampling", "cyclic"])
    out = " ".join(capsys.readouterr().out.split())
    accountant = accountants["cyclic"]
    # the constants were derived from the model (model="glm"), not declared
    assert accountant.assumptions.smoothness == pytest.approx(0.5) and accountant.assumptions.gradient_norms_within_clip
    expected = lp.epsilon("best", 1e-5, config=accountant.config, assumptions=accountant.assumptions)
    assert f"epsilon = {expected.epsilon:.4g} at delta = 1e-05 for the final model only" in out
    assert f"From {expected.winner}: " in out  # str(result): the answer first
    assert f"best {expected.epsilon:.3f} (via {expected.winner};" in out  # the statement names the same winner
    assert "protects the release of the FINAL model only" in out
    assert "Baseline: TF Privacy's compute_dp_sgd_privacy_statement" in out


def test_statement_takes_l2_outside_clip_as_the_core_does():
    # Issue 31: every declaration the core takes; a Poisson pipeline with weight decay outside the clip
    # (the Opacus setting) gets the number lp.epsilon gives for the same declarations.
    changes = dict(
        sampling="poisson", num_epochs=50, strong_convexity=0.1, diameter=None, gradient_norms_within_clip=False
    )
    declared = dict(clipped_loss_convex_smooth=True, l2_outside_clip=True)
    text = " ".join(compute_last_iterate_privacy_statement(**{**STATEMENT, **changes, **declared}).split())
    params = {**_keyword(**changes), **declared}
    best = lp.epsilon("best", DELTA, relation="add_or_remove_one", **params)
    assert best.winner == "shifted-interpolation-poisson"  # needs l2_outside_clip (composition otherwise)
    assert f"best {best.epsilon:.3f} (via {best.winner};" in text
    assert "the strong convexity is an l2 term outside the clip" in text


def test_callback_takes_clipped_loss_convex_smooth_and_refuses_l2_outside_clip(data):
    x, y = data
    cb = accountant(gradient_norms_within_clip=False, clipped_loss_convex_smooth=True)
    make_model().fit(x[:N], y[:N], batch_size=B, epochs=1, shuffle=False, callbacks=[cb], verbose=0)
    expected = core("best", N // B, "cyclic", gradient_norms_within_clip=False, clipped_loss_convex_smooth=True)
    assert cb.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    with pytest.raises(ValueError, match="l2_outside_clip must be False under TF Privacy"):
        accountant(strong_convexity=0.1, l2_outside_clip=True)
