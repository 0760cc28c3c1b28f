r"""dp-accounting adapter: last-iterate DP-SGD runs as ``DpEvent``\ s, and a
``PrivacyAccountant`` that composes them with dp-accounting's standard events.

* :class:`LastIterateDpSgdEvent` describes one DP-SGD training run whose FINAL
  model only is released: the mechanism (data, batches, noise, steps, step
  size, clipping, projection) and the loss assumptions, nothing about how to
  account for it (dp_event.py's contract: an event describes the mechanism,
  the accountant decides how to account for it).
* :class:`LastIterateAccountant` is a ``dp_accounting.PrivacyAccountant``
  configured with the bound it accounts last-iterate runs with
  (``bound="best"`` by default; any id of ``lastiter_plugins.BOUND_IDS``). A
  last-iterate event contributes ``count`` times its RDP curve
  (:func:`lastiter_plugins.rdp` for that bound and the accountant's
  neighbouring relation); every other event (Gaussian, Laplace, Poisson /
  without-replacement sampled, RepeatAndSelect, ZCDp on 0.6, ...) is delegated
  to dp-accounting's ``rdp.RdpAccountant`` with the same orders and relation.
  So one accountant covers a pipeline mixing last-iterate runs with standard
  mechanisms. A ledger holding one run and nothing else is answered exactly as
  :func:`lastiter_plugins.epsilon` answers for it (lossless, f-DP
  bounds included); any composition is converted from the summed RDP on the
  order grid.
* ``LastIteratePldAccountant`` (in ``_pld``) composes runs certified
  mu-GDP (an f-DP bound whose privacy profile is one Gaussian) as the
  dominating Gaussian mechanism in dp-accounting's ``PLDAccountant``, with the
  standard events there (tighter than adding RDP curves; the host's
  discretisation rounds pessimistically).

Why runs compose additively in RDP: every bound of the library holds for an
arbitrary initial iterate, the same under both neighbouring datasets (inside
the projection set for the bounded-domain bounds). A later run or mechanism
may depend on what was released before: conditioned on those outputs, its
starting point is fixed, so RDP's adaptive composition (Mironov 2017, Prop. 1)
bounds the order-alpha divergence of the joint release by the sum of the
per-mechanism values. The guarantee covers the outputs of the standard
mechanisms and the final model of each run; intermediate iterates of a
last-iterate run must not be released.

Validation happens before any state changes (dp-accounting's own base class
updates the ledger before its real composition pass, so a late failure
leaves a ledger that disagrees with the RDP; we plan the whole composition
first, then commit). ``supports()`` is False for events whose parameters are
invalid, whose bound does not apply, or whose bound is proven for another
neighbouring relation.

Neighbouring relation and dp-accounting's Gaussian events: a
``GaussianDpEvent``'s ``noise_multiplier`` is noise / sensitivity. Under
REPLACE_ONE the sum of C-clipped gradients moves by up to 2C when one example
is replaced, so one DP-SGD step with noise z*C is ``GaussianDpEvent(z / 2)``
(google/differential-privacy issue 378). That is the
convention of ``RdpAccountant`` (0.4.3 and 0.6), to which standard events are
delegated. dp-accounting 0.6's ``PLDAccountant(REPLACE_ONE)`` applies the
factor 2 itself. So ledgers exchanged with it must be converted; see
docs/dp_accounting.md.

Tested against dp-accounting 0.4.3 (pinned by TF Privacy 0.9) and 0.6.0.

Modules of this package: this facade (the events and ``LastIterateAccountant``),
``_gdp`` (one run certified mu-GDP, composed as a Gaussian mechanism) and ``_pld``
(``LastIteratePldAccountant``). A run alone gets the core's lossless (epsilon, delta)
(:mod:`lastiter_plugins.evaluation`); its inputs are validated here, at the adapter's edge.
"""

import dataclasses
import enum
import functools
import math
import numbers
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp

from lastiter_plugins import evaluation, registry
from lastiter_plugins.adapters.dp_accounting import _gdp
from lastiter_plugins.api import build
from lastiter_plugins.config import (
    Relation,
    Sampling,
    Update,
    default_relation,
    refuse_renamed,
    resolve_relation,
    warn_at_caller,
)
from lastiter_plugins.conversion import rdp_to_epsilon
from lastiter_plugins.registry import BEST, BOUND_IDS, Protects
from lastiter_plugins.validation import validate_orders

if TYPE_CHECKING:  # at run time, loaded on first use by __getattr__ (it imports this module)
    from lastiter_plugins.adapters.dp_accounting._pld import LastIteratePldAccountant

__all__ = [
    "BoundId",
    "LastIterateAccountant",
    "LastIterateDpSgdEvent",
    "LastIteratePldAccountant",
    "SamplingScheme",
]


def __getattr__(name: str) -> Any:
    # LastIteratePldAccountant lives in _pld, which imports this module; loaded on first use.
    if name == "LastIteratePldAccountant":
        from lastiter_plugins.adapters.dp_accounting._pld import LastIteratePldAccountant

        return LastIteratePldAccountant
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


NeighboringRelation = dp_accounting.NeighboringRelation
CompositionErrorDetails: TypeAlias = dp_accounting.PrivacyAccountant.CompositionErrorDetails

