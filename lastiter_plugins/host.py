r"""The host contract: what a host adapter (Opacus, Keras, dp-accounting, ...) uses of the core.

An adapter observes what a run did, describes it as the core's pipeline (a :class:`TrainingConfig` and
:class:`LossAssumptions`) and asks this module for its number. It imports the public package
(``lastiter_plugins``: the pipeline types, ``epsilon``, ``applicable_bounds``, ``calibrate_noise``, the
errors) and this module, never the inner modules (``evaluation``, ``registry``, ``conversion``, ``profiles``,
``bounds``): tests/stories/test_host_contract.py checks it.

* :class:`Declaration`: what the user registered besides the pipeline: the bound asked for, ``best``'s
  restrictions, the Renyi orders.
* :class:`Departure`: a fact observed at a step that leaves the declared pipeline (the optimizer is Adam, the
  learning rate follows a schedule, a gradient norm exceeded the clip the user declared it within, ...),
  as the weakening of the pipeline it implies. A departure removes exactly the rows whose preconditions it
  breaks, for the whole run; the run is refused only when no row is left, or when the bound the user named
  (or ``require="last_iterate"``) is broken.
* :func:`account`: the number for the pipeline that ran, with the rows that left, when and why.
* :func:`host_numbers`: what the host's own accountant would print for the run, marked NOT VALID where its
  sampling assumption fails (display only: never counted).

An adapter that composes runs with its host's other mechanisms (dp-accounting's accountants) also reads a
bound's RDP curve and epsilon (the public ``rdp`` and ``epsilon``) and, here: the rows a bound's number comes
from (:func:`rows`), its delta at an epsilon (:func:`delta_of`), a GDP row's mus (:func:`gaussian_mus`) and
mu-GDP's exact delta (:func:`gaussian_delta`), the conversion of a composed RDP curve
(:func:`rdp_to_epsilon`), and the warning for an unproven row's number stated bare (:func:`warn_if_unproven`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np

from lastiter_plugins import conversion, evaluation, profiles, registry, summary
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, Update
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.evaluation import EpsilonResult, warn_if_unproven
from lastiter_plugins.overflow import DEFAULT_OVERFLOW, overflow_probability, padded_batch_size
from lastiter_plugins.registry import BEST, DOCS, BoundSpec, Kind, Protects
from lastiter_plugins.validation import validate_delta, validate_epsilon, validate_orders

__all__ = [
    "DEFAULT_OVERFLOW",
    "DOCS",
    "LAST_ITERATE",
    "Account",
    "Declaration",
    "Departure",
    "HostNumber",
    "RowLeft",
    "account",
    "answer",
    "apply_departures",
    "delta_of",
    "gaussian_delta",
    "gaussian_mus",
    "host_numbers",
    "overflow_probability",
    "padded_batch_size",
    "published_note",
    "rdp_to_epsilon",
    "refusal",
    "rows",
    "rows_needing",
    "rows_removed",
    "warn_if_unproven",
]

#: ``Declaration.require``: refuse when no last-iterate row is left (rather than fall back to composition).
LAST_ITERATE = "last_iterate"

#: The pipeline fields a departure may change, each to the one value that drops a declaration or a
#: precondition (a departure can only say that less holds than declared, never more).
_WEAKER: Mapping[str, Any] = {
    "update": Update.ANY,
    "learning_rate": None,
    "gradient_norms_within_clip": False,
    "clipped_loss_convex_smooth": False,
    "strong_convexity": 0.0,
    "diameter": None,
    "smoothness": None,
    "order_secret": False,
}
_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainingConfig))


@dataclasses.dataclass(frozen=True)
class Declaration:
    """What the user registered besides the pipeline.

    Attributes:
      bound: a bound id, or ``best`` (the smallest epsilon over the rows whose preconditions held).
      published_only: ``best`` over rows whose proof is a published theorem for the run.
      require: ``"last_iterate"``: refuse when no row certifying the final model only is left among ``best``'s
        candidates for the pipeline that ran, instead of falling back to the every-iterate (composition) rows
        alone; while one is left, ``best`` is over every row (an every-iterate row winning protects the final
        model too). None: never refuse for this.
      orders: Renyi orders (None: the library's grid).
    """

    bound: str = BEST
    published_only: bool = False
    require: Literal["last_iterate"] | None = None
    orders: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.bound not in registry.BOUND_IDS:
            raise ValueError(f"bound must be one of {', '.join(registry.BOUND_IDS)}. Found {self.bound!r}.")
        if self.require not in (None, LAST_ITERATE):
            raise ValueError(f"require must be None or {LAST_ITERATE!r}. Found {self.require!r}.")
        if not isinstance(self.published_only, bool):
            raise ValueError(f"published_only must be True or False. Found {self.published_only!r}.")


@dataclasses.dataclass(frozen=True)
class Departure:
    """A fact observed from ``step`` on that leaves the declared pipeline.

    Attributes:
      step: the first optimizer step it could have affected (1-based).
      fact: what was observed, in words ("the optimizer is torch.optim.Adam").
      changes: the pipeline fields it weakens, each to its weak value: ``update="any"``,
        ``learning_rate=None``, ``gradient_norms_within_clip=False``, ``clipped_loss_convex_smooth=False``,
        ``strong_convexity=0.0``, ``diameter=None``, ``smoothness=None``, ``order_secret=False`` (the batches
        are public: only the rows proven for every fixed batch sequence stay).
    """

    step: int
    fact: str
    changes: Mapping[str, Any]

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise ValueError(f"step must be an integer >= 1. Found {self.step!r}.")
        if not self.changes:
            raise ValueError(f"a departure must change the pipeline. Found none for {self.fact!r}.")
        for key, value in self.changes.items():
            if key not in _WEAKER:
                raise ValueError(f"a departure may change only {', '.join(_WEAKER)}. Found {key!r}.")
            weak = _WEAKER[key]
            if not (value is weak or value == weak or (key == "update" and Update.parse(value) is Update.ANY)):
                raise ValueError(f"a departure may set {key} only to {weak!r}. Found {value!r}.")
        object.__setattr__(self, "changes", dict(self.changes))


def apply_departures(
    config: TrainingConfig, assumptions: LossAssumptions, departures: Iterable[Departure]
) -> tuple[TrainingConfig, LossAssumptions]:
    """The pipeline that ran: the declared one with every departure's weakening applied."""
    training: dict[str, Any] = {}
    assumed: dict[str, Any] = {}
    for departure in departures:
        for key, value in departure.changes.items():
            (training if key in _CONFIG_FIELDS else assumed)[key] = value
    if assumed.get("strong_convexity") == 0.0 and "l2_outside_clip" not in assumed:
        assumed["l2_outside_clip"] = False  # nothing left to be outside the clip
    return config.replace(**training), dataclasses.replace(assumptions, **assumed)


@dataclasses.dataclass(frozen=True)
class RowLeft:
    """A row that applied to the declared pipeline and left ``best`` because of a departure."""

    bound: str
    step: int
    fact: str
    condition: str  # the first precondition the departure broke, in one line

    def __str__(self) -> str:
        return f"{self.bound} left at step {self.step}: {self.fact} ({self.condition})"


@dataclasses.dataclass(frozen=True)
class Account:
    """The number for the pipeline that ran, and what left ``best`` on the way."""

    result: EpsilonResult
    config: TrainingConfig
    assumptions: LossAssumptions
    rows_left: tuple[RowLeft, ...]


def _candidates(config: TrainingConfig, assumptions: LossAssumptions, published_only: bool) -> set[str]:
    return {spec.id for spec in evaluation.best_candidates(config, assumptions, published_only)}


def _rows_left(
    config: TrainingConfig, assumptions: LossAssumptions, departures: tuple[Departure, ...], published_only: bool
) -> tuple[RowLeft, ...]:
    """Each row of ``best``'s candidates for the declared pipeline that a departure removed, with the first
    departure (in step order) after which it no longer applies."""
    left: list[RowLeft] = []
    remaining = _candidates(config, assumptions, published_only)
    applied: list[Departure] = []
    for departure in sorted(departures, key=lambda d: d.step):
        applied.append(departure)
        cfg, a = apply_departures(config, assumptions, applied)
        now = _candidates(cfg, a, published_only)
        for bid in sorted(remaining - now, key=list(registry.BOUNDS).index):
            unmet = registry.applicability(registry.BOUNDS[bid], cfg, a).unmet
            left.append(RowLeft(bid, departure.step, departure.fact, unmet[0].short if unmet else "no longer applies"))
        remaining &= now
    return tuple(left)


def rows_removed(
    changes: Mapping[str, Any], config: TrainingConfig, assumptions: LossAssumptions, published_only: bool = False
) -> tuple[str, ...]:
    """The rows of ``best``'s candidates for the pipeline that a departure with ``changes`` would remove: the rows
    a host's check gates (``changes`` as :class:`Departure` takes them)."""
    departure = Departure(step=1, fact="", changes=changes)
    return tuple(r.bound for r in _rows_left(config, assumptions, (departure,), published_only))


def account(
    declaration: Declaration,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    departures: Iterable[Departure] = (),
) -> Account:
    """The epsilon at ``delta`` of the pipeline that ran: ``config`` and ``assumptions`` as declared and
    observed at the start, weakened by every departure.

    Raises:
      NotApplicableError: no proven row is left (the message names the departures), the named bound does
        not apply to the pipeline that ran, or ``require="last_iterate"`` and no last-iterate row is left.
    """
    delta = validate_delta(delta)
    departures = tuple(departures)
    ran_config, ran_assumptions = apply_departures(config, assumptions, departures)
    rows_left = _rows_left(config, assumptions, departures, declaration.published_only)
    orders = None if declaration.orders is None else validate_orders(np.array(declaration.orders, dtype=float))
    try:
        result = evaluation.epsilon_result(
            declaration.bound, ran_config, ran_assumptions, delta, orders, published_only=declaration.published_only
        )
    except NotApplicableError as exc:
        raise NotApplicableError(f"{exc}{_because(departures)}") from None
    if declaration.require == LAST_ITERATE and not _last_iterate_left(
        evaluation.best_candidates(ran_config, ran_assumptions, declaration.published_only)
    ):  # a last-iterate row is left: best over every row (composition winning protects the final model too)
        raise NotApplicableError(
            f"a bound certifying the final model only must be left (require='last_iterate'). Found only "
            f"every-iterate rows: best is {result.epsilon:.4g} via {result.winner}{_because(departures)}"
        )
    return Account(result, ran_config, ran_assumptions, rows_left)


def refusal(
    declaration: Declaration,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    departures: Iterable[Departure] = (),
) -> str | None:
    """Why :func:`account` would refuse the pipeline that ran, from the preconditions alone (no epsilon is
    computed: cheap enough to ask at the step a departure is observed, to refuse there): the named bound's
    first broken precondition, no row left for ``best``, or no last-iterate row left under
    ``require="last_iterate"``. None while the declaration holds."""
    departures = tuple(departures)
    ran_config, ran_assumptions = apply_departures(config, assumptions, departures)
    if declaration.bound != BEST:
        unmet = registry.applicability(registry.BOUNDS[declaration.bound], ran_config, ran_assumptions).unmet
        if unmet:
            return f"{declaration.bound} must apply, as registered: {unmet[0].short}{_because(departures)}"
        return None
    candidates = evaluation.best_candidates(ran_config, ran_assumptions, declaration.published_only)
    if not candidates:
        return f"best must have a proven row left. Found none for the pipeline that ran{_because(departures)}"
    if declaration.require == LAST_ITERATE and not _last_iterate_left(candidates):
        rows = ", ".join(s.id for s in candidates)
        return (
            f"a bound certifying the final model only must be left (require='last_iterate'). Found only "
            f"every-iterate rows ({rows}){_because(departures)}"
        )
    return None


def published_note(
    result: EpsilonResult, config: TrainingConfig, assumptions: LossAssumptions, orders: Iterable[float] | None = None
) -> str:
    """What a report prints under a ``best`` whose proof is this library's derivation (the number over
    published theorems only, or that none applies); empty when it rests on a published theorem."""
    grid = None if orders is None else validate_orders(np.array(tuple(orders), dtype=float))
    return evaluation.published_note(result, config, assumptions, grid)


def _last_iterate_left(candidates: Iterable[BoundSpec]) -> bool:
    """Whether a row certifying the final model only is among ``best``'s candidates (``require``'s test)."""
    return any(spec.protects is Protects.FINAL_MODEL for spec in candidates)


def _because(departures: tuple[Departure, ...]) -> str:
    if not departures:
        return "."
    facts = "; ".join(f"step {d.step}: {d.fact}" for d in departures)
    return f" (the run left the declared pipeline: {facts})."


def rows_needing(field: str, config: TrainingConfig, assumptions: LossAssumptions) -> tuple[str, ...]:
    """The proven rows covering the pipeline's sampling and relation whose every unmet precondition is about
    ``field`` (a keyword parameter left out, e.g. ``learning_rate``): what a report lists after "give
    learning_rate= for ...". Given, the field must still meet each row's limits (a step size, say)."""
    out = []
    for bid, spec in registry.BOUNDS.items():
        if spec.relation_for(config.sampling) is not config.relation or not spec.proof.proven:
            continue
        unmet = registry.applicability(spec, config, assumptions).unmet
        if unmet and all(u.required.startswith(field) for u in unmet):
            out.append(bid)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class HostNumber:
    """What a host library's own accountant reports for the run (display only, never counted).

    Attributes:
      id: the host accountant (``opacus-prv``, ``opacus-rdp``, ...).
      label: its name as users know it.
      epsilon: its epsilon at the delta asked for (None when it could not be computed).
      valid: whether its assumptions (its sampling model, its being a bound) hold for the run.
      why_not: why not, in one line (empty when valid).
      relation: its neighbouring relation.
      covers: the sampling schemes its number assumes.
    """

    id: str
    label: str
    epsilon: float | None
    valid: bool
    why_not: str
    relation: Relation
    covers: tuple[Sampling, ...]

    def __str__(self) -> str:
        eps = "-" if self.epsilon is None else f"{self.epsilon:.4g}"
        mark = "" if self.valid else f" NOT VALID: {self.why_not}"
        return f"{self.label}: epsilon = {eps} ({self.relation.value}, every iterate){mark}"


def host_numbers(config: TrainingConfig, delta: float, host: str) -> tuple[HostNumber, ...]:
    """What ``host`` (``"opacus"``, ``"dp-accounting"``, ``"tf_privacy"`` or ``"jax-privacy"``: a key of
    ``compare.hosts.DISTRIBUTIONS``) would report for the run as its users call it, in the order compare shows them.
    Empty when the host is not installed."""
    from lastiter_plugins.compare.hosts import HOST_ACCOUNTANTS, host_row  # display only: loaded when asked

    out = []
    for acc in HOST_ACCOUNTANTS:
        if acc.host != host:
            continue
        row = host_row(dataclasses.replace(acc, only_when_invalid=False), config, delta, None)
        if row is None:
            continue
        out.append(
            HostNumber(
                id=acc.id,
                label=acc.label,
                epsilon=row.epsilon,
                valid=row.valid,
                why_not=row.first_unmet,
                relation=acc.relation,
                covers=acc.covers,
            )
        )
    return tuple(out)


def answer(
    result: EpsilonResult,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    host: str,
    orders: Iterable[float] | None = None,
) -> summary.Answer:
    """The answer an adapter's report or statement starts with (:func:`lastiter_plugins.summary.answer_lines`):
    ``result``, what published theorems alone give beside a winner derived here, and ``host``'s own numbers
    for the run (:func:`host_numbers`), NOT VALID where their assumptions fail."""
    grid = None if orders is None else validate_orders(np.array(tuple(orders), dtype=float))
    published = evaluation.published_best(result, config, assumptions, grid)
    hosts = tuple(
        summary.HostNumber(h.id, h.epsilon, h.relation.value, h.valid, h.why_not)
        for h in host_numbers(config, result.delta, host)
    )
    return summary.Answer.of(result, published=published, published_checked=True, hosts=hosts)


# ---------------------------------------------------------------- composing a run with the host's mechanisms


def rows(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, published_only: bool = False
) -> tuple[BoundSpec, ...]:
    """The rows ``bound``'s number for the pipeline comes from, in table order: ``best``: its candidates (the
    one candidate set, possibly empty); a bound id: that row, which must apply (``published_only``: with a
    published proof for the pipeline). Each row says what it protects (``protects``), its kind and its proof.

    Raises:
      NotApplicableError: the named bound does not apply (the message names the condition).
    """
    if bound == BEST:
        return evaluation.best_candidates(config, assumptions, published_only)
    evaluation.require_applicable(bound, config, assumptions, published_only)
    return (registry.get_spec(bound),)


def delta_of(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    epsilon: float,
    orders: np.ndarray | None = None,
    published_only: bool = False,
) -> tuple[float, float | None]:
    """(delta, order) at ``epsilon`` >= 0 of ``bound`` (an id, or ``best``: the smallest delta over its
    candidates), each row converted as :func:`lastiter_plugins.epsilon` converts it (a privacy profile exactly,
    order None; ``orders`` None: the library's grid). The counterpart of the public ``epsilon``.

    Raises:
      NotApplicableError: the named bound does not apply, or (``best``) none does.
      ValueError: ``epsilon`` is not a number >= 0, or invalid ``orders``.
    """
    epsilon = validate_epsilon(epsilon)
    grid = None if orders is None else validate_orders(orders)
    return evaluation.delta_of(bound, config, assumptions, epsilon, grid, published_only)


def gaussian_mus(spec: BoundSpec, config: TrainingConfig, assumptions: LossAssumptions) -> tuple[float, ...]:
    r"""The mus of a GDP row's privacy profile for the pipeline, one per component of its Gaussian mixture
    (:math:`\delta(\varepsilon) = \sum_j w_j \delta_{\mu_j}(\varepsilon)`; one mu: the run is mu-GDP, Dong, Roth
    & Su 2019, arXiv 1905.02383); empty where the profile is not such a mixture (the Poisson rows' dominating
    pairs, a row reporting the smaller of two profiles: no mu describes the run). The row must apply
    (:func:`rows`).

    Raises:
      ValueError: the row is not a GDP row (it has no Gaussian privacy profile).
    """
    if spec.kind is not Kind.GDP or spec.profile is None:
        raise ValueError(
            f"spec must be a GDP row (a Gaussian privacy profile). Found {spec.id}, a {spec.kind.value} row."
        )
    if config.max_batch_size is not None:  # cut batches: (epsilon, delta) only (fixed-length-batches.md, part 5)
        return ()
    profile = spec.profile(config, assumptions)
    if not isinstance(profile, profiles.GaussianMixtureProfile):
        return ()
    return tuple(float(mu) for mu in profile.mus)


def gaussian_delta(mu: float, epsilon: float) -> float:
    r"""The exact delta of mu-GDP at ``epsilon``:
    :math:`\Phi(-\varepsilon/\mu + \mu/2) - e^\varepsilon\Phi(-\varepsilon/\mu - \mu/2)` (Dong, Roth & Su 2019,
    arXiv 1905.02383, Cor. 2.13; 0 where mu = 0 or epsilon = inf)."""
    return float(profiles.gdp_delta(mu, epsilon))


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """(epsilon, order) at ``delta`` in (0, 1) of an RDP curve (nats) on ``orders``, such as a host's sum of
    curves: the library's one conversion of a curve on a grid (dp-accounting's ``compute_epsilon``, improved
    conversion, at the best of the orders; warns with ``OrderGridWarning`` when the optimum is at an edge of
    the grid)."""
    return conversion.rdp_to_epsilon(orders, rdp, validate_delta(delta))
