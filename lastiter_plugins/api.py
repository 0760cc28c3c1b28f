r"""The public keyword API: ``rdp``, ``epsilon``, ``calibrate_noise``,
``applicable_bounds``.

The keyword functions build a validated :class:`TrainingConfig` and
:class:`LossAssumptions` and call the object-level functions
(:func:`compute_rdp`, :func:`compute_epsilon`) that the adapters use; both
levels return the same kinds of values (an RDP array; an :class:`EpsilonResult`).
Everything is computed by the one evaluation path, :mod:`lastiter_plugins.evaluation`.
"""

# No `from __future__ import annotations` here: TypedDict reads Required[...] from evaluated annotations.
from collections.abc import Sequence

import numpy as np
from typing_extensions import Required, TypedDict, Unpack

from lastiter_plugins import evaluation, registry
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, refuse_renamed
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.evaluation import BoundEvaluation, EpsilonResult, evaluate_all
from lastiter_plugins.registry import Kind, Protects
from lastiter_plugins.validation import validate_delta, validate_orders


class Parameters(TypedDict, total=False):
    r"""The keyword parameters of the public functions: one training run and the declared loss assumptions.

    ``dataset_size``, ``batch_size``, ``sampling`` and exactly one of ``steps`` and ``epochs`` are
    required, and ``noise_multiplier`` too except for :func:`applicable_bounds` and
    :func:`~lastiter_plugins.calibrate_noise`. :class:`TrainingConfig` and :class:`LossAssumptions`
    document each field; docs/bounds.md maps the names to the papers' symbols.
    """

    dataset_size: Required[int]
    batch_size: Required[int]
    noise_multiplier: float
    learning_rate: float | None
    clip_norm: float
    sampling: Required[Sampling | str]
    relation: Relation | str
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
__all__ = [
    "PARAMETERS",
    "BoundEvaluation",
    "EpsilonResult",
    "NotApplicableError",
    "Parameters",
    "applicable_bounds",
    "build",
    "compute_epsilon",
    "compute_rdp",
    "epsilon",
    "evaluate_all",
    "rdp",
]

#: The names of the keyword parameters, in the order of :class:`Parameters`.
PARAMETERS: tuple[str, ...] = tuple(Parameters.__annotations__)


def build(**params: Unpack[Parameters]) -> tuple[TrainingConfig, LossAssumptions]:
    """Validated (TrainingConfig, LossAssumptions) from the keyword parameters.

    Give exactly one of ``steps`` and ``epochs`` (E epochs = E * ceil(n/b) steps).
    """
    refuse_renamed(params)
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; known parameters: {', '.join(PARAMETERS)}.")
    missing = [k for k in ("dataset_size", "batch_size", "noise_multiplier", "sampling") if params.get(k) is None]
    if missing:
        raise ValueError(f"{missing[0]} is required. Found none.")
    steps, epochs = params.get("steps"), params.get("epochs")
    if (steps is None) == (epochs is None):
        raise ValueError(f"exactly one of steps and epochs must be given. Found steps={steps!r}, epochs={epochs!r}.")
    training = {k: params[k] for k in _TRAINING_KEYS if params.get(k) is not None}
    assumptions = LossAssumptions(**{k: params[k] for k in _ASSUMPTION_KEYS if k in params})
    if steps is not None:
        config = TrainingConfig(steps=steps, **training)
    else:
        config = TrainingConfig.from_epochs(epochs=epochs, **training)
    return config, assumptions


def compute_rdp(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, orders=None, *, published_only: bool = False
) -> np.ndarray:
    """RDP (nats) of ``bound`` (an id, or ``best``) at each order for a validated configuration.

    ``published_only``: ``best`` over the rows whose proof is a published theorem for this pipeline
    (a named row must be one).

    Raises:
      NotApplicableError: a precondition of the bound fails.
      ValueError: invalid orders.
    """
    return evaluation.rdp_of(bound, config, assumptions, validate_orders(orders), published_only)


