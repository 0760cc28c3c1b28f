r"""Derivation: the pipeline that runs, derived from the observations of :mod:`._observe`, and the
comparison of every step's facts with it.

Before the first step, :func:`pipeline` and :func:`plan` derive from what fit was called with (the DP
optimizer, fit's data handler and callbacks, the model) the planned run, a :class:`Plan` holding the
``TrainingConfig`` the bounds are evaluated for, or refuse (``AccountingError``) what no bound covers.
During training, :func:`steps_problem` compares each step's :class:`._observe.StepFacts` and the host's
:class:`._observe.HostFacts` with the plan; once training ended, :func:`usable_problem` and
:func:`final_problem` check that the model is still the one the counted steps produced.

Only public Keras API here; host internals come through :mod:`._observe`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import lastiter_plugins as lp
from lastiter_plugins import BOUNDS, LossAssumptions, Relation, Sampling, TrainingConfig

from . import _observe as observe
from ._errors import AccountingError
from ._projection import ProjectionCallback

#: The samplings that describe what Keras ``fit`` does with in-memory inputs (``FitSettings.order``, read
#: by ``_observe``): a new uniform permutation every epoch is reshuffling; a fixed order is cyclic, or
#: shuffle_once when the user permuted the data once, at random and in secret, before fit. Fixed batches
#: in a shuffled order (``fit(shuffle="batch")`` on arrays) is none of the covered schemes.
SAMPLINGS_FOR_ORDER: dict[str, tuple[Sampling, ...]] = {
    observe.PERMUTATION: (Sampling.RESHUFFLE,),
    observe.FIXED: (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE),
    observe.BATCH_ORDER: (),
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
    value = observe.finite_positive(raw) if not callable(raw) or isinstance(raw, tf.Variable) else None
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
    observe.check_host()
    f = observe.optimizer_facts(optimizer)
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
    clip, noise = observe.finite_positive(f.clip), observe.finite_positive(f.noise_multiplier)
    if clip is None:
        raise AccountingError(f"l2_norm_clip must be a finite number > 0. Found {f.clip!r}.")
    if noise is None:
        raise AccountingError(f"noise_multiplier must be a finite number > 0. Found {f.noise_multiplier!r}.")
    if f.uses_momentum or observe.value_of(f.momentum) != 0.0:
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
        value = observe.value_of(microbatches)
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
      order: what fit does with the order of the examples across epochs (``_observe.FIXED``,
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
    observe.check_host()
    facts = observe.running_fit(model)
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
    assert facts.order is not None  # in memory: _in_memory read the order
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
    if fit.order == observe.BATCH_ORDER:
        raise AccountingError(
            "fit's shuffle must be True (a new permutation every epoch: sampling='reshuffle') or False (the "
            "same order every epoch: sampling='cyclic'). shuffle='batch' keeps the batches and shuffles their "
            "order (and the rows within each batch), which is none of the schemes the bounds cover: not "
            "reshuffling (the batches never change) and not a fixed order. Found shuffle='batch'."
        )
    allowed = SAMPLINGS_FOR_ORDER[fit.order]
    fixed = fit.order == observe.FIXED
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
    mixing = observe.batch_mixing_layers(model)
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
            "the model's call or in the loss, or account the run by hand (lastiter_plugins.epsilon) if you "
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
    reduced = [
        loss
        for loss in tf.nest.flatten(model.loss)
        if loss is not None
        and not (isinstance(loss, tf.keras.losses.Loss) and loss.reduction == tf.keras.losses.Reduction.NONE)
    ]
    if reduced:
        found = ", ".join(
            f"{type(loss).__name__}(reduction={loss.reduction!r})"
            if isinstance(loss, tf.keras.losses.Loss)
            else repr(loss)
            for loss in reduced
        )
        raise AccountingError(
            "the loss given to compile must be a tf.keras.losses.Loss with reduction=tf.keras.losses.Reduction.NONE: "
            "TF Privacy clips one loss value per example, and a loss string or function is wrapped by Keras with the "
            "default reduction, which reduces the batch to one number. "
            f"Found {found}."
        )
    weights = observe.compiled_loss_weights(model)
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


# ---------------------------------------------------------------- the plan


def pipeline(
    model: Any, *, dataset_size: int, sampling: Sampling, relation: Relation, trained_steps: int | None
) -> tuple[DPOptimizerSettings, FitSettings]:
    """What the DP optimizer and fit will do, checked against the declaration (before the first step).

    Args:
      trained_steps: the steps an earlier accounted fit took on this model (None: none).
    """
    settings = read_dp_optimizer(model.optimizer)
    fit = read_fit(model)
    if fit.dataset_size != dataset_size:
        raise AccountingError(
            f"dataset_size must equal the number of examples fit trains on = {fit.dataset_size} "
            f"(after validation_split). Found dataset_size={dataset_size}."
        )
    check_sampling(sampling, fit, relation)
    check_microbatches(settings, fit.batch_size)
    iterations = int(model.optimizer.iterations.numpy())
    if iterations != 0:
        raise AccountingError(
            "the optimizer must be fresh (iterations = 0): its earlier steps would not be accounted. "
            f"Found iterations={iterations}; compile the model with a new optimizer."
        )
    if trained_steps is not None:
        raise AccountingError(
            f"the model must not have been trained before: a LastIterateCallback already accounted "
            f"{trained_steps} steps on it, and this run would start from their result, which its epsilon "
            "does not cover. Train in one fit call, or compose the runs' RDP (the dp-accounting adapter "
            "does). Found a model trained by an earlier accounted fit."
        )
    check_model(model)
    return settings, fit


@dataclasses.dataclass(frozen=True)
class Plan:
    """The run as planned before the first step, which every step's facts are compared with."""

    optimizer: DPOptimizerSettings
    fit: FitSettings
    config: TrainingConfig  # the planned steps
    assumptions: LossAssumptions
    projection: ProjectionCallback | None
    accounted: Any  # the optimizer object whose steps are counted
    trainable_ids: tuple[int, ...]
    weight_ids: tuple[int, ...]
    moved_tolerance: float  # float32 rounding of the projection; 0 without one

    @property
    def ball(self) -> observe.Ball | None:
        if self.projection is None:
            return None
        return observe.Ball(self.projection.center, self.projection.radius, ProjectionCallback.MARGIN)


