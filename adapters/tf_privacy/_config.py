r"""The TF Privacy adapter's configuration: what the DP optimizer, ``fit`` and the model are set up
to do, checked against what the bounds cover before the first step.

Only public Keras API here; host internals come through :mod:`._internals`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from lastiter_plugins import BOUNDS, NotApplicableError, Relation, Sampling

from . import _internals as internals


class AccountingError(NotApplicableError):
    """The training run cannot be accounted (the message names the setting and the fix)."""


#: The samplings that describe what Keras ``fit`` does with in-memory inputs (``FitSettings.order``, read
#: by ``_internals``): a new uniform permutation every epoch is reshuffling; a fixed order is cyclic, or
#: shuffle_once when the user permuted the data once, at random and in secret, before fit. Fixed batches
#: in a shuffled order (``fit(shuffle="batch")`` on arrays) is none of the covered schemes.
SAMPLINGS_FOR_ORDER: dict[str, tuple[Sampling, ...]] = {
    internals.PERMUTATION: (Sampling.RESHUFFLE,),
    internals.FIXED: (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE),
    internals.BATCH_ORDER: (),
}


def flag(value: Any) -> Any:
    """A numpy bool as a Python bool (anything else unchanged, for the core to validate)."""
    return bool(value) if isinstance(value, np.bool_) else value


# ---------------------------------------------------------------- the optimizer


@dataclasses.dataclass(frozen=True)
class DPOptimizerSettings:
    """What a TF Privacy DP-SGD optimizer does, read from the optimizer itself.

    Attributes:
      optimizer_class: DPKerasSGDOptimizer (TF Privacy's generic class) or VectorizedDPKerasSGDOptimizer.
      l2_norm_clip: C, the clipping norm of each microbatch gradient.
      noise_multiplier: z; the noise added to the sum of clipped gradients has std z*C.
      num_microbatches: None (one example per microbatch) or the fixed number of microbatches.
      learning_rate: eta, the constant step size.
    """

    optimizer_class: str
    l2_norm_clip: float
    noise_multiplier: float
    num_microbatches: int | None
    learning_rate: float


def learning_rate(raw: Any) -> float:
    """The constant learning rate, or AccountingError."""
    if isinstance(raw, tf.keras.optimizers.schedules.LearningRateSchedule):
        raise AccountingError(
            "learning_rate must be a constant number: the bounds assume a constant step size and no "
            "direction of a schedule is safe for all of them. "
            f"Found the schedule {type(raw).__name__}."
        )
    value = internals.finite_positive(raw) if not callable(raw) or isinstance(raw, tf.Variable) else None
    if value is None:
        raise AccountingError(
            f"learning_rate must be a constant number, finite and > 0 (not a callable). Found {raw!r}."
        )
    return value


def read_dp_optimizer(optimizer: Any) -> DPOptimizerSettings:
    """Read and check a TF Privacy DP-SGD optimizer.

    Accepted: ``DPKerasSGDOptimizer`` (TF Privacy's ``GenericDPSGDOptimizer``
    with a ``GaussianSumQuery``) and ``VectorizedDPKerasSGDOptimizer``, with
    momentum 0, no Nesterov, no ``decay``, no Keras gradient clipping or
    transformation, ``gradient_accumulation_steps == 1`` and a constant
    learning rate.

    Raises:
      AccountingError: anything else, naming the setting and the fix.
      UnsupportedHostError: an untested TF / TF Privacy version.
    """
    internals.check_host()
    f = internals.optimizer_facts(optimizer)
    if f.kind is None:
        raise AccountingError(
            "the optimizer must be TF Privacy's DPKerasSGDOptimizer or VectorizedDPKerasSGDOptimizer "
            "(plain DP-SGD, the update every bound analyses); Adam, Adagrad and non-private optimizers are "
            f"refused. Found {type(optimizer).__module__}.{type(optimizer).__name__}."
        )
    if f.query is None:
        raise AccountingError(
            "the DP query must be TF Privacy's GaussianSumQuery (what DPKerasSGDOptimizer builds): "
            "tree aggregation (DP-FTRL), adaptive clipping and other queries are not DP-SGD."
        )
    if f.accumulation != 1:
        raise AccountingError(
            "gradient_accumulation_steps must be 1: with accumulation the optimizer noises every "
            "small batch and applies their average, a different mechanism (batch and noise change). "
            f"Found {f.accumulation}."
        )
    clip, noise = internals.finite_positive(f.clip), internals.finite_positive(f.noise_multiplier)
    if clip is None:
        raise AccountingError(f"l2_norm_clip must be a finite number > 0. Found {f.clip!r}.")
    if noise is None:
        raise AccountingError(f"noise_multiplier must be a finite number > 0. Found {f.noise_multiplier!r}.")
    if f.uses_momentum or internals.value_of(f.momentum) != 0.0:
        raise AccountingError(f"momentum must be 0: the bounds analyse plain SGD. Found momentum={f.momentum!r}.")
    if f.nesterov:
        raise AccountingError("nesterov must be False: the bounds analyse plain SGD. Found True.")
    if f.decay != 0.0:
        raise AccountingError(
            "decay must be 0: Keras' legacy decay is a learning-rate schedule eta/(1 + decay*t), and the "
            f"bounds assume a constant step. Found decay={f.decay!r}."
        )
    for name, value in f.keras_clipping.items():
        if value is not None:
            raise AccountingError(
                f"{name} must be None: Keras would clip the already noised gradient, which changes the "
                f"update the bounds analyse (TF Privacy's l2_norm_clip does the DP clipping). Found {name}={value!r}."
            )
    if f.gradient_transformers:
        raise AccountingError(
            "gradient_transformers must be empty: they change the noised gradient before the update. "
            f"Found {f.gradient_transformers!r}."
        )
    microbatches = f.num_microbatches
    if microbatches is not None:
        value = internals.value_of(microbatches)
        if value is None or value != int(value) or value < 1:
            raise AccountingError(f"num_microbatches must be None or an integer >= 1. Found {microbatches!r}.")
        microbatches = int(value)
    return DPOptimizerSettings(
        optimizer_class=f.kind,
        l2_norm_clip=clip,
        noise_multiplier=noise,
        num_microbatches=microbatches,
        learning_rate=learning_rate(f.learning_rate),
    )


def check_microbatches(settings: DPOptimizerSettings, batch_size: int) -> None:
    k = settings.num_microbatches
    if k is None or k == batch_size:
        return
    raise AccountingError(
        f"num_microbatches must be None or equal to batch_size = {batch_size} (one example per "
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
      shuffle: fit's shuffle setting (True, False or "batch").
      order: what fit does with the order of the examples across epochs (``_internals.FIXED``,
        ``PERMUTATION`` or ``BATCH_ORDER``; ``shuffle="batch"`` is a full permutation for ragged and
        sparse inputs).
      epochs: epochs this fit call will run (``epochs - initial_epoch``, >= 1).
      callbacks: the callbacks of this fit call.
    """

    dataset_size: int
    batch_size: int
    steps_per_epoch: int
    shuffle: bool | str
    order: str
    epochs: int
    callbacks: tuple[Any, ...]


def read_fit(model: Any) -> FitSettings:
    """Read and check the running ``Model.fit`` call of ``model``."""
    internals.check_host()
    facts = internals.running_fit(model)
    if facts is None:
        raise AccountingError(
            "LastIterateCallback must be passed to Keras' Model.fit (tensorflow 2.14 / Keras 2.14): it "
            "reads fit's batch size, shuffle setting and callback list from the running fit call, and "
            "found none (a custom training loop, or a subclass that does not call Model.fit). "
            "Found no running Model.fit for this model."
        )
    if not facts.in_memory:
        raise AccountingError(
            "fit's x must be in-memory arrays or tensors (numpy, tf.Tensor, RaggedTensor, SparseTensor, pandas, "
            "Python lists), batched by fit's batch_size: only then are the batch size, the batches and the shuffling "
            "known. For a tf.data.Dataset, a generator or a keras Sequence they are not, and the declared sampling "
            "cannot be checked: a tf.data shuffle buffer smaller than the dataset is not a uniform permutation "
            "(an example can only move a buffer's length ahead), and a generator may repeat or drop examples. "
            f"Pass the arrays to fit(x, y, batch_size=..., shuffle=...) instead. Found an input handled by "
            f"{facts.adapter}."
        )
    if facts.epochs < 1:
        raise AccountingError(
            f"fit must run at least one epoch: epochs={facts.epochs + facts.initial_epoch} with initial_epoch="
            f"{facts.initial_epoch} runs no step, so there is nothing to account (and fit's epochs counts from "
            "0, not from initial_epoch). Pass epochs > initial_epoch."
        )
    weights = weights_other_than_one(facts.sample_weight, facts.class_weight)
    if weights:
        raise AccountingError(
            "sample_weight and class_weight must be None or all 1: other weights rescale each example's loss, so "
            "the declared smoothness/convexity constants and the effective learning rate would change per "
            "example. Fold the weights into the loss function and declare constants for that loss. "
            f"Found {weights}."
        )
    b, batches, partial = facts.batch_size, facts.num_batches, facts.partial_batch_size
    n = (batches - 1) * b + partial if partial else batches * b
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
    if batches == 1:  # full batch: every step uses all n examples and TF Privacy divides by n
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
        steps_per_epoch=n // b,
        shuffle=facts.shuffle,
        order=facts.order,
        epochs=facts.epochs,
        callbacks=facts.callbacks,
    )


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