def compute_epsilon(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders=None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
) -> EpsilonResult:
    """(epsilon, delta) of ``bound`` (an id, or ``best``) for a validated configuration, labelled.

    Returns the same kind of value as :func:`epsilon`: an :class:`EpsilonResult` (with its
    ``lower_bound`` when ``lower_bound`` is True).

    Raises:
      NotApplicableError: a precondition of the bound fails.
      ValueError: an invalid delta or invalid orders.
    """
    delta = validate_delta(delta)
    grid = None if orders is None else validate_orders(orders)  # None: the default grid, converted losslessly
    return evaluation.epsilon_result(
        bound, config, assumptions, delta, grid, lower_bound=lower_bound, published_only=published_only
    )


def rdp(
    bound: str, orders: Sequence[float] | np.ndarray, *, published_only: bool = False, **params: Unpack[Parameters]
) -> np.ndarray:
    """Renyi-DP epsilon (nats) of ``bound`` at each order.

    Args:
      bound: a bound id (see ``BOUND_IDS``), ``composition`` or ``best``.
      orders: Renyi orders, each > 1.
      **params: the training configuration and loss assumptions (:class:`Parameters`).

    Raises:
      NotApplicableError: a precondition of the bound fails (the message names it
        and the theorem).
      ValueError: an invalid value.
    """
    config, assumptions = build(**params)
    return compute_rdp(bound, config, assumptions, orders, published_only=published_only)


def epsilon(
    bound: str,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
    **params: Unpack[Parameters],
) -> EpsilonResult:
    """(epsilon, delta) of ``bound`` at ``delta`` for the pipeline described by ``params``.

    Returns an :class:`EpsilonResult`: epsilon, the optimal order, the neighbouring
    relation, the winning bound, its proof status and what it protects (the final
    model only; ``composition``: every iterate). It unpacks as ``(epsilon, order)``.
    With ``lower_bound=True`` it also carries ``lower_bound``: the exact epsilon of an
    instance meeting every declaration (or None, and ``lower_bound_note`` says why), so that
    the worst case over the models meeting the declarations lies in ``[lower_bound, epsilon]``
    (docs/derivations/lower-end.md#lower-end; up to about a second more). Its ``provenance`` says whether the
    winner's proof is a published theorem or this library's derivation; ``published_only=True``
    restricts ``best`` to published theorems (a named bound must be one). Raises like :func:`rdp`.
    """
    config, assumptions = build(**params)
    return compute_epsilon(
        bound, config, assumptions, delta, orders, lower_bound=lower_bound, published_only=published_only
    )


def applicable_bounds(*, published_only: bool = False, **params: Unpack[Parameters]) -> dict[str, BoundEvaluation]:
    """For every bound id (``best`` included): applies or not, and why, with its
    relation, proof status, provenance, what it protects and its reference.

    ``noise_multiplier`` may be omitted (no precondition depends on it). ``published_only``: ``best``
    over the rows whose proof is a published theorem for this pipeline.
    """
    params.setdefault("noise_multiplier", 1.0)
    config, assumptions = build(**params)
    out = evaluation.evaluate_all(config, assumptions)
    usable = [bid for bid, e in out.items() if evaluation.counts_for_best(e, config.relation, published_only)]
    out[registry.BEST] = BoundEvaluation(
        bound=registry.BEST,
        title="the smallest epsilon over the proven bounds valid for the pipeline",
        applies=bool(usable),
        reasons=() if usable else ("no proven bound applies to this pipeline with the declared relation.",),
        relation=config.relation,
        proof=registry.PROVEN,
        protects=Protects.FINAL_MODEL,
        kind=Kind.RDP,
        reference="minimum over " + (", ".join(usable) or "nothing") + f" ({registry.DOCS})",
        assumptions="those of the bound that wins",
        covers=(config.sampling,),
    )
    return out