_TOLERANCE = 1e-5  # float32 rounding of the projection, relative to the ball's size


def plan(
    model: Any,
    settings: DPOptimizerSettings,
    fit: FitSettings,
    *,
    sampling: Sampling,
    relation: Relation,
    assumptions: LossAssumptions,
    bound: str,
    delta: float,
    orders: Any,
    published_only: bool = False,
) -> Plan:
    """The planned run, once the assumptions are known; refuses when ``bound`` does not apply to it (with a
    published proof, if ``published_only``)."""
    projection = check_projection(fit.callbacks, assumptions.diameter)
    check_stopping(fit.callbacks)
    config = TrainingConfig(
        dataset_size=fit.dataset_size,
        batch_size=fit.batch_size,
        noise_multiplier=settings.noise_multiplier,
        steps=fit.epochs * fit.steps_per_epoch,
        sampling=sampling,
        learning_rate=settings.learning_rate,
        clip_norm=settings.l2_norm_clip,
        relation=relation,
    )
    lp.epsilon(
        bound, delta, orders, published_only=published_only, config=config, assumptions=assumptions
    )  # refuses now
    tolerance = 0.0
    if projection is not None:
        projection._set_center()
        tolerance = _TOLERANCE * (projection.radius + _center_norm(projection))
    return Plan(
        optimizer=settings,
        fit=fit,
        config=config,
        assumptions=assumptions,
        projection=projection,
        accounted=model.optimizer,
        trainable_ids=tuple(id(v) for v in model.trainable_variables),
        weight_ids=tuple(id(v) for v in model.weights),
        moved_tolerance=tolerance,
    )


def _center_norm(projection: ProjectionCallback) -> float:
    return math.sqrt(sum(float(tf.reduce_sum(tf.square(tf.cast(c, tf.float64)))) for c in projection.center))


