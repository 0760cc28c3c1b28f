"""lastiter_plugins/adapters/tf_privacy/_tfdata.py: what a tf.data pipeline does with the examples, read from its
transformations (nothing is run), behind a TensorFlow version guard."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorflow_privacy")

from lastiter_plugins import UnsupportedHostError  # noqa: E402
from lastiter_plugins.adapters.tf_privacy import _observe, _tfdata  # noqa: E402

N, B = 12, 4


def source():
    return tf.data.Dataset.zip((tf.data.Dataset.range(N), tf.data.Dataset.from_tensor_slices(tf.zeros((N, 2)))))


@pytest.mark.parametrize(
    ("make", "order", "batch", "chain"),
    [
        (lambda d: d.batch(B), _observe.FIXED, B, ("zip", "batch")),
        (lambda d: d.shuffle(N).batch(B), _observe.PERMUTATION, B, ("zip", "shuffle", "batch")),
        (lambda d: d.shuffle(N + 5).batch(B, drop_remainder=True), _observe.PERMUTATION, B, None),
        (lambda d: d.shuffle(N, reshuffle_each_iteration=False).batch(B), _observe.ONCE, B, None),
        (lambda d: d.shuffle(N).cache().batch(B), _observe.ONCE, B, None),
        (lambda d: d.shuffle(N).batch(B).cache(), _observe.ONCE, B, None),
        (lambda d: d.cache().shuffle(N).batch(B).map(lambda a, b: (a, b)).prefetch(1), _observe.PERMUTATION, B, None),
        (lambda d: d.take(N - 4).shuffle(N).batch(2, num_parallel_calls=2), _observe.PERMUTATION, 2, None),
        (lambda d: d.padded_batch(B), _observe.FIXED, B, ("zip", "paddedbatch")),
    ],
    ids=["fixed", "reshuffle", "large-buffer", "once", "cache-after-shuffle", "cache-batches", "elementwise", "take",
         "padded"],
)  # fmt: skip
def test_the_scheme_is_read_from_the_transformations(make, order, batch, chain):
    facts = _tfdata.read(make(source()))
    assert not isinstance(facts, str), facts
    assert facts.order == order and facts.batch_size == batch
    assert facts.examples == (N - 4 if "take" in facts.chain else N)
    assert chain is None or facts.chain == chain


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (lambda d: d.shuffle(N - 1).batch(B), "holds 11 examples, fewer than the 12 of a pass"),
        (lambda d: d.shuffle(N, seed=3).batch(B), "op-level seed (3)"),
        (lambda d: d.repeat(2).shuffle(N).batch(B), "repeat()"),
        (lambda d: d.batch(B).repeat(2), "repeat()"),
        (lambda d: d.shuffle(N).shuffle(N).batch(B), "it shuffles twice"),
        (lambda d: d.batch(B).batch(2), "it batches twice"),
        (lambda d: d.batch(B).take(2), "take() after the shuffle or the batch"),
        (lambda d: d.skip(2).batch(B), "skip() leaves examples out"),
        (lambda d: d.shard(2, 0).batch(B), "shard()"),
        (lambda d: d.batch(B).unbatch().batch(B), "is a transformation whose effect on the examples is not read"),
        (lambda d: d.enumerate().batch(B), "not one whose elements are known to be one example each"),
        (lambda d: d, "it has no batch()"),
        (lambda d: d.batch(B).shuffle(3), "a shuffle after the batch"),
    ],
    ids=["small-buffer", "op-seed", "repeat-first", "repeat-last", "two-shuffles", "two-batches",
         "take-after-batch", "skip", "shard", "unbatch", "enumerate", "no-batch", "shuffle-batches"],
)  # fmt: skip
def test_what_cannot_be_read_is_named(make, fragment):
    tf.random.set_seed(None)  # an op-level seed is then the order's only seed
    why = _tfdata.read(make(source()))
    assert isinstance(why, str) and fragment in why, why


def test_generator_and_file_sources_are_not_read(tmp_path):
    gen = tf.data.Dataset.from_generator(lambda: iter(range(N)), output_signature=tf.TensorSpec((), tf.int64))
    assert "its source tensor is not one" in _tfdata.read(gen.batch(B))  # a generator is a flat_map of a tensor
    path = str(tmp_path / "x.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"x")
    assert "its source tfrecorddatasetv2 is not one" in _tfdata.read(tf.data.TFRecordDataset(path).batch(B))


def test_a_global_seed_is_a_precondition_not_a_refusal():
    tf.random.set_seed(7)  # the order is as secret as the global seed (as for fit's own shuffle of arrays)
    facts = _tfdata.read(tf.data.Dataset.range(N).shuffle(N).batch(B))
    assert not isinstance(facts, str) and facts.order == _observe.PERMUTATION
    tf.random.set_seed(None)


def test_another_tensorflow_is_refused(monkeypatch):
    monkeypatch.setattr(tf, "__version__", "2.15.0")
    with pytest.raises(UnsupportedHostError, match=r"tested with tensorflow 2\.14\.x only.*Found tensorflow 2\.15\.0"):
        _tfdata.read(tf.data.Dataset.range(N).batch(B))
