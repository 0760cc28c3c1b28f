r"""What a ``tf.data.Dataset`` given to ``fit`` does with the examples: read from the dataset's own chain of
transformations (TensorFlow 2.14's dataset classes and their private attributes, read only; nothing is run).

This is the only module that reads them, behind :func:`check_tensorflow`, which refuses any TensorFlow but the
tested 2.14.x (``UnsupportedHostError``). :func:`read` walks the chain from ``fit``'s dataset back to its source
(``_input_dataset``) and returns :class:`DatasetFacts` (the examples of a pass, the batch size, what each pass
does with the order) or the reason the scheme cannot be read. What it accepts, source first:

* a source whose every element is one example and whose size is known: ``from_tensor_slices``, ``range``,
  ``zip`` of such sources;
* element-wise steps anywhere: ``map`` (also parallel), ``prefetch``, ``with_options``; ``take(k)`` before the
  batch (the dataset is then its first k examples); ``cache()`` anywhere (after a shuffle it keeps the first
  pass's order for every later pass);
* at most one ``shuffle(buffer_size, seed=None, reshuffle_each_iteration=...)`` before the batch, with a buffer
  holding every example (a smaller buffer is not a uniform permutation: an example moves at most a buffer's
  length ahead) and no op-level seed (a fixed seed makes the order public);
* exactly one ``batch(b)`` (also ``padded_batch``, parallel), after the shuffle.

Anything else (``repeat`` anywhere: it mixes passes or lengthens them; ``filter``, ``skip``, ``shard``,
``unbatch``, ``interleave``, ``flat_map``, a shuffle after the batch, a generator or file source) is refused by
name. Keras 2.14's ``fit`` iterates a dataset of known size afresh every epoch (``DataHandler``:
``should_recreate_iterator`` when ``steps_per_epoch`` is None), so each epoch is one pass of the chain.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from lastiter_plugins.errors import UnsupportedHostError

from ._observe import FIXED, ONCE, PERMUTATION

TESTED_TENSORFLOW = "2.14."


_SOURCES = {"_TensorSliceDataset", "_RangeDataset"}
_ELEMENTWISE = {"_MapDataset", "_ParallelMapDataset", "_PrefetchDataset", "_OptionsDataset"}
_BATCHES = {"_BatchDataset", "_ParallelBatchDataset", "_PaddedBatchDataset"}
_WHY_NOT = {
    "_RepeatDataset": "repeat() makes a pass of fit longer than one pass over the data and, before the shuffle, "
    "mixes the examples of several passes (an example can then be used twice in one epoch); remove it: fit "
    "iterates the dataset afresh every epoch",
    "_FilterDataset": "filter() drops examples depending on their content, so the examples of a pass are not known",
    "_SkipDataset": "skip() leaves examples out",
    "_ShardDataset": "shard() keeps a part of the examples",
    "_UnbatchDataset": "unbatch() makes the elements before the batch something else than the examples",
    "_FlatMapDataset": "flat_map() makes elements whose number and order cannot be read",
    "_InterleaveDataset": "interleave() makes elements whose number and order cannot be read",
    "_ParallelInterleaveDataset": "interleave() makes elements whose number and order cannot be read",
}

#: TensorFlow's seed of an op given a seed without a global seed (``random_seed.DEFAULT_GRAPH_SEED``).
_DEFAULT_GRAPH_SEED = 87654321


def check_tensorflow() -> None:
    """Refuse a TensorFlow whose dataset classes this module was not tested with."""
    if not tf.__version__.startswith(TESTED_TENSORFLOW):
        raise UnsupportedHostError(
            "the TF Privacy adapter reads a tf.data pipeline's transformations from TensorFlow's dataset classes, "
            f"and was tested with tensorflow {TESTED_TENSORFLOW}x only; another version may keep them elsewhere. "
            f"Pass in-memory arrays to fit, or use compute_last_iterate_privacy_statement. Found tensorflow "
            f"{tf.__version__}."
        )


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What one pass of a ``tf.data`` pipeline does.

    Attributes:
      examples: n, the examples entering the batch.
      batch_size: b as given to ``batch``.
      drop_remainder: the batch's ``drop_remainder``.
      order: what a pass does with the order (``_observe.FIXED``: the same every pass, ``PERMUTATION``: a new
        uniform permutation every pass, ``ONCE``: one drawn in the first pass and kept).
      chain: the transformations, source first (for messages).
    """

    examples: int
    batch_size: int
    drop_remainder: bool
    order: str
    chain: tuple[str, ...]