def check_projection(callbacks: Sequence[Any], declared: float | None) -> ProjectionCallback | None:
    projections = [cb for cb in callbacks if isinstance(cb, ProjectionCallback)]
    if declared is None:
        if projections:
            raise AccountingError(
                "diameter must be declared when a ProjectionCallback is used (the bounds must know "
                f"the update projects). Found a ProjectionCallback of diameter {projections[0].diameter:g} "
                "and diameter=None."
            )
        return None
    if len(projections) != 1:
        raise AccountingError(
            f"diameter={declared:g} needs exactly one ProjectionCallback in the same fit call (the "
            "bounded-domain bounds assume every iterate is projected onto one convex set; two "
            f"projections in a row do not project onto their intersection). Found {len(projections)}."
        )
    if projections[0].diameter > declared:
        raise AccountingError(
            f"diameter must be >= the ProjectionCallback's diameter = {projections[0].diameter:g}. "
            f"Found diameter={declared:g}."
        )
    return projections[0]


# ---------------------------------------------------------------- every step against the plan

VOID = "; the epsilon of this run is void."


def steps_problem(
    plan: Plan,
    record: observe.StepRecord,
    checked: int,
    host: observe.HostFacts,
    more: Callable[[int], str | None] | None = None,
) -> tuple[int, str | None]:
    """(steps found correct, counted on from ``checked``; the first problem or None) for the steps recorded
    since the last check and the host's facts. ``more(k)`` adds a route's own check of step k (the GLM's)."""
    if record.lost(checked):
        return checked, (
            f"the callback must check every step: {record.steps - checked} steps ran since its last check, "
            f"more than the {record.capacity} (one epoch) it records between two checks (train_on_batch or "
            "another training call inside fit?)" + VOID
        )
    for k in range(checked + 1, record.steps + 1):
        problem = step_problem(plan, k, observe.StepFacts.of(record.row(k)))
        if problem is None and more is not None:
            problem = more(k)
        if problem is not None:
            return checked, problem
        checked = k
    return checked, host_problem(plan, host, checked)


