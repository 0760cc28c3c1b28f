r"""What a Keras ``fit`` call of a jax_privacy model does, read before its first step: the data and how ``fit``
draws from it (:func:`plan`), the optimizer (:func:`read_optimizer`, :func:`optimizer_departures`) and the rules
that read a metric (:func:`metric_rules`). Each finding either holds, weakens the pipeline (a
``Departure``: the rows it breaks leave ``best``) or refuses the run (``NotApplicableError``, before any step).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.host import Departure

Sampling = lp.Sampling
_ANY = {"update": "any"}


@dataclasses.dataclass(frozen=True)
class FitCall:
    """The arguments of one ``fit`` call, bound to Keras' signature (defaults applied)."""

    arguments: dict[str, Any]

    @classmethod
    def bind(cls, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> FitCall:
        bound = inspect.signature(type(model).fit).bind(model, *args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        arguments.pop("self", None)
        arguments.update(arguments.pop("kwargs", {}) or {})
        return cls(arguments)

    def __getitem__(self, name: str) -> Any:
        return self.arguments.get(name)


@dataclasses.dataclass(frozen=True)
class FitPlan:
    """How ``fit`` draws its batches, as planned from its arguments (the recorded indices are checked against it).

    Attributes:
      sampling: the scheme of the physical batches.
      dataset_size: n, the examples ``fit`` draws from (after a ``validation_split``).
      batch_size: b, the physical batch (the step's divisor).
      batches_per_pass: batches in one pass over the data (Poisson: one epoch of jax_privacy's dataset).
      planned_steps: the physical steps ``fit`` is asked to run.
      how: what draws the batches, in words.
    """

    sampling: Sampling
    dataset_size: int
    batch_size: int
    batches_per_pass: int
    planned_steps: int
    how: str


def _leaves(tree: Any) -> list[Any]:
    if tree is None:
        return []
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in _leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in _leaves(value)]
    return [tree]


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "__array__") and len(value.shape) >= 1


_OTHER_INPUTS = (
    "the Keras route accounts fit on in-memory arrays (Keras draws their batches, recorded by index) or with "
    "DPKerasConfig(poisson_sampling_in_fit=True) (jax_privacy draws them). A dataset, generator, PyDataset or "
    "loader shows no indices to check. Pass arrays, or use the JAX API with a batch selection strategy "
    "(docs/jax_privacy.md)"
)


