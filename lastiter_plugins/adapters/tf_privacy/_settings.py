r"""What the run is, derived from the host's facts (:mod:`._observe`, :mod:`._tfdata`) before the first step:
the DP optimizer's mechanism (:class:`DPOptimizerSettings`) and what ``fit`` does with the data
(:class:`FitSettings`). What no row covers (not a Gaussian DP-SGD mechanism, a scheme that cannot be read) is
refused here, naming the setting and the fix; what only some rows cover is left to the checks
(:mod:`.checks`), which turn it into departures.

Only public Keras API here; host internals come through :mod:`._observe` and :mod:`._tfdata`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import tensorflow as tf

from . import _allocation_input, _tfdata
from . import _observe as observe
from ._errors import AccountingError


def flag(value: Any) -> Any:
    """A numpy bool as a Python bool (anything else unchanged, for the core to validate)."""
    return bool(value) if isinstance(value, np.bool_) else value


# ---------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class DPOptimizerSettings:
    """What a TF Privacy DP Keras optimizer does, read from the optimizer itself.

    Attributes:
      optimizer_class: TF Privacy's name (``DPKerasSGDOptimizer``, ``DPKerasAdamOptimizer``,
        ``VectorizedDPKerasAdagradOptimizer``, ``DPSparseKerasSGDOptimizer``, ...).
      base: the Keras update applied to the noised gradient: ``SGD``, ``Adam`` or ``Adagrad``.
      l2_norm_clip: C, the clipping norm of each microbatch gradient.
      noise_multiplier: z; the noise added to the sum of clipped gradients has std z*C.
      num_microbatches: None (one example per microbatch) or the fixed number of microbatches.
      learning_rate: eta, the constant step size; with a schedule, its rate at step 0.
      schedule: what makes the rate change with the step (a ``LearningRateSchedule``'s class, Keras' legacy
        ``decay``), or None for a constant rate.
      momentum: SGD's momentum (0 for Adam and Adagrad, whose update is not SGD anyway; nan when it is a tensor
        or a callable).
      nesterov: SGD's Nesterov flag.
      keras_clipping: Keras' own clipping of the noised gradient (``clipnorm``, ``clipvalue``,
        ``global_clipnorm``), the ones set.
    """

    optimizer_class: str
    base: str
    l2_norm_clip: float
    noise_multiplier: float
    num_microbatches: int | None
    learning_rate: float
    schedule: str | None = None
    momentum: float = 0.0
    nesterov: bool = False
    keras_clipping: tuple[tuple[str, float], ...] = ()


def learning_rate(raw: Any) -> tuple[float, str | None]:
    """(the rate at step 0, the schedule's name or None) of a learning-rate hyperparameter, or AccountingError."""
    if isinstance(raw, tf.keras.optimizers.schedules.LearningRateSchedule):
        value = observe.finite_positive(raw(0))
        if value is None:
            raise AccountingError(f"the learning-rate schedule must start at a finite rate > 0. Found {raw(0)!r}.")
        return value, type(raw).__name__
    value = observe.finite_positive(raw) if not callable(raw) or isinstance(raw, tf.Variable) else None
    if value is None:
        raise AccountingError(
            "learning_rate must be a number (finite and > 0), a tf.Variable or a "
            "tf.keras.optimizers.schedules.LearningRateSchedule (a rate fixed in advance for every step): a "
            f"callable may compute the rate from anything, and cannot be checked to be fixed in advance. Found {raw!r}."
        )
    return value, None


def read_dp_optimizer(optimizer: Any) -> DPOptimizerSettings:
    """Read and check a TF Privacy DP Keras optimizer.

    Accepted: every DP Keras optimizer of TF Privacy 0.9 with Gaussian noise (``DPKeras{SGD,Adam,Adagrad}Optimizer``,
    ``VectorizedDPKeras{SGD,Adam,Adagrad}Optimizer``, ``DPSparseKeras{SGD,Adam,Adagrad}Optimizer``), with
    ``gradient_accumulation_steps == 1``, no ``gradient_transformers`` and a learning rate that is a number, a
    ``tf.Variable`` or a ``LearningRateSchedule``. Which rows such an optimizer leaves is the checks' business.

    Raises:
      AccountingError: anything else, naming the setting and the fix.
      UnsupportedHostError: an untested TF / TF Privacy version.
    """
    observe.check_host()
    f = observe.optimizer_facts(optimizer)
    if f.name is None or f.base is None:
        raise AccountingError(
            "the optimizer must be one of TF Privacy's DP Keras optimizers (DPKerasSGDOptimizer, DPKerasAdamOptimizer, "
            "DPKerasAdagradOptimizer, their Vectorized and DPSparse variants), which clip every example's gradient "
            "and add Gaussian noise before the update: a non-private optimizer releases the data without noise. "
            f"Found {type(optimizer).__module__}.{type(optimizer).__name__}."
        )
    if f.query is None:
        raise AccountingError(
            "the DP query must be TF Privacy's GaussianSumQuery (what DPKeras*Optimizer builds): "
            "tree aggregation (DP-FTRL), adaptive clipping and other queries are not DP-SGD."
        )
    if f.accumulation != 1:
        raise AccountingError(
            "gradient_accumulation_steps must be 1: with accumulation the optimizer noises every "
            "small batch and applies their average, a different mechanism (batch and noise change). "
            f"Found {f.accumulation}."
        )
    clip, noise = observe.finite_positive(f.clip), observe.finite_positive(f.noise_multiplier)
    if clip is None:
        raise AccountingError(f"l2_norm_clip must be a finite number > 0. Found {f.clip!r}.")
    if noise is None:
        raise AccountingError(f"noise_multiplier must be a finite number > 0. Found {f.noise_multiplier!r}.")
    if f.gradient_transformers:
        raise AccountingError(
            "gradient_transformers must be empty: they are functions of your own applied to the noised gradient, "
            "which may read anything (the data included), and cannot be checked to be post-processing. "
            f"Found {f.gradient_transformers!r}."
        )
    microbatches = f.num_microbatches
    if microbatches is not None:
        value = observe.value_of(microbatches)
        if value is None or value != int(value) or value < 1:
            raise AccountingError(f"num_microbatches must be None or an integer >= 1. Found {microbatches!r}.")
        microbatches = int(value)
    rate, schedule = learning_rate(f.learning_rate)
    if f.decay != 0.0:
        schedule = schedule or f"Keras' legacy decay eta/(1 + {f.decay:g} t)"
    momentum = observe.value_of(f.momentum) if f.momentum is not None else 0.0
    if momentum is None or (f.uses_momentum and momentum == 0.0):
        momentum = math.nan  # a momentum tensor or callable: not a number known in advance, and not 0
    return DPOptimizerSettings(
        optimizer_class=f.name,
        base=f.base,
        l2_norm_clip=clip,
        noise_multiplier=noise,
        num_microbatches=microbatches,
        learning_rate=rate,
        schedule=schedule,
        momentum=float(momentum),
        nesterov=f.nesterov,
        keras_clipping=tuple((name, float(v)) for name, v in f.keras_clipping.items() if v is not None),
    )


def check_microbatches(settings: DPOptimizerSettings, batch_size: int, named: str | None = None) -> None:
    """One example (row) per microbatch: ``num_microbatches`` None or ``batch_size``, the rows of every batch
    (``named``: those rows in the user's words, default ``batch_size = b``)."""
    k = settings.num_microbatches
    if k is None or k == batch_size:
        return
    raise AccountingError(
        f"num_microbatches must be None or equal to {named or f'batch_size = {batch_size}'} (one example per "
        f"microbatch). Found num_microbatches={k}, i.e. microbatches of {batch_size / k:g} examples. "
        f"TF Privacy then clips the mean gradient of each microbatch (not each example's gradient), adds "
        f"N(0, (zC)^2) to the sum of the {k} clipped microbatch gradients and divides by {k}. One example "
        f"can move its microbatch's clipped mean by up to 2C, so a step moves by up to 2*eta*C/{k}, not "
        f"2*eta*C/{batch_size}: the records of this mechanism are microbatches, not examples, and the "
        "bounds' constants (n, b, the Lipschitz constant of the per-example-clipped update) do not "
        "describe it (TF Privacy's own accounting doubles the sensitivity for microbatching). "
        "Use num_microbatches=None."
    )


# ---------------------------------------------------------------- what fit does


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """What the running ``Model.fit`` does with the data.

    Attributes:
      dataset_size: number of training examples (after ``validation_split``).
      batch_size: b, the rows of every step (n when fit's batch_size >= n: full-batch training).
      steps_per_epoch: n / b.
      shuffle: fit's shuffle setting (True, False or "batch"; for a tf.data input, the pipeline's shuffle in
        words).
      order: what fit does with the order of the examples across epochs (``_observe.FIXED``,
        ``PERMUTATION``, ``ONCE`` or ``BATCH_ORDER``; ``shuffle="batch"`` is a full permutation for ragged and
        sparse inputs).
      epochs: epochs this fit call will run (``epochs - initial_epoch``, >= 1).
      callbacks: the callbacks of this fit call.
      source: ``"arrays"`` (in-memory inputs batched by fit) or ``"tf.data"`` (with the pipeline's transformations,
        source first).
      validation_split: fit's validation_split (validation data taken from the private data).
      validation_data: whether fit got separate validation_data.
      allocation: the :class:`RandomAllocationDataset` fit's x comes from (random allocation, every batch padded
        to its ``max_batch_size`` rows), None for any other input.
    """

    dataset_size: int
    batch_size: int
    steps_per_epoch: int
    shuffle: bool | str
    order: str
    epochs: int
    callbacks: tuple[Any, ...]
    source: str = "arrays"
    validation_split: float = 0.0
    validation_data: bool = False
    allocation: _allocation_input.RandomAllocationDataset | None = None

    @property
    def rows_per_step(self) -> int:
        """The rows of every step's batch, which TF Privacy divides the noisy sum by: b, or the padded length."""
        return self.batch_size if self.allocation is None else self.allocation.max_batch_size

    @property
    def rows_named(self) -> str:
        """:attr:`rows_per_step` in the user's words: ``batch_size = b examples``, or a RandomAllocationDataset's
        ``max_batch_size = L rows`` (its examples and the padding)."""
        if self.allocation is None:
            return f"batch_size = {self.batch_size} examples"
        return f"max_batch_size = {self.rows_per_step} rows (the RandomAllocationDataset's padded batches)"


def read_fit(model: Any) -> FitSettings:
    """Read and check the running ``Model.fit`` call of ``model``."""
    observe.check_host()
    facts = observe.running_fit(model)
    if facts is None:
        raise AccountingError(
            "LastIterateCallback must be passed to Keras' Model.fit (tensorflow 2.14 / Keras 2.14): it "
            "reads fit's batch size, shuffle setting and callback list from the running fit call, and "
            "found none (a custom training loop, or a subclass that does not call Model.fit). "
            "Found no running Model.fit for this model."
        )
    if facts.epochs < 1:
        raise AccountingError(
            f"fit must run at least one epoch: epochs={facts.epochs + facts.initial_epoch} with initial_epoch="
            f"{facts.initial_epoch} runs no step, so there is nothing to account (and fit's epochs counts from "
            "0, not from initial_epoch). Pass epochs > initial_epoch."
        )
    allocation = _allocation_input.pipeline_of(facts.dataset) if facts.dataset is not None else None
    if allocation is not None:
        b, batches, partial = allocation.batch_size, allocation.steps_per_epoch, 0
        shuffle, order = "a fresh random allocation every epoch", observe.ALLOCATION
        source = f"RandomAllocationDataset (batches padded to {allocation.max_batch_size} rows)"
        if facts.class_weight is not None:
            raise AccountingError(
                "class_weight must be None with a RandomAllocationDataset: its sample weights (1 for the step's "
                "examples, 0 for the padding) are the only loss weights, and a class weight rescales an example's "
                f"loss. Fold the weights into the loss function. Found class_weight={facts.class_weight!r}."
            )
        if allocation in _allocation_input.pipelines_in(facts.validation_data):
            raise AccountingError(
                "validation_data must not draw from the RandomAllocationDataset fit trains on: Keras evaluates it "
                "between epochs, which draws allocations of its own from the same dataset, and the callback "
                "matches every step to the batches the dataset delivered, in order. Validate on held-out data (or "
                "on a RandomAllocationDataset of its own). Found validation_data built from the training dataset."
            )
    elif facts.dataset is not None:
        b, batches, partial, shuffle, order, source = _tf_data(facts)
    elif facts.in_memory:
        assert facts.order is not None  # in memory: _in_memory read the order
        b, batches, partial, shuffle, order = (
            facts.batch_size,
            facts.num_batches,
            facts.partial_batch_size,
            facts.shuffle,
            facts.order,
        )
        source = "arrays"
    else:
        raise AccountingError(
            "fit's x must be in-memory arrays or tensors (numpy, tf.Tensor, RaggedTensor, SparseTensor, pandas, Python "
            "lists) batched by fit's batch_size, or a tf.data.Dataset whose transformations show the scheme: only "
            "then are the batch size, the batches and the shuffling known. For a generator or a keras Sequence they "
            "are not, and the declared sampling cannot be checked (a generator may repeat or drop examples). Pass the "
            "arrays to fit(x, y, batch_size=..., shuffle=...), or compute the number for the pipeline you ran with "
            f"compute_last_iterate_privacy_statement(...). Found an input handled by {facts.adapter}."
        )
    weights = weights_other_than_one(facts.sample_weight, facts.class_weight)
    if weights:
        raise AccountingError(
            "sample_weight and class_weight must be None or all 1: other weights rescale each example's loss, so "
            "the declared smoothness/convexity constants and the effective learning rate would change per "
            "example. Fold the weights into the loss function and declare constants for that loss. "
            f"Found {weights}."
        )
    n = ((batches - 1) * b + partial if partial else batches * b) if allocation is None else allocation.dataset_size
    if facts.inferred_steps != batches:
        raise AccountingError(
            f"steps_per_epoch must be None (or ceil(dataset_size / batch_size) = {batches}): an epoch "
            f"of fit must be one pass over the data. Found steps_per_epoch={facts.inferred_steps}."
        )
    if model.distribute_strategy.num_replicas_in_sync != 1:
        raise AccountingError(
            "fit must run on one replica: under a distribution strategy each replica clips, noises and "
            "normalises its own share of the batch. "
            f"Found {model.distribute_strategy.num_replicas_in_sync} replicas."
        )
    if facts.steps_per_execution != 1:
        raise AccountingError(
            "steps_per_execution must be 1: the callback checks every optimizer step (batch, loss vector, "
            "clip norm, noise, learning rate, parameters) and Keras calls batch callbacks once per execution. "
            "Compile with steps_per_execution=1. Found "
            f"steps_per_execution={facts.steps_per_execution or 'tuned at run time'}."
        )
    if allocation is None and batches == 1:  # full batch: every step uses all n examples and TF Privacy divides by n
        b = n
    elif partial:
        raise AccountingError(
            f"batch_size must divide dataset_size = {n}: fit would end every epoch with a batch of "
            f"{partial} examples, and TF Privacy divides each batch's noisy gradient sum by its own "
            f"size, so one example in that batch moves the step by 2*eta*C/{partial}, {b / partial:g} times "
            f"the 2*eta*C/{b} the cyclic last-iterate bounds assume while the other steps keep the noise "
            f"eta*z*C/b. Choose a batch_size that divides {n} ({_divisors_near(n, b)}), or train on the "
            f"first {(n // b) * b} examples. Found batch_size={b}."
        )
    return FitSettings(
        dataset_size=n,
        batch_size=b,
        steps_per_epoch=batches if allocation is not None else n // b,
        shuffle=shuffle,
        order=order,
        epochs=facts.epochs,
        callbacks=facts.callbacks,
        source=source,
        validation_split=facts.validation_split,
        validation_data=facts.validation_data is not None,
        allocation=allocation,
    )


def _tf_data(facts: observe.FitFacts) -> tuple[int, int, int, str, str, str]:
    """(b, batches, partial batch size, shuffle in words, order, source) of a tf.data input, or AccountingError."""
    if _allocation_input.pipelines_in(facts.dataset):  # not the dataset itself (read_fit found none there)
        raise AccountingError(
            "a RandomAllocationDataset's dataset must be given to fit as it is (or followed by prefetch only): "
            "a transformation after it (a map, a filter, a repeat, a batch, a shuffle...) changes the batches it "
            "draws, which the callback checks step by step against the allocation. Apply your per-example "
            "preprocessing to x before building it, or in the model. Found it behind another transformation."
        )
    read = _tfdata.read(facts.dataset)
    if isinstance(read, str):
        raise AccountingError(
            "a tf.data.Dataset given to fit must show its scheme in its transformations (a source of examples such "
            "as from_tensor_slices, at most one shuffle(buffer_size >= n) before one batch(b), element-wise maps and "
            f"prefetch): this one cannot be read, because {read}. Pass the arrays to fit(x, y, batch_size=..., "
            "shuffle=...) instead, or compute the number for the pipeline you ran with "
            "compute_last_iterate_privacy_statement(number_of_examples=..., batch_size=..., num_epochs=..., "
            "noise_multiplier=..., delta=..., l2_norm_clip=..., sampling=...)."
        )
    n, b = read.examples, read.batch_size
    if read.drop_remainder and n % b:
        raise AccountingError(
            f"batch(drop_remainder=True) must not drop examples: {n} examples in batches of {b} leave {n % b} out of "
            "every pass (and with a shuffle, different ones each epoch), which is none of the covered schemes. "
            f"Choose a batch size that divides {n} ({_divisors_near(n, b)}). Found batch({b}, drop_remainder=True)."
        )
    batches = -(-n // b)
    partial = n % b
    words = {observe.FIXED: "no shuffle", observe.PERMUTATION: "shuffle(n), reshuffled every epoch"}
    shuffle = words.get(read.order, "shuffle(n) once (reshuffle_each_iteration=False, or a cache after it)")
    return b, batches, partial, shuffle, read.order, "tf.data: " + " -> ".join(read.chain)


def weights_other_than_one(sample_weight: Any, class_weight: Any) -> str:
    """What fit's sample_weight / class_weight hold other than 1 (empty when both are None or all 1)."""
    found = []
    if sample_weight is not None:
        values = np.concatenate([np.ravel(np.asarray(w, dtype=np.float64)) for w in tf.nest.flatten(sample_weight)])
        if not np.all(values == 1.0):
            found.append(f"sample_weight with values in [{values.min():g}, {values.max():g}]")
    if class_weight is not None:
        values = np.asarray([float(w) for w in dict(class_weight).values()], dtype=np.float64)
        if not np.all(values == 1.0):
            found.append(f"class_weight={dict(class_weight)!r}")
    return " and ".join(found)


def _divisors_near(n: int, b: int) -> str:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    below = [d for d in divisors if d < b][-2:]
    above = [d for d in divisors if d > b][:2]
    return "e.g. " + ", ".join(str(d) for d in [*below, *above])
