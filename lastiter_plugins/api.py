r"""The public functions of one pipeline: ``epsilon``, ``rdp``, ``applicable_bounds`` (and ``build``;
``calibrate_noise`` and ``advise`` live in :mod:`~lastiter_plugins.calibration` and
:mod:`~lastiter_plugins.advice` and take the pipeline the same way).

Each takes the pipeline either as keyword parameters (:class:`Parameters`, validated by :func:`build`) or
as the validated objects ``config=`` (a :class:`TrainingConfig`) and ``assumptions=`` (a
:class:`LossAssumptions`; default: nothing declared), the objects the adapters hold
(:func:`pipeline`). They are thin wrappers over the one evaluation path,
:mod:`lastiter_plugins.evaluation`. docs/api.md lists every public name.
"""

# No `from __future__ import annotations` here: TypedDict reads Required[...] from evaluated annotations.
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy as np
from typing_extensions import Required, TypedDict, Unpack, overload

from lastiter_plugins import evaluation, registry
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, Update, refuse_renamed
from lastiter_plugins.evaluation import BoundEvaluation, EpsilonResult
from lastiter_plugins.feasibility import warn_if_impossible
from lastiter_plugins.registry import Kind, Protects
from lastiter_plugins.validation import validate_delta, validate_orders


class Parameters(TypedDict, total=False):
    r"""The keyword parameters of the public functions: one training run and the declared loss assumptions.

    ``dataset_size``, ``batch_size``, ``sampling`` and exactly one of ``steps`` and ``epochs`` are
    required, and ``noise_multiplier`` too except for :func:`applicable_bounds` without ``delta`` and
    :func:`~lastiter_plugins.calibrate_noise`. :class:`TrainingConfig` and :class:`LossAssumptions`
    document each field; docs/bounds.md maps the names to the papers' symbols. ``relation`` left out is
    the sampling scheme's default (:data:`lastiter_plugins.config.DEFAULT_RELATION`).
    """

    dataset_size: Required[int]
    batch_size: Required[int]
    noise_multiplier: float
    learning_rate: float | None
    clip_norm: float
    sampling: Required[Sampling | str]
    relation: Relation | str
    update: Update | str
    allocations_per_epoch: int
    order_secret: bool
    max_batch_size: int
    steps: int
    epochs: int
    smoothness: float | None
    weak_convexity: float
    strong_convexity: float
    diameter: float | None
    gradient_norms_within_clip: bool
    clipped_loss_convex_smooth: bool
    l2_outside_clip: bool


_TRAINING_KEYS = (
    "dataset_size",
    "batch_size",
    "noise_multiplier",
    "learning_rate",
    "clip_norm",
    "sampling",
    "relation",
    "update",
    "allocations_per_epoch",
    "order_secret",
    "max_batch_size",
)
_ASSUMPTION_KEYS = (
    "smoothness",
    "weak_convexity",
    "strong_convexity",
    "diameter",
    "gradient_norms_within_clip",
    "clipped_loss_convex_smooth",
    "l2_outside_clip",
)
__all__ = ["PARAMETERS", "Parameters", "applicable_bounds", "build", "epsilon", "pipeline", "rdp"]

#: The names of the keyword parameters, in the order of :class:`Parameters`.
PARAMETERS: tuple[str, ...] = tuple(Parameters.__annotations__)


def build(**params: Unpack[Parameters]) -> tuple[TrainingConfig, LossAssumptions]:
    """Validated (TrainingConfig, LossAssumptions) from the keyword parameters.

    Give exactly one of ``steps`` and ``epochs`` (E epochs = E * ceil(n/b) steps; E * ceil(n k/b) under random
    allocation with k = ``allocations_per_epoch``).
    """
    refuse_renamed(params)
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; known parameters: {', '.join(PARAMETERS)}.")
    missing = [k for k in ("dataset_size", "batch_size", "noise_multiplier", "sampling") if params.get(k) is None]
    if missing:
        raise ValueError(f"{missing[0]} is required. Found none.")
    steps, epochs = params.get("steps"), params.get("epochs")
    given: dict[str, Any] = dict(params)
    training = {k: given[k] for k in _TRAINING_KEYS if given.get(k) is not None}
    assumptions = LossAssumptions(**{k: given[k] for k in _ASSUMPTION_KEYS if k in given})
    if steps is not None and epochs is None:
        return TrainingConfig(steps=steps, **training), assumptions
    if epochs is not None and steps is None:
        return TrainingConfig.from_epochs(epochs=epochs, **training), assumptions
    raise ValueError(f"exactly one of steps and epochs must be given. Found steps={steps!r}, epochs={epochs!r}.")