def _name(dataset: Any) -> str:
    return type(dataset).__name__


def _words(name: str) -> str:
    return name.strip("_").removesuffix("Dataset").lower() or name


def _int(value: Any) -> int:
    return int(value.numpy()) if hasattr(value, "numpy") else int(value)


def _cardinality(dataset: Any) -> int:
    return int(tf.data.experimental.cardinality(dataset).numpy())


def _source(dataset: Any) -> str | None:
    """Why ``dataset`` is not a source of one example per element, or None."""
    name = _name(dataset)
    if name == "_ZipDataset":
        for part in dataset._datasets:
            why = _chain_is_plain(part)
            if why is not None:
                return why
        return None
    if name in _SOURCES:
        return None
    return (
        f"its source {_words(name)} is not one whose elements are known to be one example each "
        "(from_tensor_slices, range, or zip of them)"
    )


def _chain_is_plain(dataset: Any) -> str | None:
    """A zipped part: a source and element-wise steps only."""
    while hasattr(dataset, "_input_dataset") and _name(dataset) in _ELEMENTWISE:
        dataset = dataset._input_dataset
    return _source(dataset)


def read(dataset: Any) -> DatasetFacts | str:
    """The pass of ``dataset`` (fit's ``x``), or why it cannot be read (a sentence ending without a period)."""
    check_tensorflow()
    chain: list[Any] = []
    node = dataset
    while hasattr(node, "_input_dataset"):
        chain.append(node)
        node = node._input_dataset
    source = node
    why = _source(source)
    if why is not None:
        return why
    chain.reverse()  # source first
    batch = shuffle = None
    cached_after_shuffle = False
    for node in chain:
        name = _name(node)
        if name in _ELEMENTWISE:
            continue
        if name == "CacheDataset":
            cached_after_shuffle = cached_after_shuffle or shuffle is not None
            continue
        if name in _WHY_NOT:
            return _WHY_NOT[name]
        if name == "_TakeDataset":
            if batch is not None or shuffle is not None:
                return "take() after the shuffle or the batch makes a pass use a part of the examples"
            continue
        if name == "_ShuffleDataset":
            if batch is not None:
                return "a shuffle after the batch shuffles whole batches, which is none of the covered schemes"
            if shuffle is not None:
                return "it shuffles twice"
            shuffle = node
            continue
        if name in _BATCHES:
            if batch is not None:
                return "it batches twice"
            batch = node
            continue
        return f"{_words(name)} is a transformation whose effect on the examples is not read"
    if batch is None:
        return "it has no batch(): every element must be one batch of examples"
    n = _cardinality(batch._input_dataset)
    if n <= 0:
        return f"the number of examples before the batch is not known (cardinality {n})"
    order = FIXED
    if shuffle is not None:
        buffer = _int(shuffle._buffer_size)
        if buffer < n:
            return (
                f"its shuffle buffer holds {buffer} examples, fewer than the {n} of a pass: a partial shuffle is not "
                "a uniform permutation (an example moves at most a buffer's length ahead); use shuffle(buffer_size=n)"
            )
        if _int(shuffle._seed) == _DEFAULT_GRAPH_SEED:
            return (
                f"its shuffle has an op-level seed ({_int(shuffle._seed2)}): the order is then reproducible by anyone "
                "who knows the seed; remove the seed"
            )
        reshuffle = bool(_int(shuffle._reshuffle_each_iteration))
        order = PERMUTATION if reshuffle and not cached_after_shuffle else ONCE
    return DatasetFacts(
        examples=n,
        batch_size=_int(batch._batch_size),
        drop_remainder=bool(_int(batch._drop_remainder)),
        order=order,
        chain=(_words(_name(source)), *(_words(_name(node)) for node in chain)),
    )
