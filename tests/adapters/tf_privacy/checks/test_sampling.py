"""checks/sampling.py with a tf.data input: the scheme is read from the pipeline's transformations (_tfdata.py),
the declared sampling must be it, and the number is the core's for that scheme; what cannot be read is refused
naming the statement route."""

from __future__ import annotations

import pytest

from .support import EPOCHS, B, N, callback, core, data, fit, iterations, linear, lp, optimizer, tf

DECLARED = dict(smoothness=0.25, gradient_norms_within_clip=True)


def slices(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y))


# (pipeline, declared sampling = the core's sampling for the number, examples in the source)
READABLE = [
    ("reshuffle", lambda d: d.shuffle(N).batch(B), "reshuffle", N),
    ("no-shuffle", lambda d: d.batch(B).prefetch(2), "cyclic", N),
    ("shuffle-once", lambda d: d.shuffle(N, reshuffle_each_iteration=False).batch(B), "shuffle_once", N),
    ("cache-after-shuffle", lambda d: d.shuffle(N).cache().batch(B), "shuffle_once", N),
    ("cache-map-prefetch", lambda d: d.cache().map(lambda a, b: (2.0 * a, b)).shuffle(2 * N).batch(B).prefetch(1),
     "reshuffle", N),
    ("take-then-shuffle", lambda d: d.take(N).shuffle(N).batch(B, drop_remainder=True), "reshuffle", N + 16),
]  # fmt: skip


@pytest.mark.parametrize(("make", "sampling", "source"), [c[1:] for c in READABLE], ids=[c[0] for c in READABLE])
def test_a_readable_tf_data_pipeline_gets_the_number_of_its_scheme(make, sampling, source):
    x, y = data(source)
    model = linear()
    cb = callback(sampling, **DECLARED)
    history = fit(model, cb, make(slices(x, y)))
    expected = [core(sampling, update="sgd", steps=(e + 1) * N // B, **DECLARED).epsilon for e in range(EPOCHS)]
    assert history.history["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert cb.fit_settings.source.startswith("tf.data: ") and cb.fit_settings.batch_size == B
    assert iterations(model) == EPOCHS * N // B


def test_a_small_cnn_with_adam_on_a_shuffled_tf_data_pipeline_gets_the_every_iterate_number():
    rng = tf.random.Generator.from_seed(0)
    images = rng.normal((N, 8, 8, 1))
    labels = tf.cast(tf.reduce_mean(images, axis=[1, 2, 3]) > 0, tf.float32)
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.Input((8, 8, 1)), tf.keras.layers.Conv2D(4, 3, activation="relu"), tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(1),
    ])  # fmt: skip
    loss = tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
    model.compile(optimizer=optimizer("DPKerasAdamOptimizer", learning_rate=0.01), loss=loss)
    cb = callback("reshuffle")
    fit(model, cb, slices(images, labels).shuffle(N).batch(B).prefetch(1))
    assert cb.epsilon == pytest.approx(core("reshuffle").epsilon, rel=1e-12)
    assert "tf_privacy_epsilon_not_valid" in model.history.history


@pytest.mark.parametrize(
    ("make", "declared", "fragment"),
    [
        (lambda d: d.batch(B), "reshuffle", r"sampling must be cyclic or shuffle_once for tf.data"),
        (lambda d: d.shuffle(N).batch(B), "cyclic", r"sampling must be reshuffle for tf.data"),
        (lambda d: d.shuffle(N, reshuffle_each_iteration=False).batch(B), "reshuffle", "shuffle_once or cyclic"),
    ],
    ids=["fixed-declared-reshuffle", "reshuffled-declared-cyclic", "once-declared-reshuffle"],
)
def test_a_sampling_contradicting_the_pipeline_is_refused(make, declared, fragment):
    x, y = data()
    model = linear()
    with pytest.raises(lp.NotApplicableError, match=fragment):
        fit(model, callback(declared), make(slices(x, y)))
    assert iterations(model) == 0


UNREADABLE = [
    ("repeat-before-shuffle", lambda d: d.repeat(2).shuffle(2 * N).batch(B), "repeat\\(\\) makes a pass"),
    ("repeat-after-batch", lambda d: d.shuffle(N).batch(B).repeat(), "repeat\\(\\) makes a pass of fit longer"),
    ("op-seed", lambda d: d.shuffle(N, seed=42).batch(B), "op-level seed \\(42\\)"),
    ("shuffle-after-batch", lambda d: d.batch(B).shuffle(4), "a shuffle after the batch shuffles whole batches"),
    ("filter", lambda d: d.filter(lambda a, b: True).batch(B), "filter\\(\\) drops examples"),
    ("unbatched", lambda d: d, "it has no batch\\(\\)"),
    ("drop-remainder", lambda d: d.batch(24, drop_remainder=True), "must not drop examples"),
    ("short-last-batch", lambda d: d.batch(24), "batch_size must divide dataset_size = 64"),
]


@pytest.mark.parametrize(("make", "fragment"), [c[1:] for c in UNREADABLE], ids=[c[0] for c in UNREADABLE])
def test_a_pipeline_whose_scheme_cannot_be_read_is_refused(make, fragment):
    x, y = data()
    model = linear()
    tf.random.set_seed(None)  # no global seed: a seed given to shuffle is then the order's only seed
    kwargs = dict(steps_per_epoch=N // B) if "longer" in fragment else {}
    with pytest.raises(lp.NotApplicableError, match=fragment):
        fit(model, callback("reshuffle"), make(slices(x, y)), **kwargs)
    assert iterations(model) == 0


def test_a_refusal_names_the_statement_route():
    x, y = data()
    model = linear()
    tf.random.set_seed(None)
    with pytest.raises(lp.NotApplicableError, match=r"compute_last_iterate_privacy_statement\(number_of_examples="):
        fit(model, callback("reshuffle"), slices(x, y).shuffle(N, seed=1).batch(B))


def test_a_sample_weight_in_the_pipeline_is_checked_in_every_step():
    x, y = data()
    weights = tf.ones((N,)) * tf.constant([1.0] * (N - 1) + [2.0])
    model = linear()
    cb = callback("cyclic")
    with pytest.raises(lp.PipelineChangedError, match="every example's loss weight must be 1"):
        fit(model, cb, tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(B))
