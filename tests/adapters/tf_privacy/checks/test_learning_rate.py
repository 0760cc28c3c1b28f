"""checks/learning_rate.py: a learning rate fixed in advance that changes (a LearningRateSchedule, Keras' legacy
decay, a LearningRateScheduler) leaves the rows analysing one constant SGD step from the first step it changed;
a rate changed by anything else is refused unless declared public (test_adapter.py has the callback cases)."""

from __future__ import annotations

import pytest

from .support import B, N, callback, core, fit, iterations, linear, lp, mlp, optimizer, tf

DECLARED = dict(smoothness=0.25, gradient_norms_within_clip=True)


class OneCycle(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A one-cycle schedule of the step count: up linearly for half the steps, then down."""

    def __init__(self, peak: float, steps: int) -> None:
        self.peak, self.steps = peak, steps

    def __call__(self, step):
        t = tf.cast(step, tf.float32) / self.steps
        return self.peak * tf.maximum(0.05, 1.0 - tf.abs(2.0 * t - 1.0))

    def get_config(self):
        return {"peak": self.peak, "steps": self.steps}


def _exponential():
    return tf.keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=2, decay_rate=0.5)


SCHEDULES = [
    ("cosine", lambda: optimizer(learning_rate=tf.keras.optimizers.schedules.CosineDecay(0.1, 8)), "CosineDecay"),
    (
        "piecewise-momentum",
        lambda: optimizer(
            learning_rate=tf.keras.optimizers.schedules.PiecewiseConstantDecay([4], [0.1, 0.01]), momentum=0.9
        ),
        "PiecewiseConstantDecay",
    ),
    ("one-cycle-momentum", lambda: optimizer(learning_rate=OneCycle(0.1, 8), momentum=0.9), "OneCycle"),
    ("legacy-decay", lambda: optimizer(decay=0.01), "legacy decay"),
    ("exponential-adam", lambda: optimizer("DPKerasAdamOptimizer", learning_rate=_exponential()), "ExponentialDecay"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in SCHEDULES], ids=[c[0] for c in SCHEDULES])
def test_a_schedule_fixed_in_advance_gets_the_every_iterate_number(make, fragment):
    model = mlp(make())
    cb = callback("reshuffle")
    fit(model, cb, shuffle=True)
    assert cb.epsilon == pytest.approx(core("reshuffle").epsilon, rel=1e-12) and iterations(model) == 2 * N // B
    assert any(d.step == 1 and fragment in d.fact for d in cb.departures), cb.departures
    assert cb.optimizer_settings.schedule is not None


def test_a_schedule_leaves_the_rows_needing_a_constant_rate_naming_them():
    cb = callback("cyclic", **DECLARED)
    fit(linear(optimizer(learning_rate=tf.keras.optimizers.schedules.CosineDecay(0.1, 8))), cb)
    assert cb.epsilon == pytest.approx(core("cyclic", **DECLARED).epsilon, rel=1e-12)
    (departure,) = cb.departures
    assert "follows CosineDecay, a schedule fixed in advance" in departure.fact
    left = {row.bound for row in cb.rows_left}
    assert core("cyclic", update="sgd", learning_rate=0.1, **DECLARED).winner in left


def test_a_learning_rate_variable_left_unchanged_keeps_the_last_iterate_number():
    rate = tf.Variable(0.05, dtype=tf.float32)
    cb = callback("cyclic", **DECLARED)
    fit(linear(optimizer(learning_rate=rate)), cb)
    assert cb.departures == () and cb.result.protects is lp.Protects.FINAL_MODEL
    assert cb.epsilon == pytest.approx(core("cyclic", update="sgd", learning_rate=0.05, **DECLARED).epsilon, rel=1e-12)


def test_the_report_names_every_departure_also_when_no_further_row_left_with_it():
    cb = callback("cyclic", **DECLARED)
    schedule = tf.keras.optimizers.schedules.CosineDecay(0.01, 8)
    fit(linear(optimizer("DPKerasAdamOptimizer", learning_rate=schedule)), cb)
    text = str(cb.report)
    assert "left best: " in text and "the optimizer is DPKerasAdamOptimizer" in text
    assert "observed at step 1: the learning rate follows CosineDecay" in text and "(no further row left" in text
