"""Random allocation for Keras (RandomAllocationDataset): real small models trained with TF Privacy; the callback's
epsilon is the core's for the run as padded (docs/derivations/fixed-length-batches.md, part 5: divisor b, learning
rate eta b / L, batches cut at L), every step checked against the batch the pipeline delivered, and what changes
the batches refused with its cause."""

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
    RandomAllocationDataset,
)
from tests.adapters.tf_privacy.checks import support  # noqa: E402
from tests.adapters.tf_privacy.checks.support import C_RUN, DELTA, DIM, LOSS, Z_RUN, optimizer  # noqa: E402

N, B, EPOCHS, LR = 240, 24, 2, 0.5


@pytest.fixture(scope="module")
def data():
    return support.data(N)


def make_model(num_microbatches=None, **dense):
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(DIM,), use_bias=False, **dense)])
    model.compile(
        optimizer=optimizer(num_microbatches=num_microbatches, learning_rate=LR),
        loss=tf.keras.losses.BinaryCrossentropy(**LOSS),
    )
    return model


def accountant(**changes):
    kwargs = dict(sampling="random_allocation", dataset_size=N, delta=DELTA)
    return LastIterateCallback(**(kwargs | changes))


def core(pipeline, bound="best", epochs=EPOCHS, **assumptions):
    L = pipeline.max_batch_size
    config = lp.TrainingConfig(
        dataset_size=N,
        batch_size=B,
        noise_multiplier=Z_RUN,
        steps=epochs * pipeline.steps_per_epoch,
        sampling="random_allocation",
        learning_rate=LR * B / L,
        clip_norm=C_RUN,
        max_batch_size=L,
        allocations_per_epoch=pipeline.allocations_per_epoch,
    )
    return lp.epsilon(bound, DELTA, config=config, assumptions=lp.LossAssumptions(**assumptions))


