r"""The names of version 0.2 that overlapped another public name, kept until 1.0.

Each is reached through ``lastiter_plugins.NAME``; every access warns with a ``DeprecationWarning`` naming
its replacement (:func:`warned`, with the message of its ``@deprecated`` mark; ``category=None``: the mark is
for type checkers, the warning is given once, on access).
docs/api.md lists them with their replacements; CHANGELOG.md says when they go (1.0).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from typing_extensions import deprecated

from lastiter_plugins import api, evaluation
from lastiter_plugins.advice import Suggestion, advise
from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.evaluation import BoundEvaluation, EpsilonResult
from lastiter_plugins.validation import validate_orders


@deprecated(
    "will be removed in 1.0; use lastiter_plugins.epsilon(bound, delta, config=..., assumptions=...)", category=None
)
def compute_epsilon(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
) -> EpsilonResult:
    """Deprecated: ``epsilon(bound, delta, orders, config=config, assumptions=assumptions)``."""
    return api.epsilon(
        bound,
        delta,
        orders,
        lower_bound=lower_bound,
        published_only=published_only,
        config=config,
        assumptions=assumptions,
    )


@deprecated(
    "will be removed in 1.0; use lastiter_plugins.rdp(bound, orders, config=..., assumptions=...)", category=None
)
def compute_rdp(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    published_only: bool = False,
) -> np.ndarray:
    """Deprecated: ``rdp(bound, orders, config=config, assumptions=assumptions)``."""
    grid = validate_orders(orders)  # None: the library's grid
    return api.rdp(bound, grid, published_only=published_only, config=config, assumptions=assumptions)


@deprecated(
    "will be removed in 1.0; use lastiter_plugins.applicable_bounds(delta=..., config=..., assumptions=...)",
    category=None,
)
def evaluate_all(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float | None = None,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    unproven: Iterable[str] = (),
) -> dict[str, BoundEvaluation]:
    """Deprecated: ``applicable_bounds(config=config, assumptions=assumptions, delta=delta)`` (which adds
    the ``best`` row); the rows of the table only, as in 0.2."""
    table = api.applicable_bounds(delta=delta, orders=orders, unproven=unproven, config=config, assumptions=assumptions)
    del table[evaluation.BEST]
    return table


@deprecated("will be removed in 1.0; use lastiter_plugins.advise(delta, config=..., assumptions=...)", category=None)
def advise_config(
    delta: float, config: TrainingConfig, assumptions: LossAssumptions, *, top: int | None = None
) -> tuple[Suggestion, ...]:
    """Deprecated: ``advise(delta, top=top, config=config, assumptions=assumptions)``."""
    return advise(delta, top=top, config=config, assumptions=assumptions)


def warned(name: str) -> Any:
    """The deprecated ``name``, with its warning (to the code that reached it: ``lastiter_plugins.NAME``)."""
    function = globals()[name]
    warnings.warn(
        f"lastiter_plugins.{name} is deprecated and {function.__deprecated__}", DeprecationWarning, stacklevel=3
    )
    return function
