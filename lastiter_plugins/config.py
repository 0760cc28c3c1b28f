r"""The two objects every accountant passes around, validated on construction.

:class:`TrainingConfig` describes the DP-SGD run (what the data pipeline and the
optimizer actually do); :class:`LossAssumptions` the properties of the losses
and of the parameter domain that the user declares. docs/bounds.md maps
these names to the papers' symbols.

The update every bound assumes (plain SGD, constant step, optional projection
:math:`\Pi` onto a closed convex set of diameter D)::

    x_{t+1} = Pi( x_t - eta * ( (1/b) * sum_{i in B_t} clip_C(grad f_i(x_t)) + N(0, (z C / b)^2 I) ) )

Every batch, including a short last one, is normalised by the same b (Opacus'
``expected_batch_size``); a pass over the data takes ``ceil(n / b)`` steps
(``ceil(n k / b)`` under random allocation, each example in k of them).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import numbers
import os
import sys
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast


def _check_flag(name: str, value: Any) -> bool:
    """A flag is True or False; numpy's bool (np.bool_(True), what an array comparison gives) is
    accepted as the bool it is. Anything else (1, "yes", None) is refused."""
    import numpy as np  # here, not at the top: the command line's parser imports this module (lastiter --help)

    if isinstance(value, np.bool_):
        value = bool(value)
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False. Found {value!r} ({type(value).__name__}).")
    return value


class ValueEnum(str, enum.Enum):
    """A string enum that prints as its value: ``str()``, ``format()`` and f-strings give
    ``"cyclic"``, not ``"Sampling.CYCLIC"`` (what ``enum.StrEnum`` does on Python >= 3.11)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, format_spec: str) -> str:
        return format(self.value, format_spec)


class Sampling(ValueEnum):
    """What the data pipeline really does."""

    CYCLIC = "cyclic"  # fixed order, the same batches every epoch
    SHUFFLE_ONCE = "shuffle_once"  # one random permutation, then cyclic over it
    RESHUFFLE = "reshuffle"  # a new random permutation every epoch
    RANDOM_BATCH = "random_batch"  # a uniformly random b-subset every step
    POISSON = "poisson"  # each example joins each step with probability b/n
    RANDOM_ALLOCATION = "random_allocation"  # each example in k of each epoch's steps, drawn afresh every epoch

    @classmethod
    def parse(cls, value: Any) -> Sampling:
        return _parse_enum(cls, value, "sampling")


class Update(ValueEnum):
    """What the optimizer does with each step's noisy clipped gradient sum.

    The last-iterate bounds analyse one map, plain SGD with a constant step size (``SGD``); the
    every-iterate bounds (composition) cover any use of the noisy sums, since everything the optimizer
    computes from them is post-processing (``ANY``).
    """

    SGD = "sgd"  # x <- Pi(x - lr * (noisy clipped sum) / b), lr constant (weight decay outside the clip as declared)
    ANY = "any"  # anything computed from the noisy sums: Adam, momentum, schedules fixed in advance, ...

    @classmethod
    def parse(cls, value: Any) -> Update:
        return _parse_enum(cls, value, "update")


class Relation(ValueEnum):
    """Neighbouring relation of the guarantee."""

    REPLACE_ONE = "replace_one"
    ADD_OR_REMOVE_ONE = "add_or_remove_one"

    @classmethod
    def parse(cls, value: Any) -> Relation:
        return _parse_enum(cls, value, "relation")


#: The neighbouring relation a pipeline is accounted under when none is given, by sampling scheme: the
#: one rule of every route (the API, the command line, compare, advice, calibration and the adapters).
#: Add-or-remove where the scheme has bounds for it, the relation of Opacus' and dp-accounting's own
#: accountants (a record present or absent); replace-one where only it is defined (fixed-size batches: a
#: dataset one record larger has another batch structure). A new scheme joins with one line.
DEFAULT_RELATION: Mapping[Sampling, Relation] = MappingProxyType(
    {
        Sampling.CYCLIC: Relation.REPLACE_ONE,
        Sampling.SHUFFLE_ONCE: Relation.REPLACE_ONE,
        Sampling.RESHUFFLE: Relation.REPLACE_ONE,
        Sampling.RANDOM_BATCH: Relation.REPLACE_ONE,
        Sampling.POISSON: Relation.ADD_OR_REMOVE_ONE,
        Sampling.RANDOM_ALLOCATION: Relation.ADD_OR_REMOVE_ONE,
    }
)