def step_problem(plan: Plan, k: int, step: observe.StepFacts) -> str | None:
    """What step ``k`` used that the plan does not allow; the facts of docs/tf_privacy.md."""
    s = plan.optimizer
    started = k - 1  # the optimizer starts fresh (pipeline)
    if step.step != k or step.dp_calls != 1 or step.iterations != started:
        return (
            f"every optimizer step must be one DP-SGD step of the compiled train_step, observed by this "
            f"callback: step {k} ran {step.dp_calls:g} DP gradient computation(s) and started at "
            f"optimizer.iterations={step.iterations:g} (expected 1 and {started}: a train_step that "
            "does not call the DP optimizer once, a second optimizer, or optimizer steps between the "
            "steps)" + VOID
        )
    b = plan.config.batch_size
    if step.rows != b:
        return (
            f"every batch must have batch_size = {b} examples, as planned: step {k} had {step.rows}. Change "
            "nothing in the data between steps" + VOID
        )
    if step.loss_length != b:
        return (
            f"the loss must return one value per example: step {k} passed a loss vector of {step.loss_length} "
            f"entries for a batch of {b} examples to TF Privacy, which clips one gradient per entry "
            f"(num_microbatches=None) and divides by {step.loss_length}. An example contributing several entries "
            "(augmented views concatenated, pairs, a loss over tokens) contributes several clipped "
            "gradients, which multiplies the sensitivity the bounds assume. Average each example's terms "
            "inside the loss so that it returns a vector of batch_size values" + VOID
        )
    if step.weight_off_one > 0:
        return (
            f"every example's loss weight must be 1: step {k} fed fit's sample_weight / class_weight with an "
            f"entry {step.weight_off_one:g} away from 1, which rescales that example's loss" + VOID
        )
    planned_std = s.noise_multiplier * s.l2_norm_clip
    if not (_close(step.clip, s.l2_norm_clip) and _close(step.noise_std, planned_std)):
        z = step.noise_std / step.clip if step.clip else math.inf
        return (
            f"the clip norm and the noise must stay as planned: step {k} clipped at {step.clip:g} with noise std "
            f"{step.noise_std:g} on the clipped sum (noise multiplier {z:g}), planned "
            f"C = {s.l2_norm_clip:g}, std = {planned_std:g} (z = {s.noise_multiplier:g}). Something changed "
            "the optimizer's l2_norm_clip or noise_multiplier (a tf.Variable assigned during fit); keep "
            "them fixed, or account the run with the smallest noise multiplier and the largest clip norm "
            "it used" + VOID
        )
    if not _same_rate(step.learning_rate, s.learning_rate):
        return (
            f"learning_rate must stay constant during training (a schedule or callback changed it): step {k} "
            f"used {step.learning_rate!r} after starting with {s.learning_rate!r}" + VOID
        )
    if step.tampered:
        return (
            f"within step {k}, something other than the DP optimizer's update changed the model's weights "
            "(a second, non-private optimizer, a layer updating a non-trainable weight from the batch, e.g. "
            "a running statistic or a counter of the data, or an assign in the step). Every weight change "
            "must be the DP-SGD update; statistics of the private data kept in the model are released with "
            "it without noise" + VOID
        )
    if step.others_moved:
        return (
            f"step {k} must start where step {k - 1} ended: the non-trainable weights changed between the two "
            "steps (a callback or other code wrote them). Weights that are not trained must stay as they "
            "were at the start of fit" + VOID
        )
    if step.moved > plan.moved_tolerance:
        projected = " (projected onto the ball)" if plan.projection else ""
        return (
            f"step {k} must start where step {k - 1} ended{projected}: "
            f"the weights moved by {step.moved:.3g} between the two steps (a callback or other code "
            "changed them). Only ProjectionCallback may move the weights between steps" + VOID
        )
    if plan.projection is not None:
        assert plan.assumptions.diameter is not None  # check_projection refused a projection without it
        radius = plan.assumptions.diameter / 2
        if step.start_distance > radius:
            return (
                f"every step must start inside the projection ball of radius {radius:g} (diameter "
                f"{plan.assumptions.diameter:g}): step {k} started at distance {step.start_distance:g} "
                "from its center (code after ProjectionCallback moved the weights out). Put nothing that "
                "changes the weights after ProjectionCallback" + VOID
            )
    return None


def host_problem(plan: Plan, host: observe.HostFacts, checked: int) -> str | None:
    """Facts of the run kept on the host: the optimizer object, the learning rate it will read, the model's
    variables, and what the DP optimizer differentiated in every trace of the step."""
    if host.optimizer is not plan.accounted:
        return "model.optimizer must stay the optimizer fit started with: it was replaced during fit" + VOID
    expected = plan.optimizer.learning_rate
    try:
        current = learning_rate(host.learning_rate)
    except AccountingError as error:
        return f"the learning rate changed during training: {error}" + VOID
    if not _same_rate(current, expected):
        return (
            f"learning_rate must stay constant during training (a schedule or callback changed it). "
            f"Found {current!r} after starting with {expected!r}" + VOID
        )
    planned = tuple(sorted(plan.trainable_ids))
    if host.trainable_ids != plan.trainable_ids or any(ids != planned for ids in host.traced_ids):
        differentiated = " or ".join(sorted({str(len(ids)) for ids in host.traced_ids})) or "none"
        return (
            "the DP optimizer must train exactly the model's trainable variables, fixed for the whole run: "
            f"by the end of step {checked} model.trainable_variables has {len(host.trainable_ids)} variable(s) (at "
            f"the start {len(plan.trainable_ids)}) and the DP optimizer differentiated {differentiated}. A "
            "layer's trainable flag changed during fit, or another optimizer trains some variables; train all "
            "parameters with the one DP optimizer" + VOID
        )
    if host.weight_ids != plan.weight_ids:
        return (
            f"the model's weights must be the ones fit started with: after step {checked} model.weights "
            f"lists {len(host.weight_ids)} variable(s), at the start {len(plan.weight_ids)} (a layer created "
            "or replaced during fit); build the whole model before fit" + VOID
        )
    return None


