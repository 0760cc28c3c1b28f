"""checks/optimizer.py: every DP Keras optimizer of TF Privacy 0.9 is accepted; an update other than plain SGD
(Adam, Adagrad, momentum, Nesterov, Keras' clipping of the noised gradient) leaves exactly the last-iterate rows,
from the first step, and the number is the core's for the pipeline that ran."""

from __future__ import annotations

import pytest

from .support import (
    EPOCHS,
    B,
    N,
    callback,
    core,
    data,
    fit,
    iterations,
    linear,
    lp,
    mlp,
    optimizer,
    tf,
)

DECLARED = dict(smoothness=0.25, gradient_norms_within_clip=True)  # true for the logistic regression on |x| = 1

# (optimizer, sampling, fit's shuffle, optimizer changes, a fragment of the departure's fact)
NOT_SGD = [
    ("DPKerasAdamOptimizer", "reshuffle", True, {}, "the optimizer is DPKerasAdamOptimizer"),
    ("DPKerasAdagradOptimizer", "cyclic", False, {}, "Adagrad's update"),
    ("VectorizedDPKerasAdamOptimizer", "shuffle_once", False, {}, "VectorizedDPKerasAdamOptimizer"),
    ("VectorizedDPKerasAdagradOptimizer", "reshuffle", True, {}, "VectorizedDPKerasAdagradOptimizer"),
    ("DPSparseKerasAdamOptimizer", "reshuffle", True, {}, "DPSparseKerasAdamOptimizer"),
    ("DPSparseKerasAdagradOptimizer", "cyclic", False, {}, "DPSparseKerasAdagradOptimizer"),
    ("DPKerasSGDOptimizer", "reshuffle", True, dict(momentum=0.9), "has momentum 0.9"),
    ("VectorizedDPKerasSGDOptimizer", "cyclic", False, dict(momentum=0.9, nesterov=True), "Nesterov"),
    ("DPSparseKerasSGDOptimizer", "reshuffle", True, dict(momentum=0.5), "has momentum 0.5"),
    ("DPKerasSGDOptimizer", "cyclic", False, dict(clipnorm=0.5), "Keras clips the noised gradient (clipnorm=0.5)"),
    ("DPKerasSGDOptimizer", "shuffle_once", False, dict(global_clipnorm=0.5), "global_clipnorm=0.5"),
]


@pytest.mark.parametrize(
    ("name", "sampling", "shuffle", "changes", "fragment"), NOT_SGD, ids=[f"{c[0]}-{c[1]}-{len(c[3])}" for c in NOT_SGD]
)
def test_an_update_other_than_sgd_gets_the_every_iterate_number_and_names_the_rows_that_left(
    name, sampling, shuffle, changes, fragment
):
    model = linear(optimizer(name, **changes))
    cb = callback(sampling, **DECLARED)
    history = fit(model, cb, shuffle=shuffle)
    per_epoch = N // B
    expected = [core(sampling, steps=(e + 1) * per_epoch, **DECLARED).epsilon for e in range(EPOCHS)]
    assert history.history["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert cb.epsilon == pytest.approx(expected[-1], rel=1e-12) and iterations(model) == EPOCHS * per_epoch
    assert cb.result.protects is lp.Protects.EVERY_ITERATE
    assert cb.optimizer_settings.optimizer_class == name
    (departure,) = cb.departures
    assert departure.step == 1 and fragment in departure.fact, departure.fact
    declared = core(sampling, update="sgd", **DECLARED)  # what plain SGD would have got: a last-iterate row
    assert declared.protects is lp.Protects.FINAL_MODEL and declared.winner in {row.bound for row in cb.rows_left}
    assert all(lp.BOUNDS[row.bound].protects is lp.Protects.FINAL_MODEL for row in cb.rows_left)
    assert "update=any" in cb.rows_left[0].condition and " ".join(f"left best: {cb.rows_left[0]}".split()) in " ".join(
        str(cb.report).split()
    )


@pytest.mark.parametrize("name", ["DPKerasSGDOptimizer", "VectorizedDPKerasSGDOptimizer", "DPSparseKerasSGDOptimizer"])
def test_plain_sgd_of_every_family_keeps_the_last_iterate_number(name):
    cb = callback("cyclic", **DECLARED)
    fit(linear(optimizer(name)), cb)
    expected = core("cyclic", update="sgd", **DECLARED)
    assert cb.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert cb.result.protects is lp.Protects.FINAL_MODEL and cb.departures == () and cb.rows_left == ()


@pytest.mark.parametrize("name", ["DPKerasAdamOptimizer", "DPSparseKerasAdamOptimizer"])
def test_a_deep_network_trained_with_adam_gets_the_number_of_its_sampler(name):
    x, y = data()
    cb = callback("reshuffle")
    fit(mlp(optimizer(name, learning_rate=0.01)), cb, x, y, shuffle=True)
    assert cb.epsilon == pytest.approx(core("reshuffle").epsilon, rel=1e-12)
    assert cb.result.winner == "composition-gdp-epochs"


def test_a_named_last_iterate_bound_is_refused_for_adam_before_the_first_step():
    model = linear(optimizer("DPKerasAdamOptimizer"))
    cb = callback("cyclic", bound="kong-ribero-cyclic", **DECLARED)
    with pytest.raises(
        lp.NotApplicableError, match=r"kong-ribero-cyclic.*step 1: the optimizer is DPKerasAdamOptimizer"
    ):
        fit(model, cb)
    assert iterations(model) == 0


def test_require_last_iterate_refuses_adam_and_keeps_sgd():
    model = linear(optimizer("DPKerasAdamOptimizer"))
    with pytest.raises(lp.NotApplicableError, match=r"require='last_iterate'.*composition-gdp-epochs"):
        fit(model, callback("cyclic", require="last_iterate", **DECLARED))
    assert iterations(model) == 0
    cb = callback("cyclic", require="last_iterate", **DECLARED)
    fit(linear(), cb)
    assert cb.result.protects is lp.Protects.FINAL_MODEL
    with pytest.raises(ValueError, match="require must be None or 'last_iterate'"):
        callback("cyclic", require="final")


def test_the_check_names_the_rows_it_gates():
    from lastiter_plugins.adapters.tf_privacy.checks import OptimizerCheck

    config = lp.TrainingConfig(dataset_size=N, batch_size=B, noise_multiplier=1.0, steps=8, sampling="cyclic",
                               learning_rate=0.05)  # fmt: skip
    rows = OptimizerCheck().rows(config, lp.LossAssumptions(**DECLARED))
    assert "kong-ribero-cyclic" in rows and "composition-gdp-epochs" not in rows
    assert all(lp.BOUNDS[r].protects is lp.Protects.FINAL_MODEL for r in rows)


def test_a_non_private_optimizer_is_still_refused_naming_the_dp_ones():
    model = linear(tf.keras.optimizers.legacy.Adam(0.01))
    with pytest.raises(lp.NotApplicableError, match=r"DPKerasAdamOptimizer.*a non-private optimizer releases"):
        fit(model, callback("cyclic"))
    assert iterations(model) == 0