#: The schemes whose default changed in 0.3.0 (0.2.0 accounted every scheme under replace_one): leaving
#: the relation out with one of them warns (FutureWarning) until 0.4.0. A scheme added later is not here.
_CHANGED_IN_0_3 = frozenset({Sampling.POISSON})


def default_relation(sampling: Sampling | str) -> Relation:
    """The relation a pipeline of ``sampling`` is accounted under when none is given
    (:data:`DEFAULT_RELATION`)."""
    return DEFAULT_RELATION[Sampling.parse(sampling)]


def resolve_relation(relation: Any, sampling: Sampling | str, *, name: str = "relation") -> Relation:
    """``relation`` parsed, or, when it is None (left out), the scheme's default (:func:`default_relation`).

    Left out where the default changed in 0.3.0 (Poisson: add-or-remove, was replace-one), it warns with a
    ``FutureWarning`` that names ``name`` (the parameter as the caller's route spells it: ``relation``,
    ``neighboring_relation``, ``--relation``) and what to pass to keep the old number; the warning goes in
    0.4.0. The warning is attributed to the first caller outside this package (the user's line).
    """
    if relation is not None:
        return Relation.parse(relation)
    sampling = Sampling.parse(sampling)
    chosen = DEFAULT_RELATION[sampling]
    if sampling in _CHANGED_IN_0_3:
        before = Relation.REPLACE_ONE
        warn_at_caller(
            f"{name} left out with sampling={sampling.value!r}: accounted under {chosen.value}, the relation of "
            f"Opacus' and dp-accounting's accountants, since lastiter-plugins 0.3.0 (0.2.0 used {before.value}, "
            f"which gives a larger epsilon for a stronger guarantee). Pass {_spelled(name, before)} to keep the "
            f"0.2.0 number, or {_spelled(name, chosen)} to silence this warning, which goes in 0.4.0.",
            FutureWarning,
        )
    return chosen


def _spelled(name: str, relation: Relation) -> str:
    """``relation='replace_one'`` in Python, ``--relation replace_one`` on the command line."""
    return f"{name} {relation.value}" if name.startswith("--") else f"{name}={relation.value!r}"


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside this package (and outside the code that
    ``dataclasses`` generates): the user's line, whichever route led here, so Python's filter shows it
    once per line of the user's code."""
    frame = sys._getframe(1)
    level = 2  # warnings.warn(stacklevel=2) names warn_at_caller's caller
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(_PACKAGE) or frame.f_code.co_filename == "<string>"
    ):
        frame, level = frame.f_back, level + 1
    del frame
    warnings.warn(message, category, stacklevel=level)


def _parse_enum(cls, value, name):
    if isinstance(value, cls):
        return value
    if isinstance(value, enum.Enum):  # e.g. dp_accounting.NeighboringRelation
        value = value.name
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        for member in cls:
            if member.value == key:
                return member
    choices = ", ".join(m.value for m in cls)
    raise ValueError(f"{name} must be one of {choices}. Found {value!r}.")


#: The largest count (examples, batch size, steps, epochs) accepted: 2**53, the largest integer
#: up to which every integer is exact in double precision, in which the bounds are computed.
MAX_COUNT = 2**53


def shown(value: Any) -> str:
    """``repr`` of a user's value for a message, with a huge integer abbreviated (one line, readable:
    ``1.000e+400 (an integer)``)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10**20:
        digits = str(abs(int(value)))
        return f"{'-' if value < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1} (an integer)"
    return repr(value)


def check_count(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, checked to be an integer in [``minimum``, 2**53] (:data:`MAX_COUNT`); the message
    names ``name``, the range and the value."""
    return _check_int(name, value, minimum)


_shown = shown  # the spelling of the checks of this module


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be an integer >= {minimum}. Found {_shown(value)}.")
    if isinstance(value, numbers.Integral):
        value = int(value)
    elif not math.isfinite(value) or math.trunc(value) != value:
        raise ValueError(f"{name} must be an integer >= {minimum}. Found {_shown(value)}.")
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}. Found {_shown(value)}.")
    if value > MAX_COUNT:
        raise ValueError(
            f"{name} must be an integer <= 2**53 = {MAX_COUNT} (the supported range is [{minimum}, 2**53]). "
            f"Found {_shown(value)}."
        )
    return int(value)


