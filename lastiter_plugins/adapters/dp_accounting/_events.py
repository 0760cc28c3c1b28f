r"""The vocabulary of the dp-accounting adapter: :class:`LastIterateDpSgdEvent` (one DP-SGD run whose final
model only is released, as a ``DpEvent``), the enums its fields are stored as (:data:`BoundId`,
:data:`SamplingScheme`, :data:`UpdateRule`) and the neighbouring relations the accountants accept.

An event describes the mechanism (data, batches, noise, steps, step size, clipping, projection) and the
loss assumptions, nothing about how to account for it (dp_event.py's contract); the accountants
(``_rdp``, ``_pld``) choose the bound. Its numbers come from the public API (:func:`lastiter_plugins.rdp`)
and the host contract (:mod:`lastiter_plugins.host`); its inputs are validated at this edge.
"""

import enum
import math
import numbers
from typing import TYPE_CHECKING, Any

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event

import lastiter_plugins as lp
from lastiter_plugins.adapters.dp_accounting import _gdp
from lastiter_plugins.api import build
from lastiter_plugins.config import Relation, Sampling, Update, refuse_renamed, resolve_relation

#: Where the public names live: the enums and the event say so (``to_named_tuple`` records the event's
#: module, and a pickled enum member its enum's), whichever module of the package defines them.
PUBLIC_MODULE = __name__.rpartition(".")[0]

NeighboringRelation = dp_accounting.NeighboringRelation

_HOST_RELATION = {
    Relation.REPLACE_ONE: NeighboringRelation.REPLACE_ONE,
    Relation.ADD_OR_REMOVE_ONE: NeighboringRelation.ADD_OR_REMOVE_ONE,
}


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
        "BoundId", [(b.upper().replace("-", "_"), b) for b in lp.BOUND_IDS], module=PUBLIC_MODULE, qualname="BoundId"
    )

    #: The sampling schemes of :class:`lastiter_plugins.Sampling` (values are the scheme names).
    SamplingScheme = _ValueEnum(
        "SamplingScheme", [(s.name, s.value) for s in Sampling], module=PUBLIC_MODULE, qualname="SamplingScheme"
    )

    #: The update rules of :class:`lastiter_plugins.Update` (values are the rule names).
    UpdateRule = _ValueEnum(
        "UpdateRule", [(u.name, u.value) for u in Update], module=PUBLIC_MODULE, qualname="UpdateRule"
    )


def _to_bound(value: Any) -> Any:
    if isinstance(value, BoundId):
        return value
    raw = value.value if isinstance(value, enum.Enum) else value
    if isinstance(raw, str):
        try:
            return BoundId(raw.strip().lower())
        except ValueError:
            pass
    raise ValueError(f"bound must be one of {', '.join(lp.BOUND_IDS)}. Found {value!r}.")


def _to_sampling(value: Any) -> Any:
    if isinstance(value, SamplingScheme):
        return value
    if isinstance(value, str) and value.strip().lower() in lp.BOUND_IDS:
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
      order_secret: False says the batches were drawn from a public seed (a known order): only the rows
        proven for every fixed batch sequence apply (docs/derivations/public-order.md).

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
    order_secret: bool = True

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
            "order_secret": self.order_secret,
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
        curve = lp.rdp(
            _to_bound(bound).value, orders, published_only=published_only, config=config, assumptions=assumptions
        )
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
        impossible = lp.impossible_declaration(config, assumptions)  # a real run has real losses
        if impossible is not None:
            raise lp.NotApplicableError(f"{impossible}. Found them declared in LastIterateDpSgdEvent.")
        return config, assumptions, no_noise


LastIterateDpSgdEvent.__module__ = PUBLIC_MODULE


def _parse_relation(value: Any) -> Relation:
    try:
        return Relation.parse(value)
    except ValueError:
        raise ValueError(
            "neighboring_relation must be REPLACE_ONE or ADD_OR_REMOVE_ONE (the relations the last-iterate "
            f"bounds are proven for; use dp_accounting.rdp.RdpAccountant for others). Found {value!r}."
        ) from None