def pipeline(
    config: TrainingConfig | None, assumptions: LossAssumptions | None, params: Mapping[str, Any]
) -> tuple[TrainingConfig, LossAssumptions]:
    """The pipeline a public function was given: ``config`` (and ``assumptions``, default: nothing
    declared) as objects, or the keyword ``params`` (:func:`build`); never both.

    Warns:
      ImpossibleDeclarationWarning: no loss meets the declarations
        (:func:`lastiter_plugins.feasibility.impossible_declaration`); the numbers are then about a model that
        cannot exist.

    Raises:
      ValueError: both forms, neither, ``assumptions`` without ``config``, or an object of another type.
    """
    config, assumptions = _objects(config, assumptions, params)
    warn_if_impossible(config, assumptions, stacklevel=4)  # the caller of the public function
    return config, assumptions


def _objects(
    config: TrainingConfig | None, assumptions: LossAssumptions | None, params: Mapping[str, Any]
) -> tuple[TrainingConfig, LossAssumptions]:
    if config is None:
        if assumptions is not None:
            raise ValueError(
                "assumptions= needs config= (a TrainingConfig); or give the pipeline as keyword parameters."
            )
        return build(**cast(Parameters, params))
    if params:
        raise ValueError(
            "give the pipeline either as config= and assumptions= or as keyword parameters, not both. "
            f"Found config= and {sorted(params)[0]}=."
        )
    if not isinstance(config, TrainingConfig):
        raise ValueError(f"config must be a TrainingConfig. Found {type(config).__name__}.")
    if assumptions is None:
        assumptions = LossAssumptions()
    if not isinstance(assumptions, LossAssumptions):
        raise ValueError(f"assumptions must be a LossAssumptions. Found {type(assumptions).__name__}.")
    return config, assumptions


@overload
def rdp(
    bound: str, orders: Sequence[float] | np.ndarray, *, published_only: bool = False, **params: Unpack[Parameters]
) -> np.ndarray: ...
@overload
def rdp(
    bound: str,
    orders: Sequence[float] | np.ndarray,
    *,
    published_only: bool = False,
    config: TrainingConfig,
    assumptions: LossAssumptions | None = None,
) -> np.ndarray: ...
def rdp(
    bound: str,
    orders: Sequence[float] | np.ndarray,
    *,
    published_only: bool = False,
    config: TrainingConfig | None = None,
    assumptions: LossAssumptions | None = None,
    **params: Any,
) -> np.ndarray:
    """Renyi-DP epsilon (nats) of ``bound`` at each order.

    Args:
      bound: a bound id (see ``BOUND_IDS``), ``composition`` or ``best``.
      orders: Renyi orders, each > 1.
      published_only: ``best`` over the rows whose proof is a published theorem for this pipeline (a
        named row must be one).
      config, assumptions: the pipeline as validated objects (or give ``params``; :func:`pipeline`).
      **params: the training configuration and loss assumptions (:class:`Parameters`).

    Raises:
      NotApplicableError: a precondition of the bound fails (the message names it
        and the theorem).
      ValueError: an invalid value.

    Warns:
      UnprovenBoundWarning: ``bound`` is an unproven row (its curve is not a guarantee; an array carries
        no mark).
    """
    config, assumptions = pipeline(config, assumptions, params)
    curve = evaluation.rdp_of(bound, config, assumptions, validate_orders(orders), published_only)
    evaluation.warn_if_unproven(bound)
    return curve