def check_sampling(declared: Sampling, fit: FitSettings, relation: Relation) -> None:
    """The declared sampling must describe what fit does with the order of the examples.

    A fixed order (fit(shuffle=False)) declared as ``reshuffle`` is accepted only when every bound the
    registry proves for reshuffling is also proven for a fixed order (cyclic) under ``relation``: such a
    bound holds for every order of the data, the fixed one included."""
    shown = f"fit(shuffle={fit.shuffle!r})"
    if fit.order == internals.BATCH_ORDER:
        raise AccountingError(
            "fit's shuffle must be True (a new permutation every epoch: sampling='reshuffle') or False (the "
            "same order every epoch: sampling='cyclic'). shuffle='batch' keeps the batches and shuffles their "
            "order (and the rows within each batch), which is none of the schemes the bounds cover: not "
            "reshuffling (the batches never change) and not a fixed order. Found shuffle='batch'."
        )
    allowed = SAMPLINGS_FOR_ORDER[fit.order]
    fixed = fit.order == internals.FIXED
    if declared in allowed or (fixed and declared is Sampling.RESHUFFLE and reshuffle_covers_fixed(relation)):
        return
    if fixed and declared is Sampling.RESHUFFLE:
        only = ", ".join(reshuffle_only_bounds(relation))
        raise AccountingError(
            f"sampling must be cyclic or shuffle_once for {shown}, which keeps the same order every epoch: "
            f"sampling=reshuffle is not accepted for a fixed order because {only} is proven only for a fresh "
            "secret permutation every epoch, whose randomness a fixed order lacks. Declare sampling='cyclic' "
            "(or shuffle the data: fit(shuffle=True)). Found sampling=reshuffle."
        )
    what = "keeps the same order every epoch" if fixed else "draws a new uniform permutation every epoch"
    if fit.shuffle == "batch":
        what += " (for ragged and sparse inputs Keras 2.14 shuffles all the examples whenever shuffle is true)"
    raise AccountingError(
        f"sampling must be {' or '.join(s.value for s in allowed)} for {shown}, which {what}; "
        f"sampling={declared.value} contradicts it. Declare the sampling fit performs, or change fit's shuffle. "
        f"Found sampling={declared.value}."
    )