def plan(call: FitCall, dp: Any) -> FitPlan:
    """The batches ``fit`` will draw (raises NotApplicableError for inputs whose batches cannot be observed)."""
    x = call["x"]
    leaves = _leaves(x) + _leaves(call["y"])
    if not leaves or not all(_is_array(leaf) for leaf in leaves):
        raise lp.NotApplicableError(f"x must be arrays. Found {type(x).__name__}: {_OTHER_INPUTS}.")
    rows = int(leaves[0].shape[0])
    b = int(call["batch_size"] or dp.batch_size)
    epochs = int(call["epochs"] or 1) - int(call["initial_epoch"] or 0)
    per_epoch = call["steps_per_epoch"]
    if dp.poisson_sampling_in_fit:
        batches = int(per_epoch) if per_epoch else max(1, math.floor(rows / b))
        how = f"jax_privacy's Poisson dataset: each example joins each step with probability {b}/{rows}"
        return FitPlan(Sampling.POISSON, rows, b, batches, batches * epochs, how)
    split = float(call["validation_split"] or 0.0)
    n = math.floor(rows * (1.0 - split)) if split else rows
    shuffle = call["shuffle"]
    if shuffle == "batch":
        sampling, how = Sampling.CYCLIC, "Keras' fixed batches (shuffle='batch' permutes inside each batch only)"
    elif shuffle:
        sampling, how = Sampling.RESHUFFLE, "Keras' shuffle: a new permutation of the arrays every pass"
    else:
        sampling, how = Sampling.CYCLIC, "Keras' fixed order (shuffle=False)"
    batches = -(-n // b)
    steps = int(per_epoch) * epochs if per_epoch else batches * epochs
    return FitPlan(sampling, n, b, batches, steps, how)


# -- the optimizer


@dataclasses.dataclass(frozen=True)
class OptimizerFacts:
    """The Keras optimizer as read before a fit call.

    Attributes:
      name: its class.
      learning_rate: the constant rate (None: a schedule).
      accumulation: k, physical batches per update (``gradient_accumulation_steps``, None read as 1).
      not_plain_sgd: what makes its update other than plain SGD at a constant rate (empty: plain SGD).
    """

    name: str
    learning_rate: float | None
    accumulation: int
    not_plain_sgd: tuple[str, ...]


def current_learning_rate(optimizer: Any) -> float | None:
    """The optimizer's constant learning rate as it is now (None for a schedule)."""
    value = optimizer.get_config().get("learning_rate")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_optimizer(optimizer: Any) -> OptimizerFacts:
    import keras

    config = optimizer.get_config()
    rate = current_learning_rate(optimizer)
    found: list[str] = []
    if type(optimizer) is not keras.optimizers.SGD:
        found.append(f"the optimizer is {type(optimizer).__name__}, not keras.optimizers.SGD")
    else:
        if config.get("momentum"):
            found.append(f"SGD(momentum={config['momentum']})")
        if config.get("nesterov"):
            found.append("SGD(nesterov=True)")
    if rate is None:
        found.append("the learning rate follows a schedule")
    for key in ("weight_decay", "clipnorm", "global_clipnorm", "clipvalue", "loss_scale_factor"):
        if config.get(key):
            found.append(f"{key}={config[key]!r}")
    if config.get("use_ema"):
        found.append("use_ema=True (the weights are replaced by their moving average)")
    return OptimizerFacts(
        name=type(optimizer).__name__,
        learning_rate=rate,
        accumulation=int(config.get("gradient_accumulation_steps") or 1),
        not_plain_sgd=tuple(found),
    )


def optimizer_departures(facts: OptimizerFacts, step: int) -> list[Departure]:
    """The departure of an update other than plain SGD at a constant rate (the every-iterate rows stay)."""
    if not facts.not_plain_sgd:
        return []
    return [Departure(step=step, fact="; ".join(facts.not_plain_sgd), changes=_ANY)]


# -- rules reading a metric

_DECLARE = "declare metric_source='public' if it reads only data outside the private set (validation_data)"


def metric_rules(call: FitCall, metric_source: str | None, step: int) -> tuple[list[Departure], bool]:
    """Callbacks that read a metric and change the run (``EarlyStopping``, ``ReduceLROnPlateau``,
    ``TerminateOnNaN``): refused unless declared public (then the every-iterate rows only, and a stopping rule
    makes the epsilon cover every planned step, returned True)."""
    import keras

    rules = (keras.callbacks.EarlyStopping, keras.callbacks.ReduceLROnPlateau, keras.callbacks.TerminateOnNaN)
    found, stops = [], False
    for callback in call["callbacks"] or ():
        if not isinstance(callback, rules):
            continue
        monitor = getattr(callback, "monitor", "loss")
        private = not str(monitor).startswith("val_") or bool(call["validation_split"])
        if private or metric_source != "public":
            where = "the training data" if private else "data the adapter cannot see"
            raise lp.NotApplicableError(
                f"a rule reading a metric must read public data: its decisions depend on the data beyond the noisy "
                f"steps. Found {type(callback).__name__}(monitor={monitor!r}) reading {where}"
                + ("" if private else f"; {_DECLARE}")
                + "."
            )
        found.append(f"{type(callback).__name__}(monitor={monitor!r})")
        stops = stops or not isinstance(callback, keras.callbacks.ReduceLROnPlateau)
    if not found:
        return [], False
    fact = f"{', '.join(found)} reads a public metric of intermediate models (metric_source='public')"
    return [Departure(step=step, fact=fact, changes=_ANY)], stops


def labels_and_features(call: FitCall) -> tuple[Any, Any]:
    """x and y of the training part (before a validation split Keras takes from the end)."""
    x, y = call["x"], call["y"]
    split = float(call["validation_split"] or 0.0)
    if not split:
        return x, y
    rows = int(np.asarray(_leaves(x)[0]).shape[0])
    keep = math.floor(rows * (1.0 - split))
    return np.asarray(x)[:keep], (None if y is None else np.asarray(y)[:keep])