def test_the_callback_gives_the_core_number_for_the_padded_run(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    assert pipeline.steps_per_epoch == 10 and pipeline.max_batch_size > B
    cb = accountant()
    history = make_model().fit(pipeline.dataset, epochs=EPOCHS, callbacks=[cb], verbose=0)
    expected = core(pipeline)
    assert cb.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert cb.result.winner == "composition-pld-random-allocation"
    assert cb.config.max_batch_size == pipeline.max_batch_size
    assert cb.config.learning_rate == pytest.approx(LR * B / pipeline.max_batch_size)
    assert history.history["epsilon"][-1] == pytest.approx(cb.epsilon)
    # every example exactly once an epoch, each epoch a fresh draw, every delivered batch trained on
    delivered = pipeline.delivered
    assert len(delivered) == EPOCHS * 10
    for epoch in range(EPOCHS):
        used = np.concatenate([np.asarray(kept, dtype=int) for _, kept in delivered[epoch * 10 : (epoch + 1) * 10]])
        assert sorted(used.tolist()) == list(range(N))
    text = str(cb.report)
    assert f"random_allocation (batches cut at {pipeline.max_batch_size} examples) sampling" in " ".join(text.split())
    assert f"Every batch padded to {pipeline.max_batch_size} rows" in text
    assert "tf-privacy-poisson" in text and "NOT VALID" in text


def test_each_example_in_k_steps_an_epoch_is_accounted_with_k(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=1, allocations_per_epoch=2)
    assert pipeline.steps_per_epoch == 20
    cb = accountant()
    make_model().fit(pipeline.dataset, epochs=1, callbacks=[cb], verbose=0)
    assert cb.config.allocations_per_epoch == 2 and cb.result.steps == 20
    assert cb.epsilon == pytest.approx(core(pipeline, epochs=1).epsilon, rel=1e-12)


def test_a_linear_model_with_declared_constants_gets_the_last_iterate_row(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    declared = dict(smoothness=0.25, gradient_norms_within_clip=True)
    cb = accountant(**declared)
    make_model().fit(pipeline.dataset.prefetch(2), epochs=EPOCHS, callbacks=[cb], verbose=0)
    expected = core(pipeline, **declared)
    assert cb.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert cb.result.winner == expected.winner


def test_batches_above_the_length_are_cut_and_counted(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS, max_batch_size=B)
    for _ in pipeline.dataset:  # a look at a whole pass before fit: its cuts are not the run's
        pass
    before, cb = pipeline.batches_cut, accountant(delta=0.5)
    make_model().fit(pipeline.dataset, epochs=EPOCHS, callbacks=[cb], verbose=0)
    cut = pipeline.batches_cut - before
    assert cut > 0 and before > 0
    assert all(len(kept) == min(len(drawn.indices), B) for drawn, kept in pipeline.delivered)
    assert f"{cut} batches had more than {B} examples and were cut" in " ".join(str(cb.report).split())
    config = cb.config
    assert cb.epsilon == lp.epsilon("best", 0.5, config=config).epsilon  # with p near 1: vacuous or large


def test_a_run_longer_than_the_deliveries_kept_is_checked_to_its_end(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=12)
    cb = accountant()
    make_model().fit(pipeline.dataset.prefetch(3), epochs=12, callbacks=[cb], verbose=0)
    assert pipeline.deliveries == 120 > len(pipeline.delivered) == 2 * 10 + 64
    assert cb.result.steps == 120 and cb.epsilon == pytest.approx(core(pipeline, epochs=12).epsilon, rel=1e-12)


def test_batches_delivered_before_fit_are_not_the_run(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    next(iter(pipeline.dataset))  # a look at the data before training: a draw the run does not use
    cb = accountant()
    make_model().fit(pipeline.dataset, epochs=EPOCHS, callbacks=[cb], verbose=0)
    assert cb.epsilon == pytest.approx(core(pipeline).epsilon, rel=1e-12)


@pytest.mark.parametrize(
    ("fit_input", "fragment"),
    [
        (lambda p: p.dataset.map(lambda x, y, w: (x, y, w)), "behind another transformation"),
        (lambda p: p.dataset.repeat(2), "behind another transformation"),
        (lambda p: p.dataset.cache(), "behind another transformation"),  # every epoch the first one's allocation
        (lambda p: tf.data.Dataset.zip((tf.data.Dataset.range(99), p.dataset)).map(lambda i, e: e), "behind another"),
    ],
    ids=["map", "repeat", "cache", "zip-second"],
)
def test_transformations_after_the_dataset_are_refused(data, fit_input, fragment):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    with pytest.raises(AccountingError, match=fragment):
        make_model().fit(fit_input(pipeline), epochs=EPOCHS, callbacks=[accountant()], verbose=0)


@pytest.mark.parametrize(
    "validation", [lambda p: p.dataset, lambda p: p.dataset.prefetch(1)], ids=["as-is", "prefetch"]
)
def test_validation_data_drawn_from_the_training_pipeline_is_refused_before_the_first_step(data, validation):
    """Keras evaluates validation_data between epochs: the training pipeline's dataset would deliver a pass of its
    own there, and the steps are matched to the deliveries in order (a void run, for a wrong reason, at the end)."""
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    with pytest.raises(AccountingError, match="validation_data must not draw from the RandomAllocationDataset"):
        make_model().fit(
            pipeline.dataset, validation_data=validation(pipeline), epochs=EPOCHS, callbacks=[accountant()], verbose=0
        )
    assert pipeline.deliveries == 0  # refused before any batch was drawn


def test_the_declared_sampling_must_be_the_inputs(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    with pytest.raises(AccountingError, match="sampling must be random_allocation for RandomAllocationDataset"):
        make_model().fit(pipeline.dataset, epochs=EPOCHS, callbacks=[accountant(sampling="reshuffle")], verbose=0)
    x, y = data
    with pytest.raises(AccountingError, match="for random allocation, pass RandomAllocationDataset"):
        make_model().fit(x, y, batch_size=B, epochs=1, callbacks=[accountant()], verbose=0)


def test_steps_per_epoch_and_class_weight_are_refused(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    with pytest.raises(AccountingError, match="steps_per_epoch must be None"):
        make_model().fit(pipeline.dataset, epochs=EPOCHS, steps_per_epoch=5, callbacks=[accountant()], verbose=0)
    with pytest.raises(AccountingError, match="class_weight must be None with a RandomAllocationDataset"):
        make_model().fit(
            pipeline.dataset, epochs=EPOCHS, class_weight={0: 1.0, 1: 2.0}, callbacks=[accountant()], verbose=0
        )


def test_a_kernel_regularizer_is_refused_before_the_first_step(data):
    """Keras adds the penalty to every entry of the loss vector (its scalar fails in Keras 2.14's add_n on the
    first step, with a shape error): refused first, with the fix."""
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    model = make_model(kernel_regularizer=tf.keras.regularizers.l2(0.01))
    with pytest.raises(AccountingError, match=r"no regularization loss with a RandomAllocationDataset.*Remove the"):
        model.fit(pipeline.dataset, epochs=EPOCHS, callbacks=[accountant()], verbose=0)


def test_microbatches_are_named_in_the_padded_rows(data):
    pipeline = RandomAllocationDataset(*data, batch_size=B, epochs=EPOCHS)
    L = pipeline.max_batch_size
    with pytest.raises(AccountingError, match=rf"equal to max_batch_size = {L} rows \(the RandomAllocationDataset"):
        make_model(num_microbatches=4).fit(pipeline.dataset, epochs=EPOCHS, callbacks=[accountant()], verbose=0)


def test_the_pipeline_validates_its_arguments(data):
    x, y = data
    with pytest.raises(ValueError, match="x and y must hold the same number"):
        RandomAllocationDataset(x, y[:-1], batch_size=B, epochs=1)
    with pytest.raises(ValueError, match=r"batch_size must be <= the number of examples = 240\. Found 241"):
        RandomAllocationDataset(x, y, batch_size=N + 1, epochs=1)
    with pytest.raises(ValueError, match="x must be one array with the examples along its first axis"):
        RandomAllocationDataset({"a": x, "b": x}, y, batch_size=B, epochs=1)
    with pytest.raises(ValueError, match=r"generator must be a numpy\.random\.Generator"):
        RandomAllocationDataset(x, y, batch_size=B, epochs=1, generator=42)
    assert math.isfinite(RandomAllocationDataset(x, y, batch_size=B, epochs=1).max_batch_size)


def test_the_example_gets_the_random_allocation_number(capsys):
    """examples/tf_privacy_random_allocation.py (docs/tf_privacy.md shows its output): the core's number for the
    padded run, TF Privacy's numbers NOT VALID beside it, every example once an epoch, the shuffled pipeline's valid
    number far above in the same relation."""
    from tests.stories.docs_blocks import _script

    pytest.importorskip("sklearn")
    result = _script("examples/tf_privacy_random_allocation.py").main(epochs=1)
    accountant, allocation = result["accountant"], result["allocation"]
    L = allocation.max_batch_size
    assert lp.host.padded_batch_size(1792, 64, 1, 28, lp.host.DEFAULT_OVERFLOW) == L
    expected = lp.epsilon("best", DELTA, dataset_size=1792, batch_size=64, noise_multiplier=1.0, steps=28,
                          sampling="random_allocation", max_batch_size=L)  # fmt: skip
    assert accountant.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    kept = sorted(i for _, rows in allocation.delivered for i in rows)
    assert kept == list(range(1792))
    out = capsys.readouterr().out
    assert "NOT VALID" in out and f"Every batch padded to {L} rows" in out
    assert result["shuffled"] > 3 * result["replace_one"]