def epoch_problem(plan: Plan, steps: int, stopped: bool) -> str | None:
    per_epoch = plan.fit.steps_per_epoch
    if stopped and steps < plan.config.steps:
        return end_problem(plan, steps, stopped)
    if steps % per_epoch:
        return (
            f"every epoch must be one pass over the data in {per_epoch} steps of "
            f"{plan.fit.batch_size} examples: an epoch ended after {steps} steps in total" + VOID
        )
    return None


def end_problem(plan: Plan, steps: int, stopped: bool) -> str | None:
    """What the end of fit shows: training stopped by a callback, or fewer steps than planned."""
    if stopped:
        return (
            "model.stop_training must stay False: a callback set it and stopped "
            f"training after {steps} of the {plan.config.steps} planned steps. A stopping time "
            "chosen during training from the private data is not covered by the bounds, which assume a "
            "number of steps fixed in advance; the epsilon of this run is void. Choose the number of "
            "epochs before training. Found model.stop_training=True."
        )
    if steps != plan.config.steps:
        return f"fit ran {steps} steps, planned {plan.config.steps}" + VOID
    return None


# ---------------------------------------------------------------- the model, when the epsilon is read


def usable_problem(plan: Plan, optimizer: Any, steps: int) -> str | None:
    """Whether ``model.optimizer`` (``optimizer``) took exactly the counted steps."""
    if optimizer is not plan.accounted:
        return (
            "model.optimizer must be the optimizer whose steps this callback counted: the model was "
            "compiled again, so steps taken with the new optimizer are not accounted. Found "
            f"{type(optimizer).__name__} object {id(optimizer):#x}, not the accounted one "
            f"{id(plan.accounted):#x}; account the whole training in one fit call with this callback."
        )
    expected = steps  # the optimizer started fresh (pipeline)
    iterations = int(optimizer.iterations.numpy())
    if iterations > expected:
        return (
            f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
            f"model took {iterations - expected} optimizer step(s) it did not see (a later fit or "
            "train_on_batch without this callback, or a custom training loop), so the epsilon would describe "
            f"fewer steps than the model took. Found iterations={iterations}; account the whole training in "
            "one fit call with this callback."
        )
    if iterations < expected:
        return (
            f"model.optimizer.iterations must equal the {expected} steps this callback counted: the "
            f"step count was set back (a restored optimizer state?). Found iterations={iterations}."
        )
    return None


def final_problem(plan: Plan, departure: tuple[float, bool] | None) -> str | None:
    """The model must lie in the ball and, once training ended (``departure`` given: the trainable weights'
    distance from the last step's end, projected, and whether a non-trainable one changed), still hold the
    weights of the last counted step."""
    if plan.projection is not None:
        assert plan.assumptions.diameter is not None  # check_projection refused a projection without it
        radius = plan.assumptions.diameter / 2
        distance = plan.projection.distance_from_center()
        if distance > radius:
            return (
                f"the final model must lie in the projection ball of radius {radius:g}: it is at distance "
                f"{distance:g} from the center (the weights were changed after the last projection)" + VOID
            )
    if departure is None:
        return None
    moved, others = departure
    far = moved > plan.moved_tolerance
    if far or others:
        return (
            "the model's weights must be those of the last counted step: "
            + (f"the trainable weights moved by {moved:.3g}" if far else "")
            + (" and " if others and far else "")
            + ("a non-trainable weight changed" if others else "")
            + " after fit's last step (an assign, another training run, or a callback's on_train_end). "
            "The epsilon describes the model the counted steps produced, not a model changed afterwards" + VOID
        )
    return None


def _same_rate(found: float, planned: float) -> bool:
    """The learning-rate variable holds float32(eta)."""
    return found in (planned, float(np.float32(planned)))


def _close(found: float, planned: float) -> bool:
    return abs(found - planned) <= 1e-6 * abs(planned)