@overload
def epsilon(
    bound: str,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
    **params: Unpack[Parameters],
) -> EpsilonResult: ...
@overload
def epsilon(
    bound: str,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
    config: TrainingConfig,
    assumptions: LossAssumptions | None = None,
) -> EpsilonResult: ...
def epsilon(
    bound: str,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
    config: TrainingConfig | None = None,
    assumptions: LossAssumptions | None = None,
    **params: Any,
) -> EpsilonResult:
    """(epsilon, delta) of ``bound`` at ``delta`` for the pipeline (``params``, or ``config`` and
    ``assumptions``: :func:`pipeline`).

    Returns an :class:`EpsilonResult`: epsilon, the optimal order, the neighbouring
    relation, the winning bound, its proof status and what it protects (the final
    model only; ``composition``: every iterate).
    With ``lower_bound=True`` it also carries ``lower_bound``: the exact epsilon of an
    instance meeting every declaration (or None, and ``lower_bound_note`` says why), so that
    the worst case over the models meeting the declarations lies in ``[lower_bound, epsilon]``
    (docs/derivations/lower-end.md#lower-end; up to about a second more). Its ``provenance`` says whether the
    winner's proof is a published theorem or this library's derivation; ``published_only=True``
    restricts ``best`` to published theorems (a named bound must be one). ``orders``: None is the
    library's grid with its lossless conversion. Raises like :func:`rdp`.
    """
    config, assumptions = pipeline(config, assumptions, params)
    delta = validate_delta(delta)
    grid = None if orders is None else validate_orders(orders)  # None: the default grid, converted losslessly
    return evaluation.epsilon_result(
        bound, config, assumptions, delta, grid, lower_bound=lower_bound, published_only=published_only
    )


@overload
def applicable_bounds(
    *,
    delta: float | None = None,
    orders: Sequence[float] | np.ndarray | None = None,
    unproven: Iterable[str] = (),
    published_only: bool = False,
    **params: Unpack[Parameters],
) -> dict[str, BoundEvaluation]: ...
@overload
def applicable_bounds(
    *,
    delta: float | None = None,
    orders: Sequence[float] | np.ndarray | None = None,
    unproven: Iterable[str] = (),
    published_only: bool = False,
    config: TrainingConfig,
    assumptions: LossAssumptions | None = None,
) -> dict[str, BoundEvaluation]: ...
def applicable_bounds(
    *,
    delta: float | None = None,
    orders: Sequence[float] | np.ndarray | None = None,
    unproven: Iterable[str] = (),
    published_only: bool = False,
    config: TrainingConfig | None = None,
    assumptions: LossAssumptions | None = None,
    **params: Any,
) -> dict[str, BoundEvaluation]:
    """For every bound id, in table order, then ``best``: applies or not, and why, with its relation,
    proof status, provenance, what it protects and its reference (:class:`BoundEvaluation`).

    With ``delta``, every row that applies also carries its numbers (its RDP curve on ``orders`` or its
    privacy profile, and its :class:`EpsilonResult`), and ``best`` its result (the smallest epsilon over
    its candidates); the rows of unproven bounds only when named in ``unproven``.

    The pipeline: ``params`` (``noise_multiplier`` may be omitted when ``delta`` is None: no
    precondition depends on it), or ``config`` and ``assumptions`` (:func:`pipeline`).
    ``published_only``: ``best`` over the rows whose proof is a published theorem for this pipeline.
    """
    if config is None and delta is None:
        params.setdefault("noise_multiplier", 1.0)
    config, assumptions = pipeline(config, assumptions, params)
    out = evaluation.evaluate_all(
        config, assumptions, delta, None if orders is None else np.asarray(orders), unproven=unproven
    )
    usable = [bid for bid, e in out.items() if evaluation.counts_for_best(e, config.relation, published_only)]
    winner = evaluation.best_of(out.values(), config.relation, published_only)
    out[registry.BEST] = BoundEvaluation(
        bound=registry.BEST,
        title="the smallest epsilon over the proven bounds valid for the pipeline",
        applies=bool(usable),
        reasons=() if usable else ("no proven bound applies to this pipeline with the declared relation.",),
        relation=config.relation,
        proof=registry.PROVEN,
        protects=Protects.FINAL_MODEL if winner is None else winner.protects,
        kind=Kind.RDP,
        reference="minimum over " + (", ".join(usable) or "nothing") + f" ({registry.DOCS})",
        assumptions="those of the bound that wins",
        covers=(config.sampling,),
        result=None if winner is None else dataclasses.replace(winner, bound=registry.BEST),
        # best's proof is its winner's: the same provenance as ``epsilon("best")`` (no winner: nothing published)
        published=winner is not None and winner.published,
        provenance="" if winner is None else winner.provenance,
    )
    return out
