"""checks/metric_rules.py: a rule reading a metric (ReduceLROnPlateau, EarlyStopping, a stop) is refused unless
the user declares it reads public data only (metric_source="public", validation_data that is not a split); then
only the every-iterate rows cover the run, and a stopping rule makes the number cover every planned step."""

from __future__ import annotations

import pytest

from .support import EPOCHS, B, N, callback, core, data, fit, iterations, linear, lp, mlp, tf

PUBLIC = data(seed=1)  # validation data the user may publish


def test_reduce_lr_on_plateau_on_public_validation_data_gets_the_every_iterate_number():
    model = mlp()
    plateau = tf.keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=0, factor=0.5, min_delta=10.0)
    cb = callback("reshuffle", metric_source="public")
    fit(model, cb, epochs=3, shuffle=True, more=[plateau], validation_data=PUBLIC)  # lowers the rate after epoch 2
    assert cb.epsilon == pytest.approx(core("reshuffle", steps=3 * N // B).epsilon, rel=1e-12)
    assert cb.departures[0].step == 1 and "ReduceLROnPlateau(monitor='val_loss')" in cb.departures[0].fact
    assert any("learning rate changed" in d.fact for d in cb.departures)  # it fired (min_delta=10: always)


def test_reduce_lr_on_plateau_without_the_declaration_is_refused_before_any_step():
    model = mlp()
    plateau = tf.keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=10**6)
    with pytest.raises(lp.NotApplicableError, match=r"ReduceLROnPlateau must not be.*metric_source='public'"):
        fit(model, callback("reshuffle"), shuffle=True, more=[plateau], validation_data=PUBLIC)
    assert iterations(model) == 0


@pytest.mark.parametrize(
    ("monitor", "fit_changes", "fragment"),
    [
        ("loss", dict(validation_data=PUBLIC), "a training metric computed on the private batches"),
        ("val_loss", dict(validation_split=0.5), "validation_split=0.5, a part of the private data"),
    ],
    ids=["training-metric", "validation-split"],
)
def test_a_rule_reading_private_data_stays_refused_whatever_is_declared(monitor, fit_changes, fragment):
    x, y = data(2 * N if "validation_split" in fit_changes else N)
    model = mlp()
    stop = tf.keras.callbacks.EarlyStopping(monitor=monitor, patience=0)
    cb = callback("cyclic", metric_source="public")
    with pytest.raises(lp.NotApplicableError, match=fragment):
        model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, callbacks=[cb, stop], verbose=0, **fit_changes)
    assert iterations(model) == 0


def test_early_stopping_on_public_data_covers_every_planned_step():
    model = linear()
    stop = tf.keras.callbacks.EarlyStopping(monitor="val_loss", patience=0, min_delta=10.0)  # stops after epoch 2
    cb = callback("cyclic", metric_source="public", smoothness=0.25, gradient_norms_within_clip=True)
    fit(model, cb, epochs=5, more=[stop], validation_data=PUBLIC)
    assert iterations(model) == 2 * N // B < 5 * N // B  # it stopped early
    planned = core("cyclic", steps=5 * N // B)
    assert cb.epsilon == pytest.approx(planned.epsilon, rel=1e-12) and cb.config.steps == 5 * N // B
    assert cb.result.protects is lp.Protects.EVERY_ITERATE


def test_a_stop_by_a_callback_declared_public_covers_every_planned_step():
    class StopAfterFirstEpoch(tf.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.model.stop_training = True

    model = linear()
    cb = callback("cyclic", metric_source="public", smoothness=0.25, gradient_norms_within_clip=True)
    fit(model, cb, epochs=3, more=[StopAfterFirstEpoch()])
    assert cb.steps == N // B
    assert cb.epsilon == pytest.approx(core("cyclic", steps=3 * N // B).epsilon, rel=1e-12)
    (departure,) = cb.departures
    assert departure.step == N // B and "stopped training after 4 of the 12 planned steps" in departure.fact
