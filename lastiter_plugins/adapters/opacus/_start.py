"""The model a run starts from: a fresh one, or one an earlier accountant of this library trained.

A user model carries a mark (:class:`Mark`, an attribute) naming the accountant that accounts for its
training; ``copy.deepcopy`` of the model keeps it. ``make_private`` on a model (or on the GradSampleModule an
earlier engine returned, or on a deep copy of either) that such an accountant has trained continues that
accounting when the registration (all but its name) and, at the first step, the observed optimizer facts are
identical; otherwise it is refused (docs/derivations/opacus-adapter.md#run-monitor, *The start*). Weights
copied with ``load_state_dict`` carry no mark (a stated precondition).
"""

from __future__ import annotations

import weakref
from copy import deepcopy
from typing import Any

from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._internals import unwrap
from lastiter_plugins.adapters.opacus._record import Observed

_Error = LastIterateConfigurationError

#: the attribute of a user model (unwrapped) holding its :class:`Mark`
_MARK = "_lastiter_trained_by"


class Mark:
    """The accountant that accounts for a model's training, carried by the model (held as long as the model
    lives: a copy made after the first engine was dropped still names it).

    ``copy.deepcopy`` of the model gives the copy a mark of the same accountant that remembers the steps the
    accountant had counted when the copy was made (``steps``): a copy continues that accounting only while
    the accountant has counted no step since. A pickled model loses the accountant (another process has none).
    """

    __slots__ = ("accountant", "steps")

    def __init__(self, accountant: Any = None, steps: int | None = None) -> None:
        self.accountant = accountant
        self.steps = steps

    def __deepcopy__(self, memo: dict) -> Mark:
        accountant = self.accountant
        return Mark(accountant, None if accountant is None else int(accountant.steps))

    def __reduce__(self) -> tuple:
        return (Mark, ())


def mark_of(model: Any) -> Mark | None:
    mark = model.__dict__.get(_MARK)
    return mark if isinstance(mark, Mark) else None


def _mark(model: Any, accountant: Any) -> None:
    model.__dict__[_MARK] = Mark(accountant)


class Start:
    """Per accountant: the earlier accountant whose accounting the run continues (``prior``, until the
    first step takes it over), and the model both trained."""

    def __init__(self) -> None:
        self.prior: Any = None
        self._model: Any = None  # weak reference to the model the prior accountant trained

    def bind(self, accountant: Any, module: Any) -> None:
        """At binding: find the accountant of an earlier engine that trained ``module``'s model (none: a fresh
        model), check that ``accountant`` may continue it, and mark the model as ``accountant``'s."""
        self.prior = None
        if module is None:
            return
        model = unwrap(module)
        mark = mark_of(model)
        prior = None if mark is None else mark.accountant
        if prior is None or prior is accountant or not prior.steps:
            _mark(model, accountant)
            return
        self._model = weakref.ref(model)
        copied = mark is not None and mark.steps is not None
        found = (
            f"Found a model already trained for {prior.steps} DP steps by accountant {prior.registration.name!r} "
            f"(make_private on a model, on the GradSampleModule, or on a deep copy of a model an earlier engine "
            "trained)"
        )
        if copied and mark is not None and mark.steps != prior.steps:
            raise _Error(
                f"a copy of a DP-trained model continues its accounting only if the copy is the model that accounting "
                f"describes. Found a deep copy made after {mark.steps} DP steps of accountant "
                f"{prior.registration.name!r}, which has counted {prior.steps} since; its first {mark.steps} steps "
                "are in the copy and no accountant holds them alone. Copy the model at the end of a run (or start "
                "from a fresh model)."
            )
        if prior.void is not None:
            raise _Error(
                f"a model whose earlier DP training was refused cannot be accounted: the released model carries "
                f"those steps. {found}, whose run was void. Start from a fresh model."
            )
        mine, theirs = dict(accountant.registration.to_dict()), dict(prior.registration.to_dict())
        mine.pop("name"), theirs.pop("name")
        if mine != theirs:
            raise _Error(
                "a model trained by an earlier engine continues that accounting only under the same "
                f"configuration (the released model is the output of all its steps). {found}, registered as "
                f"{theirs}; this accountant is {mine}. Register the same configuration, or start from a fresh "
                "model (initial weights must not depend on the private data)."
            )
        self.prior = prior

    def continue_prior(self, accountant: Any, observed: Observed) -> None:
        """The first step of a model an earlier accountant trained: ``accountant`` continues its accounting
        (its history, its index record) when the step is configured as its steps were, else refuse."""
        prior, self.prior = self.prior, None
        if prior.void is not None:
            raise _Error(f"the earlier accounting of this model was refused: {prior.void}")
        if prior.observed != observed:
            raise _Error(
                f"a model trained by an earlier engine continues that accounting only with the same noise, clipping, "
                f"batch size and learning rate. Found {prior.observed and prior.observed.to_dict()} for its "
                f"{prior.steps} steps and {observed.to_dict()} now. Start from a fresh model, or train with the same "
                "settings."
            )
        accountant.history = deepcopy(prior.history)
        accountant.departures = list(prior.departures)  # the rows that left the earlier steps stay out
        if prior.run is not None and accountant.run is not None:
            accountant.run.batches.derivation = prior.run.batches.derivation
        model = self._model()
        if model is not None:
            _mark(model, accountant)
        prior.void = (
            f"the model it accounted for was trained further under accountant {accountant.registration.name!r}, which "
            "continues its accounting; read the epsilon there"
        )