def reshuffle_covers_fixed(relation: Relation) -> bool:
    """Every bound proven for reshuffling under ``relation`` is also proven for a fixed order."""
    return all(
        spec.covers.get(Sampling.CYCLIC) is relation
        for spec in BOUNDS.values()
        if spec.covers.get(Sampling.RESHUFFLE) is relation
    )


def reshuffle_only_bounds(relation: Relation) -> list[str]:
    """Bounds proven for reshuffling under ``relation`` but not for a fixed order."""
    return [
        spec.id
        for spec in BOUNDS.values()
        if spec.covers.get(Sampling.RESHUFFLE) is relation and spec.covers.get(Sampling.CYCLIC) is not relation
    ]


def check_stopping(callbacks: Sequence[Any]) -> None:
    """Refuse callbacks that choose the released model, the stopping time or the learning rate from the
    training (read on the private data)."""
    for cb in callbacks:
        if isinstance(cb, tf.keras.callbacks.EarlyStopping):
            if cb.restore_best_weights:
                raise AccountingError(
                    "EarlyStopping must not be used with restore_best_weights=True: it replaces the final "
                    f"model by the iterate of the epoch with the best {cb.monitor!r}, an iterate selected by "
                    "comparing intermediate iterates on (private) data. The last-iterate bounds cover the "
                    "final iterate of a fixed number of steps only, not a selected one. Remove EarlyStopping "
                    "and choose the number of epochs before training. Found restore_best_weights=True."
                )
            raise AccountingError(
                "EarlyStopping must not be in fit's callbacks: it stops training at an epoch chosen from "
                f"{cb.monitor!r}, computed on the private data (validation_split included), and a stopping "
                "time chosen from the private data is not covered by the bounds, which assume a number of "
                "steps fixed in advance. Remove EarlyStopping and choose the number of epochs before "
                f"training. Found EarlyStopping(monitor={cb.monitor!r}, restore_best_weights=False)."
            )
        if isinstance(cb, tf.keras.callbacks.ReduceLROnPlateau):
            raise AccountingError(
                "ReduceLROnPlateau must not be in fit's callbacks, whether it fires or not: it lowers the learning "
                f"rate when {cb.monitor!r}, the loss or metric of intermediate models on the private data "
                "(validation_split included), stops improving. On a neighbouring dataset it can fire where it did not "
                "here, so the learning rates of the run depend on the private data, and no bound covers that (they "
                "assume a learning rate fixed in advance). Remove it and choose the learning rate before training. "
                f"Found ReduceLROnPlateau(monitor={cb.monitor!r})."
            )
        if isinstance(cb, tf.keras.callbacks.TerminateOnNaN):
            raise AccountingError(
                "TerminateOnNaN must not be in fit's callbacks: it stops training when the loss on the "
                "private data becomes NaN, a data-dependent stopping time the bounds do not cover (they "
                "assume a number of steps fixed in advance). Remove it. Found TerminateOnNaN."
            )