_HOST_RELATION = {
    Relation.REPLACE_ONE: NeighboringRelation.REPLACE_ONE,
    Relation.ADD_OR_REMOVE_ONE: NeighboringRelation.ADD_OR_REMOVE_ONE,
}


# ---------------------------------------------------------------- the event


class _ValueEnum(enum.Enum):
    """An enum whose members print as ``BoundId.BEST``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


# Decision: ``bound``, ``sampling`` and ``update`` are stored as (non-str) enum members, not
# as strings. dp-accounting's ``DpEvent.to_named_tuple`` / ``from_named_tuple``
# treat every ``collections.abc.Sequence`` field as a list of sub-events and
# rebuild it with ``type(value)(elements)``: a str field "best" becomes
# "['b', 'e', 's', 't']" (checked on 0.4.3 and 0.6.0). Enum members are not
# sequences, so they round-trip. Strings (and lastiter_plugins.Sampling) are
# accepted and converted on construction.

if TYPE_CHECKING:  # what type checkers see: two enums (their members are made from the tables below)

    class BoundId(_ValueEnum):
        """The bound ids of :data:`lastiter_plugins.BOUND_IDS`."""

    class SamplingScheme(_ValueEnum):
        """The sampling schemes of :class:`lastiter_plugins.Sampling`."""

    class UpdateRule(_ValueEnum):
        """The update rules of :class:`lastiter_plugins.Update`."""

else:
    #: The bound ids of :data:`lastiter_plugins.BOUND_IDS` (values are the ids).
    BoundId = _ValueEnum(
        "BoundId", [(b.upper().replace("-", "_"), b) for b in BOUND_IDS], module=__name__, qualname="BoundId"
    )

    #: The sampling schemes of :class:`lastiter_plugins.Sampling` (values are the scheme names).
    SamplingScheme = _ValueEnum(
        "SamplingScheme", [(s.name, s.value) for s in Sampling], module=__name__, qualname="SamplingScheme"
    )

    #: The update rules of :class:`lastiter_plugins.Update` (values are the rule names).
    UpdateRule = _ValueEnum("UpdateRule", [(u.name, u.value) for u in Update], module=__name__, qualname="UpdateRule")


def _to_bound(value: Any) -> Any:
    if isinstance(value, BoundId):
        return value
    raw = value.value if isinstance(value, enum.Enum) else value
    if isinstance(raw, str):
        try:
            return BoundId(raw.strip().lower())
        except ValueError:
            pass
    raise ValueError(f"bound must be one of {', '.join(BOUND_IDS)}. Found {value!r}.")


def _to_sampling(value: Any) -> Any:
    if isinstance(value, SamplingScheme):
        return value
    if isinstance(value, str) and value.strip().lower() in BOUND_IDS:
        raise ValueError(
            f"sampling must be one of {', '.join(s.value for s in Sampling)}; found the bound id {value!r}. The "
            "bound moved from the event to the accountant: LastIterateAccountant(bound=...), and the event's "
            "first field is now sampling."
        )
    return SamplingScheme(Sampling.parse(value).value)  # Sampling.parse names the parameter on failure


def _to_update(value: Any) -> Any:
    return value if isinstance(value, UpdateRule) else UpdateRule(Update.parse(value).value)


def _is_zero(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and value == 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LastIterateDpSgdEvent(dp_event.DpEvent):
    r"""One DP-SGD run whose final model only is released.

    A description of the mechanism and of the loss, not of its accounting:
    :class:`LastIterateAccountant` chooses the bound.

    The run: ``steps`` updates
    ``x <- Pi(x - learning_rate * ((1/b) sum_{i in B} clip_C(grad f_i(x)) + N(0, (z C / b)^2 I)))``
    with batches formed by ``sampling``; every batch is normalised by
    ``batch_size`` (``update="sgd"``, the default; ``update="any"``: anything computed from the noisy
    clipped sums, such as Adam or momentum, for which only the every-iterate bounds apply).
    Intermediate iterates are NOT covered and must not be released (an accountant with
    ``bound="composition"`` covers them).

    Like dp-accounting's events, the numeric parameters are not checked on
    construction: ``LastIterateAccountant.supports`` is False (and ``compose``
    refuses) when they are invalid or the bound's preconditions fail.
    ``sampling`` is checked and stored as a :data:`SamplingScheme` member
    (strings are accepted) so that ``to_named_tuple`` round-trips. A ``noise_multiplier`` of exactly 0 is a
    valid description of a non-private run: its RDP is infinite at every order
    (as for ``GaussianDpEvent(0)``), which lets
    ``calibrate_dp_mechanism`` start its bracket at 0.

    Attributes:
      sampling: cyclic, shuffle_once, reshuffle, random_batch, poisson or random_allocation (what
        the data pipeline really does).
      dataset_size: n.
      batch_size: b, the (expected) batch size the noisy sum is divided by.
      noise_multiplier: z; the noise on the sum of clipped gradients has std z*C.
      steps: T, optimizer steps of the run.
      learning_rate: eta (None when unknown: only bounds that do not need it apply).
      clip_norm: C.
      smoothness: M (None: not declared).
      weak_convexity: m >= 0 (0 = convex).
      strong_convexity: lam >= 0.
      diameter: D of the convex set projected onto after each step (None: no projection).
      gradient_norms_within_clip: True asserts every per-example gradient norm <= C on the whole domain.
      clipped_loss_convex_smooth: True asserts the scalar-GLM route: every per-example loss is
        phi(<a, x>) with phi convex and M-smooth, so its clipped gradient is the gradient of a convex,
        M-smooth loss (docs/derivations/glm.md#glm-route); clipping may be active.
      l2_outside_clip: True says the strong convexity is an l2 term added after clipping and averaging
        (torch's ``weight_decay`` under Opacus), not part of each clipped per-example loss.
      update: ``"sgd"`` (plain SGD with the constant ``learning_rate``) or ``"any"`` (Adam, momentum, a
        learning-rate schedule fixed in advance: only the every-iterate bounds apply).
      allocations_per_epoch: k, with ``sampling="random_allocation"``: each example joins k of an epoch's
        ``ceil(n k / b)`` steps (1 for every other scheme).

    The parameters are those of ``lastiter_plugins.rdp`` / ``epsilon`` (``relation`` aside: the
    accountant's), with the same meaning and defaults.
    """

    sampling: SamplingScheme = attr.ib(converter=_to_sampling)
    dataset_size: int
    batch_size: int
    noise_multiplier: float
    steps: int
    learning_rate: float | None
    clip_norm: float = 1.0
    smoothness: float | None = None
    weak_convexity: float = 0.0
    strong_convexity: float = 0.0
    diameter: float | None = None
    gradient_norms_within_clip: bool = False
    clipped_loss_convex_smooth: bool = False
    l2_outside_clip: bool = False
    update: UpdateRule = attr.ib(default=UpdateRule(Update.SGD.value), converter=_to_update)
    allocations_per_epoch: int = 1

    def __new__(cls, *args: Any, **kwargs: Any) -> "LastIterateDpSgdEvent":
        refuse_renamed(kwargs)
        if "bound" in kwargs:
            raise TypeError(
                "LastIterateDpSgdEvent has no bound: an event describes the mechanism and the accountant decides "
                "how to account for it. Pass the bound to the accountant: LastIterateAccountant(bound=...)."
            )
        return super().__new__(cls)

    def to_params(self) -> dict[str, Any]:
        """The keyword parameters of ``lastiter_plugins.rdp`` / ``epsilon`` / ``account``
        for this run (``relation`` excluded: it is the accountant's)."""
        return {
            "dataset_size": self.dataset_size,
            "batch_size": self.batch_size,
            "noise_multiplier": self.noise_multiplier,
            "steps": self.steps,
            "learning_rate": self.learning_rate,
            "clip_norm": self.clip_norm,
            "smoothness": self.smoothness,
            "weak_convexity": self.weak_convexity,
            "strong_convexity": self.strong_convexity,
            "diameter": self.diameter,
            "gradient_norms_within_clip": self.gradient_norms_within_clip,
            "clipped_loss_convex_smooth": self.clipped_loss_convex_smooth,
            "l2_outside_clip": self.l2_outside_clip,
            "allocations_per_epoch": self.allocations_per_epoch,
            "sampling": self.sampling.value,
            "update": self.update.value,
        }

    def rdp(
        self,
        bound: str = "best",
        orders=None,
        neighboring_relation: Any = None,
        published_only: bool = False,
    ) -> np.ndarray:
        """RDP (nats) of the run at each order by ``bound``, for ``neighboring_relation`` (default: the sampling
        scheme's, ``lastiter_plugins.config.DEFAULT_RELATION``: ADD_OR_REMOVE_ONE for Poisson sampling and
        random allocation, REPLACE_ONE otherwise; ``published_only``: ``best`` over the bounds whose proof is
        a published theorem).

        Raises:
          NotApplicableError: the bound does not apply (wrong sampling or relation,
            a precondition fails); the message names the condition and the theorem.
          ValueError: an invalid parameter.
        """
        config, assumptions, no_noise = self._build(neighboring_relation)
        curve = evaluation.rdp_of(_to_bound(bound).value, config, assumptions, validate_orders(orders), published_only)
        return np.full_like(curve, np.inf) if no_noise else curve

    def gaussian_mu(self, bound: str = "best", neighboring_relation: Any = None) -> float:
        r"""mu such that the run is mu-GDP for ``neighboring_relation`` (default: the sampling scheme's, as
        :meth:`rdp`) by ``bound``.

        ``bound``: a GDP bound whose privacy profile is one Gaussian
        (``shifted-interpolation-full-batch``, ``shifted-interpolation-cyclic``),
        or ``best``: the smallest mu over those that apply. The run is then
        dominated by a Gaussian mechanism of sensitivity 1 and noise 1/mu
        (infinite for ``noise_multiplier=0``).

        Raises:
          NotApplicableError: no such bound applies (a Renyi-DP bound, a mixture
            profile such as ``shifted-interpolation-shuffle``, or a failed
            precondition); the message says which and what to use instead.
        """
        config, assumptions, no_noise = self._build(neighboring_relation)
        mu, _ = _gdp.gaussian_mu(_to_bound(bound).value, config, assumptions)
        return math.inf if no_noise else mu

    def _build(self, neighboring_relation: Any) -> tuple[Any, Any, bool]:
        """(TrainingConfig, LossAssumptions, noise is zero) for the relation (None: the sampling scheme's
        default), validated."""
        if neighboring_relation is None:
            relation = resolve_relation(None, self.sampling.value, name="neighboring_relation")
        else:
            relation = _parse_relation(neighboring_relation)
        params = self.to_params()
        no_noise = _is_zero(self.noise_multiplier)
        if no_noise:  # no precondition depends on z; validate everything else with a placeholder
            params["noise_multiplier"] = 1.0
        config, assumptions = build(relation=relation, **params)
        return config, assumptions, no_noise


#: The FutureWarning of ``LastIterateAccountant()`` without ``neighboring_relation`` (until 0.4.0).
_DEFAULT_CHANGED = (
    "LastIterateAccountant() without neighboring_relation accounts under ADD_OR_REMOVE_ONE, the default of "
    "dp-accounting's own accountants, since lastiter-plugins 0.3.0 (0.2.0 used REPLACE_ONE, which gives a larger "
    "epsilon for Poisson runs; cyclic, shuffle_once, reshuffle and random_batch runs have bounds under "
    "REPLACE_ONE only and are refused under ADD_OR_REMOVE_ONE). Pass "
    "neighboring_relation=NeighboringRelation.REPLACE_ONE to keep the 0.2.0 numbers, or "
    "NeighboringRelation.ADD_OR_REMOVE_ONE to silence this warning, which goes in 0.4.0."
)


def _relation_hint(event: Any, relation: Relation) -> str:
    """What to pass when a run is refused under a relation other than its sampling scheme's default."""
    try:
        native = default_relation(event.sampling.value)
    except (AttributeError, ValueError):
        return ""
    if native is relation:
        return ""
    return (
        f". Runs with sampling={event.sampling.value} are accounted under {native.value}: pass "
        f"neighboring_relation=NeighboringRelation.{native.name} to the accountant"
    )


def _parse_relation(value: Any) -> Relation:
    try:
        return Relation.parse(value)
    except ValueError:
        raise ValueError(
            "neighboring_relation must be REPLACE_ONE or ADD_OR_REMOVE_ONE (the relations the last-iterate "
            f"bounds are proven for; use dp_accounting.rdp.RdpAccountant for others). Found {value!r}."
        ) from None


# ---------------------------------------------------------------- standard events


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_gaussian(e: Any) -> str | None:
    z = e.noise_multiplier
    if _is_real(z) and z >= 0:
        return None
    return f"GaussianDpEvent.noise_multiplier must be a number >= 0. Found {z!r}."


def _check_laplace(e: Any) -> str | None:
    z = e.noise_multiplier
    if _is_real(z) and z > 0:
        return None
    return f"LaplaceDpEvent.noise_multiplier must be a number > 0. Found {z!r}."


def _check_poisson(e: Any) -> str | None:
    q = e.sampling_probability
    if _is_real(q) and 0 <= q <= 1:
        return None
    return f"PoissonSampledDpEvent.sampling_probability must be in [0, 1]. Found {q!r}."


def _check_sampled(e: Any) -> str | None:
    name, n, m = type(e).__name__, e.source_dataset_size, e.sample_size
    if not (_is_int(n) and n >= 1):
        return f"{name}.source_dataset_size must be an integer >= 1. Found {n!r}."
    if not (_is_int(m) and m >= 0):
        return f"{name}.sample_size must be an integer >= 0. Found {m!r}."
    if isinstance(e, dp_event.SampledWithoutReplacementDpEvent) and m > n:
        return f"{name}.sample_size must be <= source_dataset_size = {n}. Found {m}."
    return None


def _check_self_composed(e: Any) -> str | None:
    # >= 1 as dp-accounting's ledger (DpEventBuilder) requires; RdpAccountant would take 0.
    if _is_int(e.count) and e.count >= 1:
        return None
    return f"SelfComposedDpEvent.count must be an integer >= 1. Found {e.count!r}."


def _check_nested_last_iterate(e: Any) -> str | None:
    return (
        "a LastIterateDpSgdEvent can only be composed (ComposedDpEvent, SelfComposedDpEvent); it cannot be "
        "sampled, repeated or nested in another mechanism: its bound already accounts for the run's sampling."
    )


# Parameter checks dp-accounting does not make (0.4.3 accepts GaussianDpEvent(-1));
# applied to every event nested in a delegated standard event.
_STANDARD_CHECKS: dict[type, Callable[[Any], str | None]] = {
    dp_event.GaussianDpEvent: _check_gaussian,
    dp_event.LaplaceDpEvent: _check_laplace,
    dp_event.PoissonSampledDpEvent: _check_poisson,
    dp_event.SampledWithoutReplacementDpEvent: _check_sampled,
    dp_event.SampledWithReplacementDpEvent: _check_sampled,
    dp_event.SelfComposedDpEvent: _check_self_composed,
    LastIterateDpSgdEvent: _check_nested_last_iterate,
}


class _Refusal(Exception):
    """Internal: composition of ``event`` is not supported, for ``message``."""

    def __init__(self, event: Any, message: str):
        super().__init__(message)
        self.event = event
        self.message = message


def _nested_events(event: Any):
    """``event`` and every DpEvent nested in its attrs fields (lists included)."""
    yield event
    if not attr.has(type(event)):
        return
    for field in attr.fields(type(event)):
        value = getattr(event, field.name)
        children = value if isinstance(value, list | tuple) else [value]
        for child in children:
            if isinstance(child, dp_event.DpEvent):
                yield from _nested_events(child)


def _check_standard(event: Any) -> None:
    for sub in _nested_events(event):
        check = _STANDARD_CHECKS.get(type(sub))
        message = check(sub) if check is not None else None
        if message is not None:
            raise _Refusal(sub, message)


def _host_rdp_uncached(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    accountant = _dp_rdp.RdpAccountant(list(orders), relation)
    error = accountant._maybe_compose(event, 1, False)  # the host's own dry run
    if error is not None:
        raise _Refusal(error.invalid_event if error.invalid_event is not None else event, error.error_message)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            accountant.compose(event)
    except (ArithmeticError, AssertionError, TypeError, ValueError) as exc:
        raise _Refusal(
            event,
            f"dp-accounting's RdpAccountant failed on it, its parameters are invalid ({type(exc).__name__}: {exc})",
        ) from None
    curve = np.array(accountant.rdp, dtype=float)
    # Never optimistic: a NaN or a negative value (numerical trouble in the host
    # at extreme parameters) becomes +inf, which the conversion simply ignores.
    curve[np.isnan(curve) | (curve < 0)] = np.inf
    curve.setflags(write=False)
    return curve


@functools.lru_cache(maxsize=256)
def _host_rdp_cached(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    return _host_rdp_uncached(event, orders, relation)


def _host_rdp(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    """RDP of a standard event by dp-accounting's RdpAccountant (cached for hashable events)."""
    try:
        hash(event)
    except TypeError:  # e.g. a ComposedDpEvent (its list field is unhashable)
        return _host_rdp_uncached(event, orders, relation)
    return _host_rdp_cached(event, orders, relation)


# ---------------------------------------------------------------- one run alone (lossless)


def _run_inputs(run: Any, relation: Relation, orders_key: tuple[float, ...] | None) -> tuple[Any, Any, Any]:
    config, assumptions, _ = run._build(relation)
    return config, assumptions, None if orders_key is None else np.array(orders_key)


# Cached: snapshots and host calibration ask the same state the same question many times.
@functools.lru_cache(maxsize=256)
def _single_run_epsilon(
    run: Any, bound: str, relation: Relation, orders_key: tuple[float, ...] | None, published_only: bool, delta: float
) -> tuple[float, float | None]:
    config, assumptions, orders = _run_inputs(run, relation, orders_key)
    result = evaluation.epsilon_result(bound, config, assumptions, delta, orders, published_only=published_only)
    return float(result.epsilon), result.order


@functools.lru_cache(maxsize=256)
def _single_run_delta(
    run: Any, bound: str, relation: Relation, orders_key: tuple[float, ...] | None, published_only: bool, eps: float
) -> tuple[float, float | None]:
    config, assumptions, orders = _run_inputs(run, relation, orders_key)
    return evaluation.delta_of(bound, config, assumptions, eps, orders, published_only)


# ---------------------------------------------------------------- the accountant


@dataclasses.dataclass
class _Plan:
    """What composing an event would add to the accountant's state."""

    rdp: np.ndarray
    last_iterate_runs: int = 0
    standard_events: int = 0
    non_private: bool = False
    run: Any = None  # the first last-iterate run (the answer when it is the only event)
    alone_only: str = ""  # why a run can be accounted only on its own (its rows have no Renyi curve)
    alone_event: Any = None  # that run
    final_model_only: bool = False  # some run's guarantee may come from a last-iterate bound

    def __iadd__(self, other: "_Plan") -> "_Plan":
        self.rdp = self.rdp + other.rdp
        self.last_iterate_runs += other.last_iterate_runs
        self.run = self.run if self.run is not None else other.run
        self.standard_events += other.standard_events
        self.non_private = self.non_private or other.non_private
        if not self.alone_only:
            self.alone_only, self.alone_event = other.alone_only, other.alone_event
        self.final_model_only = self.final_model_only or other.final_model_only
        return self

    @property
    def events(self) -> int:
        return self.last_iterate_runs + self.standard_events + int(self.non_private)


def _check_count(count: Any) -> int:
    if not _is_int(count):
        raise TypeError(f"count must be an integer. Found {count!r} ({type(count).__name__}).")
    if count < 1:
        raise ValueError(f"count must be an integer >= 1. Found {count}.")
    return int(count)


class _EventPlanning:
    """How both accountants walk a DpEvent tree: each event type is planned by the method
    ``_planners`` (the subclass's dispatch table) maps it to, any other type by
    ``_plan_standard``; no-op, self-composed and composed events the same way for both.
    A plan is the state change composing the event would make; planning changes nothing
    and raises ``_Refusal`` naming the offending sub-event."""

    _planners: ClassVar[dict[type, Callable[[Any, Any, int], Any]]] = {}

    def _empty_plan(self) -> Any:
        raise NotImplementedError

    def _plan_standard(self, event: Any, count: int) -> Any:
        raise NotImplementedError

    def _plan(self, event: Any, count: int) -> Any:
        if not isinstance(event, dp_event.DpEvent):
            raise _Refusal(None, f"expected a DpEvent. Found {event!r} ({type(event).__name__}).")
        return self._planners.get(type(event), type(self)._plan_standard)(self, event, count)

    def _plan_no_op(self, event: Any, count: int) -> Any:
        return self._empty_plan()

    def _plan_self_composed(self, event: Any, count: int) -> Any:
        message = _check_self_composed(event)
        if message is not None:
            raise _Refusal(event, message)
        return self._plan(event.event, count * int(event.count))

    def _plan_composed(self, event: Any, count: int) -> Any:
        if not isinstance(event.events, list | tuple):
            raise _Refusal(event, f"ComposedDpEvent.events must be a list of DpEvents. Found {event.events!r}.")
        plan = self._empty_plan()
        for sub in event.events:
            if not isinstance(sub, dp_event.DpEvent):
                raise _Refusal(event, f"ComposedDpEvent.events must contain DpEvents only. Found {sub!r}.")
            plan += self._plan(sub, count)
        return plan


class LastIterateAccountant(_EventPlanning, dp_accounting.PrivacyAccountant):
    r"""RDP accountant for pipelines mixing last-iterate DP-SGD runs
    (:class:`LastIterateDpSgdEvent`) with dp-accounting's standard events.

    Every epsilon it reports holds for ``neighboring_relation`` and covers the
    outputs of the standard mechanisms and the FINAL model of each last-iterate
    run (not its intermediate iterates).

    A ledger holding exactly one last-iterate run and nothing else is answered
    exactly as ``lastiter_plugins.epsilon`` answers for that run
    (lossless; an f-DP bound's privacy profile converted exactly), also when the
    rows that apply have no Renyi-DP curve (a privacy loss distribution, or a
    profile with truncated tails): such a run is accepted alone and refused in
    a ledger with anything else. Anything
    else composed (a second run, the same run twice, a standard event) is the
    sum of the RDP curves (an f-DP bound enters with the RDP its profile
    implies: alpha mu^2 / 2, or the mixture's) converted on the order grid.
    For runs certified mu-GDP, ``LastIteratePldAccountant`` composes with
    standard events in dp-accounting's PLD accountant instead.

    Args:
      bound: the bound last-iterate runs are accounted with: an id of
        ``lastiter_plugins.BOUND_IDS`` (``best``, the default, is the per-order
        minimum over the proven bounds valid for each run; ``composition`` is the
        standard baseline, which covers every iterate).
      orders: Renyi orders (> 1), copied; default ``lastiter_plugins.DEFAULT_ORDERS``.
      neighboring_relation: ``NeighboringRelation.ADD_OR_REMOVE_ONE`` (default, the
        default of dp-accounting's own accountants and the relation Poisson runs
        default to everywhere in lastiter-plugins) or ``REPLACE_ONE``, the only
        relation with bounds for runs of the other sampling schemes (cyclic,
        shuffle_once, reshuffle, random_batch), which are refused under
        ADD_OR_REMOVE_ONE (also accepted: ``lastiter_plugins.Relation`` or its
        string value). lastiter-plugins 0.2.0 defaulted to REPLACE_ONE; until
        0.4.0, leaving it out warns with a ``FutureWarning``.
      published_only: ``best`` over the bounds whose proof is a published theorem for each run (not
        this library's derivations; a named bound must be one).

    Raises:
      ValueError: an unknown bound, invalid orders, or another relation (REPLACE_SPECIAL).
    """

    def __init__(
        self,
        bound: Any = "best",
        orders=None,
        neighboring_relation: Any = None,
        published_only: bool = False,
    ):
        if not isinstance(published_only, bool):
            raise ValueError(f"published_only must be True or False. Found {published_only!r}.")
        self._published_only = published_only
        relation = Relation.ADD_OR_REMOVE_ONE if neighboring_relation is None else _parse_relation(neighboring_relation)
        self._bound = _to_bound(bound)
        super().__init__(_HOST_RELATION[relation])
        self._relation = relation
        self._default_orders = orders is None
        self._orders = validate_orders(orders)
        self._orders.setflags(write=False)
        self._orders_key = tuple(float(a) for a in self._orders)
        self._rdp = np.zeros_like(self._orders)
        self._last_iterate_runs = 0
        self._standard_events = 0
        self._non_private = False
        self._run: LastIterateDpSgdEvent | None = None
        self._alone_only = ""
        self._final_model_only = False
        if neighboring_relation is None:  # after every check: a refused constructor says only why
            warn_at_caller(_DEFAULT_CHANGED, FutureWarning)

    # ------------------------------------------------------------ planning

    def _scale(self, curve: np.ndarray, count: int) -> np.ndarray:
        return curve * count if count else np.zeros_like(self._orders)  # never 0 * inf

    def _empty_plan(self) -> _Plan:
        return _Plan(np.zeros_like(self._orders))

    def _plan_non_private(self, event: Any, count: int) -> _Plan:
        return _Plan(self._scale(np.full_like(self._orders, np.inf), count), non_private=count > 0)

    def _plan_last_iterate(self, event: Any, count: int) -> _Plan:
        alone_only = ""
        try:
            curve = event.rdp(self._bound.value, self._orders, self._relation, self._published_only)
        except (TypeError, ValueError) as exc:  # NotApplicableError is a ValueError
            if not self._applies_without_curve(event):
                hint = _relation_hint(event, self._relation)
                raise _Refusal(event, f"{exc} (LastIterateAccountant, relation {self._relation.value}){hint}") from None
            # Its rows have an (epsilon, delta) profile but no Renyi curve: the run alone is answered by the
            # core from that profile; composed with anything else it has no RDP to add (refused then).
            curve, alone_only = np.full_like(self._orders, np.inf), str(exc)
        plan = _Plan(self._scale(curve, count), last_iterate_runs=count, run=event if count else None)
        plan.final_model_only = count > 0 and self._may_be_final_model_only(event)
        if count and alone_only:
            plan.alone_only, plan.alone_event = alone_only, event
        return plan

    def _may_be_final_model_only(self, event: Any) -> bool:
        """Whether a bound that protects the final model only may enter the run's number (``best``: some
        candidate does; a named bound: that bound does)."""
        config, assumptions, _ = event._build(self._relation)
        if self._bound.value == BEST:
            specs = evaluation.best_candidates(config, assumptions, self._published_only)
        else:
            specs = (registry.BOUNDS[self._bound.value],)
        return any(spec.protects is Protects.FINAL_MODEL for spec in specs)

    def _applies_without_curve(self, event: Any) -> bool:
        """The accountant's bound applies to the run (``best``: some candidate does), none with a Renyi curve."""
        try:
            config, assumptions, _ = event._build(self._relation)
            evaluation.require_applicable(self._bound.value, config, assumptions, self._published_only)
        except (TypeError, ValueError):
            return False
        return True

    def _refusal_if_not_alone(self, plan: _Plan) -> _Refusal | None:
        """A run whose rows have no Renyi curve is accounted only as the one event of the ledger."""
        alone_only = self._alone_only or plan.alone_only
        if not alone_only or self._events + plan.events <= 1:
            return None
        return _Refusal(
            plan.alone_event if plan.alone_only else self._run,
            f"{alone_only} A run accounted by a privacy profile is answered on its own (compose it alone into a "
            "LastIterateAccountant: get_epsilon and get_delta use its profile exactly); composed with other events "
            "it has no Renyi-DP curve to add. Use LastIteratePldAccountant for runs certified mu-GDP, or account "
            "the run with bound='composition'.",
        )

    def _plan_standard(self, event: Any, count: int) -> _Plan:
        _check_standard(event)
        curve = _host_rdp(event, self._orders_key, self.neighboring_relation)
        return _Plan(self._scale(curve, count), standard_events=count)

    def _commit(self, plan: _Plan) -> None:
        self._rdp = self._rdp + plan.rdp
        self._last_iterate_runs += plan.last_iterate_runs
        self._standard_events += plan.standard_events
        self._non_private = self._non_private or plan.non_private
        self._run = self._run if self._run is not None else plan.run
        self._alone_only = self._alone_only or plan.alone_only
        self._final_model_only = self._final_model_only or plan.final_model_only

    @property
    def _events(self) -> int:
        return self._last_iterate_runs + self._standard_events + int(self._non_private)

    # ------------------------------------------------------------ PrivacyAccountant API

    def _maybe_compose(self, event: Any, count: int, do_compose: bool) -> CompositionErrorDetails | None:
        """Dry run (``do_compose=False``) or composition; the whole event is
        planned before anything changes, so a refused event changes nothing."""
        if not (_is_int(count) and count >= 0):
            return CompositionErrorDetails(
                invalid_event=event, error_message=f"count must be an integer >= 0. Found {count!r}."
            )
        try:
            plan = self._plan(event, int(count))
        except _Refusal as planned:
            return CompositionErrorDetails(invalid_event=planned.event, error_message=planned.message)
        try:  # supports() asks with count 0: would the event be accepted once?
            refusal = self._refusal_if_not_alone(plan if count else self._plan(event, 1))
        except _Refusal as refused:
            refusal = refused
        if refusal is not None:
            return CompositionErrorDetails(invalid_event=refusal.event, error_message=refusal.message)
        if do_compose:
            self._commit(plan)
        return None

    def compose(self, event: dp_event.DpEvent, count: int = 1) -> "LastIterateAccountant":
        """Account for ``count`` applications of ``event``; returns ``self``.

        Raises:
          TypeError: ``event`` is not a DpEvent or ``count`` is not an integer.
          ValueError: ``count`` < 1.
          dp_accounting.UnsupportedEventError: the event (or a sub-event, named
            in the message) is unsupported or invalid; the ledger and the RDP
            are then left untouched.
        """
        if not isinstance(event, dp_event.DpEvent):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        count = _check_count(count)
        try:
            plan = self._plan(event, count)
            refusal = self._refusal_if_not_alone(plan)
            if refusal is not None:
                raise refusal
        except _Refusal as refusal:
            raise dp_accounting.UnsupportedEventError(
                f"Unsupported event: {event}. Error: [{refusal.message}] caused by subevent {refusal.event}."
            ) from None
        self._ledger.compose(event, count)  # cannot fail: event and counts are validated as the builder wants
        self._commit(plan)
        return self

    @property
    def orders(self) -> np.ndarray:
        """The Renyi orders (a copy)."""
        return self._orders.copy()

    @property
    def rdp(self) -> np.ndarray:
        """The accumulated RDP at each order (a copy)."""
        return self._rdp.copy()

    @property
    def bound(self) -> str:
        """The bound id last-iterate runs are accounted with."""
        return self._bound.value

    @property
    def relation(self) -> Relation:
        """The neighbouring relation, as ``lastiter_plugins.Relation``."""
        return self._relation

    def _single_run(self) -> tuple[Any, ...] | None:
        """The cache key (run, bound, relation, orders or None) of the one last-iterate run
        when it is the only event composed (NoOps aside) and has noise, else None."""
        if self._last_iterate_runs != 1 or self._standard_events or self._non_private or self._run is None:
            return None
        if _is_zero(self._run.noise_multiplier):
            return None
        orders_key = None if self._default_orders else self._orders_key
        return (self._run, self._bound.value, self._relation, orders_key, self._published_only)

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float | None]:
        """(epsilon, optimal order) at ``target_delta`` in [0, 1].

        One last-iterate run and nothing else: exactly
        ``lastiter_plugins.epsilon`` for that run and the accountant's
        bound, orders and relation (lossless: a privacy profile is converted
        exactly, with order None; a curve linear in the order at its continuous
        optimum; any other curve refined between the orders). Anything else
        composed: the sum of the RDP curves on the order grid, converted by
        ``lastiter_plugins``' conversion (dp-accounting's ``compute_epsilon``,
        improved conversion; warns with ``OrderGridWarning`` when the optimum is
        at an edge of the grid). Valid either way."""
        if not (_is_real(target_delta) and 0 <= target_delta <= 1):
            raise ValueError(f"target_delta must be in [0, 1]. Found {target_delta!r}.")
        if 0 < target_delta < 1:
            single = self._single_run()
            if single is not None:
                return _single_run_epsilon(*single, float(target_delta))
            return rdp_to_epsilon(self._orders, self._rdp, float(target_delta))
        eps, order = _dp_rdp.compute_epsilon(self._orders, self._rdp, float(target_delta))
        return float(eps), float(order)

    def get_epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` for everything composed so far (see ``get_epsilon_and_optimal_order``)."""
        return self.get_epsilon_and_optimal_order(target_delta)[0]

    def get_delta_and_optimal_order(self, target_epsilon: float) -> tuple[float, float | None]:
        """(delta, optimal order) at ``target_epsilon`` >= 0.

        dp-accounting's ``compute_delta`` on the grid; for one last-iterate run
        and nothing else, the smaller of that and the counterpart of its
        lossless epsilon: the smallest delta over the bound's candidates, each
        converted as for epsilon (a privacy profile exactly, order None; a linear
        curve at the continuous optimum; any other curve refined between the
        orders). Every number is ``compute_delta`` at an order where the bound
        was evaluated, or a profile's exact delta. So
        ``get_delta(get_epsilon(d)) <= d`` (to rounding)."""
        if not (_is_real(target_epsilon) and target_epsilon >= 0):
            raise ValueError(f"target_epsilon must be a number >= 0. Found {target_epsilon!r}.")
        with np.errstate(invalid="ignore"):  # inf - inf at a non-private order; the host handles it (delta 1)
            delta, order = _dp_rdp.compute_delta(self._orders, self._rdp, float(target_epsilon))
        single = self._single_run()
        if single is not None:  # both are valid; the grid's can only help (a mixture's RDP, say)
            found = _single_run_delta(*single, float(target_epsilon))
            if found[0] <= delta:
                return found
        return float(delta), float(order)

    def get_delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon`` for everything composed so far."""
        return self.get_delta_and_optimal_order(target_epsilon)[0]

    def statement(self, target_delta: float) -> str:
        """A one-line, honest description of the current guarantee."""
        eps, order = self.get_epsilon_and_optimal_order(target_delta)
        parts = []
        single = self._single_run()
        if single is not None:  # the run alone: what its winner protects
            config, assumptions, _ = single[0]._build(self._relation)
            orders = None if single[3] is None else self._orders
            winner = evaluation.epsilon_result(
                self._bound.value, config, assumptions, target_delta, orders, published_only=self._published_only
            )
            final_only = winner.protects is Protects.FINAL_MODEL
            bound = f"{self._bound.value}{f' via {winner.winner}' if self._bound.value == BEST else ''}"
        else:
            final_only, bound = self._final_model_only, self._bound.value
        if self._last_iterate_runs:
            runs = f"{self._last_iterate_runs} DP-SGD run(s), bound {bound}"
            parts.append(
                f"the final model only of {runs} (intermediate iterates must not be released)"
                if final_only
                else f"every iterate of {runs}"
            )
        if self._standard_events:
            parts.append(f"the outputs of {self._standard_events} standard mechanism application(s)")
        if self._non_private:
            parts.append("a non-private operation")
        covered = " and ".join(parts) if parts else "nothing released yet"
        how = "privacy profile converted exactly" if order is None else f"RDP order {order:g}"
        return f"({eps:.4g}, {target_delta:g})-DP under {self._relation.value} neighbours [{how}] for {covered}."


# Dispatch table: how each event type is composed; any other type is a standard
# event, delegated to dp-accounting's RdpAccountant.
LastIterateAccountant._planners = {
    dp_event.NoOpDpEvent: LastIterateAccountant._plan_no_op,
    dp_event.NonPrivateDpEvent: LastIterateAccountant._plan_non_private,
    dp_event.SelfComposedDpEvent: LastIterateAccountant._plan_self_composed,
    dp_event.ComposedDpEvent: LastIterateAccountant._plan_composed,
    LastIterateDpSgdEvent: LastIterateAccountant._plan_last_iterate,
}