def _check_real(name: str, value: Any, *, positive: bool) -> float:
    constraint = "> 0" if positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number {constraint}. Found {_shown(value)}.")
    try:
        value = float(value)
    except OverflowError:  # an integer beyond the largest double
        raise ValueError(f"{name} must be a finite number {constraint}. Found {_shown(value)}.") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be a finite number {constraint}. Found {value!r}.")
    return value + 0.0  # -0.0 is 0


#: ``TrainingConfig(relation=...)`` left out: None, replaced on construction by the sampling scheme's default
#: (typed as a Relation: every constructed TrainingConfig holds one).
_BY_SAMPLING = cast(Relation, None)


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    r"""A DP-SGD run.

    Attributes:
      dataset_size: n, number of examples.
      batch_size: b, the (expected) batch size the noisy gradient sum is divided by.
      noise_multiplier: z; the noise on the sum of clipped gradients has std z*C.
      steps: T, total optimizer steps.
      sampling: how batches are formed (:class:`Sampling`).
      learning_rate: eta, the constant plain-SGD step size (None when unknown;
        only the bounds that need it then refuse).
      clip_norm: C, per-example clipping norm.
      relation: the neighbouring relation asked for (used by ``best`` and
        ``composition``; a single bound refuses a relation it is not proven for).
        Left out: the sampling scheme's default (:data:`DEFAULT_RELATION`: add_or_remove_one for
        Poisson and random allocation, replace_one for the other schemes), resolved on construction; with
        Poisson sampling that warns (``FutureWarning``) until 0.4.0, since 0.2.0 used replace_one.
      update: what the optimizer does with the noisy clipped sums (:class:`Update`): ``sgd`` (default),
        plain SGD with the constant ``learning_rate``, the map the last-iterate bounds analyse; ``any``
        (Adam, momentum, a learning-rate schedule fixed in advance, ...): only the every-iterate rows hold.
      allocations_per_epoch: k, with ``sampling="random_allocation"``: every epoch each example
        joins k of the epoch's ``t = ceil(n k / b)`` steps, chosen uniformly at random afresh
        every epoch (k = 1: balls in bins); b is then the divisor, at least the expected batch
        size ``n k / t``. Must be 1 for every other scheme (docs/sampling.md).
      order_secret: True (default): the randomness that draws the batches (the permutation of shuffle_once
        and reshuffle, the memberships of random_batch, Poisson and random allocation) is unknown to the
        adversary, as every amplification argument assumes. False: it is public (a data loader's generator
        in torch's fixed fresh state, a seed known to others, a generator re-seeded with known values): the
        batches are a known fixed sequence, and only the rows proven for every fixed batch sequence hold
        (docs/derivations/public-order.md#public-order). Cyclic batches are public anyway.
      max_batch_size: L, with ``sampling="random_allocation"`` only: a step whose batch has more than L examples
        uses only L of them (a host that pads every batch to L rows, so that its divisor is fixed: the
        Keras adapter's ``RandomAllocationDataset``). Every row's delta then carries the probability that some
        step's batch exceeds L (``lastiter_plugins.overflow``; docs/derivations/fixed-length-batches.md), and
        the run has (epsilon, delta) guarantees only, no Renyi curve. ``batch_size`` stays b (the divisor of
        the core's update, which fixes t); a host that divides by its L rows with step size eta runs the core's
        update with ``learning_rate = eta * b / L``: give that (a larger one overstates the last-iterate rows'
        contraction; fixed-length-batches.md, part 5). None (default): batches are never cut.
    """

    dataset_size: int
    batch_size: int
    noise_multiplier: float
    steps: int
    sampling: Sampling
    learning_rate: float | None = None
    clip_norm: float = 1.0
    relation: Relation = _BY_SAMPLING  # left out: the scheme's default, set in __post_init__
    update: Update = Update.SGD
    allocations_per_epoch: int = 1
    order_secret: bool = True
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "dataset_size", _check_int("dataset_size", self.dataset_size, 1))
        set_(self, "batch_size", _check_int("batch_size", self.batch_size, 1))
        if self.batch_size > self.dataset_size:
            raise ValueError(f"batch_size must be <= dataset_size = {self.dataset_size}. Found {self.batch_size}.")
        set_(self, "noise_multiplier", _check_real("noise_multiplier", self.noise_multiplier, positive=True))
        set_(self, "steps", _check_int("steps", self.steps, 1))
        set_(self, "sampling", Sampling.parse(self.sampling))
        if self.learning_rate is not None:
            set_(self, "learning_rate", _check_real("learning_rate", self.learning_rate, positive=True))
        set_(self, "clip_norm", _check_real("clip_norm", self.clip_norm, positive=True))
        set_(self, "relation", resolve_relation(self.relation, self.sampling))
        set_(self, "update", Update.parse(self.update))
        set_(self, "allocations_per_epoch", _check_allocations(self.allocations_per_epoch, self.sampling))
        set_(self, "order_secret", _check_flag("order_secret", self.order_secret))
        if self.max_batch_size is not None:
            set_(self, "max_batch_size", _check_max_batch_size(self.max_batch_size, self.sampling))
        if self.steps_per_epoch > MAX_COUNT:
            raise ValueError(
                f"allocations_per_epoch must be <= 2**53 * batch_size / dataset_size (an epoch of ceil(n k / b) "
                f"steps may have at most 2**53 steps). Found {_shown(self.allocations_per_epoch)}."
            )

    @classmethod
    def from_epochs(cls, *, epochs: int, dataset_size: int, batch_size: int, **kwargs: Any) -> TrainingConfig:
        """Build from a number of passes: E epochs are E * ceil(n / b) steps (E * ceil(n k / b) under random
        allocation with k = ``allocations_per_epoch``)."""
        epochs = _check_int("epochs", epochs, 1)
        n = _check_int("dataset_size", dataset_size, 1)
        b = _check_int("batch_size", batch_size, 1)
        k = _check_int("allocations_per_epoch", kwargs.get("allocations_per_epoch", 1), 1)
        per_epoch = -(-n * k // b)
        if epochs * per_epoch > MAX_COUNT:
            formula = (
                "ceil(dataset_size * allocations_per_epoch / batch_size)"
                if k > 1
                else "ceil(dataset_size / batch_size)"
            )
            raise ValueError(
                f"epochs must be <= 2**53 / {formula} = {MAX_COUNT // per_epoch} (the run "
                f"may have at most 2**53 steps). Found {_shown(epochs)}."
            )
        return cls(dataset_size=n, batch_size=b, steps=epochs * per_epoch, **kwargs)

    def replace(self, **changes: Any) -> TrainingConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @property
    def steps_per_epoch(self) -> int:
        """l = ceil(n / b); under random allocation t = ceil(n k / b) (k = ``allocations_per_epoch``, 1 for every
        other scheme)."""
        return -(-self.dataset_size * self.allocations_per_epoch // self.batch_size)

    @property
    def full_epochs(self) -> int:
        """E = floor(T / l), completed passes."""
        return self.steps // self.steps_per_epoch

    @property
    def epochs_started(self) -> int:
        """K = ceil(T / l), passes begun (a partial last pass counts)."""
        return -(-self.steps // self.steps_per_epoch)

    @property
    def sampling_probability(self) -> float:
        """q = b / n."""
        return self.batch_size / self.dataset_size


def _check_rate(sample_rate: Any) -> float:
    try:
        q = (
            float(sample_rate)
            if isinstance(sample_rate, numbers.Real) and not isinstance(sample_rate, bool)
            else math.nan
        )
    except OverflowError:  # an integer beyond the largest double
        q = math.nan
    if not 0 < q <= 1:
        raise ValueError(f"sample_rate must be a number in (0, 1]. Found {_shown(sample_rate)}.")
    return q


def _batches_of_rate(q: float) -> int | None:
    """L when the rate is the float 1/L (Opacus' ``1 / len(data_loader)``), else None."""
    batches = round(1.0 / q)
    return batches if batches >= 1 and 1.0 / batches == q else None


def poisson_batch_size(dataset_size: int, sample_rate: float) -> int:
    r"""b of the core for Poisson sampling at rate ``sample_rate`` (Opacus' ``sample_rate``, the probability
    of dp-accounting's ``PoissonSampledDpEvent``): the smallest b with b/n >= the rate (in floating point
    too), so the core accounts a rate q = b/n with q >= the rate > q - 1/n: ``ceil(n / L)`` when the rate
    is 1/L (Opacus' ``1/len(data_loader)``, whose float n * q may fall just above an integer), else
    ``ceil(n q)``. Every Poisson row's number is non-decreasing in the rate at a fixed b:
    docs/derivations/poisson-amplification.md#sample-rate. The one definition: the command line's
    ``--sample-rate`` and the Opacus adapter use it.

    Raises:
      ValueError: ``dataset_size`` not an integer >= 1; ``sample_rate`` not in (0, 1]; or a rate below 1
        that would give b = n (a full batch every step, which the full-batch bounds assume and a rate
        below 1 does not give).
    """
    n = _check_int("dataset_size", dataset_size, 1)
    q = _check_rate(sample_rate)
    batches = _batches_of_rate(q)
    b = min(n, -(-n // batches) if batches is not None else math.ceil(n * q))  # q = 1/L: b = ceil(n / L)
    if b < n and b / n < q:  # n * q rounded down below an integer
        b += 1
    if b == n and q < 1:
        raise ValueError(
            f"sample_rate must be 1 or at most (n - 1) / n = {(n - 1) / n!r} for dataset_size = {n}: a rate in "
            "between would be accounted as a full batch every step (b = n), which it is not. Found "
            f"{_shown(sample_rate)}."
        )
    return b


def poisson_steps(epochs: int, sample_rate: float) -> int:
    r"""T of ``epochs`` passes at Poisson rate 1/L: ``epochs * L``, the steps Opacus' Poisson loader takes
    (``len(data_loader)`` = L batches an epoch). The count must be the run's own (the last-iterate bounds
    are not monotone in T), so another rate has no number of steps per epoch: give the steps.

    Raises:
      ValueError: ``epochs`` not an integer >= 1, ``sample_rate`` not 1/L for an integer L, or more than
        2**53 steps.
    """
    epochs = _check_int("epochs", epochs, 1)
    q = _check_rate(sample_rate)
    per_epoch = _batches_of_rate(q)
    if per_epoch is None:
        raise ValueError(
            "sample_rate must be 1/L for an integer L (Opacus' 1/len(data_loader): L steps an epoch) to count "
            f"epochs; at another rate give the number of steps the run took. Found {_shown(sample_rate)}."
        )
    if epochs * per_epoch > MAX_COUNT:
        raise ValueError(
            f"epochs must be <= 2**53 / {per_epoch} = {MAX_COUNT // per_epoch} at sample_rate 1/{per_epoch} (the "
            f"run may have at most 2**53 steps). Found {_shown(epochs)}."
        )
    return epochs * per_epoch


def _check_allocations(value: Any, sampling: Sampling) -> int:
    """k >= 1, and 1 unless the scheme is random allocation (every other scheme uses an example at most once per
    epoch, or has no epochs)."""
    k = _check_int("allocations_per_epoch", value, 1)
    if k != 1 and sampling is not Sampling.RANDOM_ALLOCATION:
        raise ValueError(
            "allocations_per_epoch must be 1 unless sampling is random_allocation (it is the number of an epoch's "
            f"steps each example joins under random allocation). Found {_shown(k)} with sampling {sampling.value}."
        )
    return k


#: Keywords that were renamed, with the message that names the new one.
RENAMED_KEYWORDS: dict[str, str] = {
    "clipping": (
        "clipping was renamed: pass gradient_norms_within_clip=True where you passed clipping=False (it asserts "
        "that every per-example gradient norm is <= C on the whole domain, so clipping is never active), and "
        "leave it at its default False where you passed clipping=True."
    ),
}


def _check_max_batch_size(value: Any, sampling: Sampling) -> int:
    """L >= 1, only under random allocation (the one scheme whose cut batches are accounted)."""
    if sampling is not Sampling.RANDOM_ALLOCATION:
        raise ValueError(
            "max_batch_size must be None unless sampling is random_allocation (it is the length every step's batch "
            "is cut and padded to, accounted for random allocation only; docs/derivations/fixed-length-batches.md). "
            f"Found {shown(value)} with sampling {sampling.value}."
        )
    return _check_int("max_batch_size", value, 1)


def refuse_renamed(params: Any) -> None:
    """Raise ValueError naming the new keyword when ``params`` uses a renamed one."""
    for old, message in RENAMED_KEYWORDS.items():
        if old in params:
            raise ValueError(message)


@dataclasses.dataclass(frozen=True)
class LossAssumptions:
    r"""What the user declares about the per-example losses and the domain.

    The constants must hold for the update actually run (for every per-example
    loss, on both neighbouring datasets, on the whole parameter domain).

    Attributes:
      smoothness: M, upper curvature / gradient-Lipschitz constant (None: not declared).
      weak_convexity: m >= 0, the losses are m-weakly convex (0 = convex).
      strong_convexity: lam >= 0 (0 = not strongly convex); must be <= M.
      diameter: D, diameter of the closed convex set the iterates are projected
        onto after every step (None: no projection).
      gradient_norms_within_clip: the strongest assumption in the library.
        True asserts that every per-example gradient norm is <= C at every point
        of the domain (not only along the run; Kong & Ribero, arXiv 2407.05237,
        Prop. 2.1(c)), so clipping is the identity; this enables the bounds that
        need the unclipped update. False (default): clipping may be active.
      clipped_loss_convex_smooth: the scalar-GLM route. True asserts that the
        clipped per-example update is the gradient step of convex losses with the
        declared smoothness and strong convexity, even where clipping is active:
        true for losses phi(<a, x>) with phi convex (clipping phi'(<a,x>) a to norm
        C is the gradient of psi(<a,x>) with psi' = clamp(phi', -C/|a|, C/|a|),
        convex and no smoother than phi) plus an l2 term applied outside the clip
        (torch SGD weight_decay under Opacus); false for vector outputs (softmax).
        :func:`lastiter_plugins.glm.certify_linear_model` derives it.
      l2_outside_clip: True asserts that the strong convexity is an l2 term w x
        added to the noisy clipped mean (torch SGD(weight_decay=w) under Opacus),
        so it does not grow with the number of examples in a batch, and that
        smoothness is the data term's plus w. Used where batch sizes vary
        (Poisson sampling); False (default): every constant is per example.
        :func:`lastiter_plugins.glm.certify_linear_model` derives it.
    """

    smoothness: float | None = None
    weak_convexity: float = 0.0
    strong_convexity: float = 0.0
    diameter: float | None = None
    gradient_norms_within_clip: bool = False
    clipped_loss_convex_smooth: bool = False
    l2_outside_clip: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.smoothness is not None:
            set_(self, "smoothness", _check_real("smoothness", self.smoothness, positive=False))
        set_(self, "weak_convexity", _check_real("weak_convexity", self.weak_convexity, positive=False))
        set_(self, "strong_convexity", _check_real("strong_convexity", self.strong_convexity, positive=False))
        if self.diameter is not None:
            set_(self, "diameter", _check_real("diameter", self.diameter, positive=True))
        for flag in ("gradient_norms_within_clip", "clipped_loss_convex_smooth", "l2_outside_clip"):
            set_(self, flag, _check_flag(flag, getattr(self, flag)))
        if self.strong_convexity > 0 and self.smoothness is not None and self.strong_convexity > self.smoothness:
            raise ValueError(
                "strong_convexity must be <= smoothness (a lam-strongly convex, M-smooth function has "
                f"lam <= M). Found strong_convexity={self.strong_convexity}, smoothness={self.smoothness}."
            )

    @property
    def clipping_may_be_active(self) -> bool:
        """The negation of the assertion ``gradient_norms_within_clip``."""
        return not self.gradient_norms_within_clip

    @property
    def update_is_gradient_step(self) -> bool:
        """The (clipped) per-example update is the gradient step of convex M-smooth losses whose
        gradients are bounded by C: clipping never active, or the scalar-GLM route."""
        return self.gradient_norms_within_clip or self.clipped_loss_convex_smooth

    @property
    def convex(self) -> bool:
        """Declared convex: weak_convexity = 0 or strongly convex."""
        return self.weak_convexity == 0.0 or self.strong_convexity > 0.0