def check_model(model: Any) -> None:
    """Refuse models whose update is not per-example DP-SGD on their trainable variables."""
    if not model.built or not model.trainable_variables:
        raise AccountingError(
            "the model must be built, with trainable variables, before fit (model.build(input_shape) or call "
            "it once on a batch of public or dummy data): the callback records the variables the step trains. "
            f"Found built={model.built}, {len(model.trainable_variables)} trainable variables."
        )
    constrained = [v.name for v in model.trainable_variables if getattr(v, "constraint", None) is not None]
    if constrained:
        raise AccountingError(
            "trainable variables must have no Keras constraint: a constraint changes the update after "
            "every step (use ProjectionCallback for a projection onto a ball). "
            f"Found constraints on {', '.join(constrained)}."
        )
    mixing = internals.batch_mixing_layers(model)
    if mixing:
        raise AccountingError(
            "the model must have no batch-normalization layer (BatchNormalization, SyncBatchNormalization, "
            "tf.compat.v1.layers.BatchNormalization): in training it normalises each example with statistics "
            "of the whole batch, so one example's gradient depends on the others and clipping no longer bounds "
            "one example's influence, and its moving statistics are computed from the private data without noise "
            f"and released with the model. Use LayerNormalization or GroupNormalization (per example). Found {mixing}."
        )
    overridden = custom_training_code(model)
    if overridden:
        method, where = overridden
        raise AccountingError(
            f"model.{method} must be Keras' own Model.{method}: a custom {method} can feed an example twice while "
            "keeping the loss vector at batch_size values, scale the loss (and with it the smoothness behind the "
            "constants), or change the weights, and the callback cannot verify what it does. Put custom logic in "
            "the model's call or in the loss, or account the run by hand (lastiter_plugins.compute_epsilon) if you "
            f"can prove it is plain DP-SGD on one clipped gradient per example. Found {method} {where}."
        )
    stateful = [
        layer.name
        for layer in model.submodules
        if isinstance(layer, tf.keras.layers.Layer)
        and not isinstance(layer, tf.keras.Model)
        and getattr(layer, "stateful", False)
    ]
    if stateful:
        raise AccountingError(
            "the model must have no stateful layer (an RNN with stateful=True): it carries the state computed from "
            "one batch's examples into the next batches, so one example influences other examples' gradients, and "
            "into the released model, outside the model's weights and without noise. Use stateful=False. "
            f"Found {stateful}."
        )
    weights = internals.compiled_loss_weights(model)
    if weights is not None and any(w != 1 for w in tf.nest.flatten(weights)):
        raise AccountingError(
            "compile's loss_weights must be None or 1: Keras multiplies the per-example loss by them before TF "
            "Privacy differentiates it, which multiplies the smoothness and the gradient norms behind the loss "
            "constants. Fold the weight into the loss (and declare constants for that loss). "
            f"Found loss_weights={weights!r}."
        )


#: Model methods whose Keras implementation the per-step checks rely on.
TRAINING_METHODS = ("train_step", "compute_loss", "make_train_function")


def custom_training_code(model: Any) -> tuple[str, str] | None:
    """(method, where) of the first method of ``TRAINING_METHODS`` the model replaces, or None."""
    for method in TRAINING_METHODS:
        if method in vars(model):
            return method, "replaced on the model instance"
        owner = next(klass for klass in type(model).__mro__ if method in vars(klass))
        if owner is not tf.keras.Model:
            return method, f"overridden by {owner.__name__}"
    return None
