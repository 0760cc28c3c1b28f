r"""How the dp-accounting accountants walk a ``DpEvent`` tree, shared by both (``_rdp``, ``_pld``).

Validation happens before any state changes: dp-accounting's own base class updates the ledger before its
real composition pass, so a late failure leaves a ledger that disagrees with the accounted numbers. Each
accountant plans the whole composition first (:class:`_EventPlanning`: a plan is the state change composing
the event would make; planning changes nothing and raises :class:`_Refusal` naming the offending
sub-event), then commits. Parameters dp-accounting does not check (0.4.3 accepts ``GaussianDpEvent(-1)``)
are checked here (:func:`_check_standard`), as are the counts (:func:`_check_count`: at most 2**53, the
core's largest count).
"""

import numbers
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeAlias

import attr
import dp_accounting
from dp_accounting import dp_event

from lastiter_plugins.adapters.dp_accounting._events import LastIterateDpSgdEvent
from lastiter_plugins.config import MAX_COUNT, check_count, shown
from lastiter_plugins.validation import number_problem

CompositionErrorDetails: TypeAlias = dp_accounting.PrivacyAccountant.CompositionErrorDetails


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_gaussian(e: Any) -> str | None:
    return number_problem("GaussianDpEvent.noise_multiplier", e.noise_multiplier, "a number >= 0", lambda z: z >= 0)


def _check_laplace(e: Any) -> str | None:
    return number_problem("LaplaceDpEvent.noise_multiplier", e.noise_multiplier, "a number > 0", lambda z: z > 0)


def _check_poisson(e: Any) -> str | None:
    q = e.sampling_probability
    return number_problem("PoissonSampledDpEvent.sampling_probability", q, "in [0, 1]", lambda q: 0 <= q <= 1)


def _check_sampled(e: Any) -> str | None:
    name, n, m = type(e).__name__, e.source_dataset_size, e.sample_size
    for field, value, minimum in (("source_dataset_size", n, 1), ("sample_size", m, 0)):
        problem = _count_problem(f"{name}.{field}", value, minimum)
        if problem is not None:
            return problem
    if isinstance(e, dp_event.SampledWithoutReplacementDpEvent) and m > n:
        return f"{name}.sample_size must be <= source_dataset_size = {n}. Found {m}."
    return None


def _count_problem(name: str, value: Any, minimum: int) -> str | None:
    """None when ``value`` is an integer in [``minimum``, 2**53] (the core's counts); else the message."""
    if not _is_int(value):
        return f"{name} must be an integer >= {minimum}. Found {shown(value)}."
    try:
        check_count(name, value, minimum)
    except ValueError as exc:
        return str(exc)
    return None


def _check_self_composed(e: Any) -> str | None:
    # >= 1 as dp-accounting's ledger (DpEventBuilder) requires; RdpAccountant would take 0.
    return _count_problem("SelfComposedDpEvent.count", e.count, 1)


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


def _nested_events(event: Any) -> Iterator[Any]:
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


def _check_count(count: Any) -> int:
    """``compose``'s count: TypeError unless an integer (dp-accounting's contract), ValueError unless in
    [1, 2**53]."""
    if not _is_int(count):
        raise TypeError(f"count must be an integer. Found {shown(count)} ({type(count).__name__}).")
    return check_count("count", count, 1)


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
        total = count * int(event.count)
        if total > MAX_COUNT:
            raise _Refusal(
                event,
                f"SelfComposedDpEvent.count times the count it is composed with must be <= 2**53 = {MAX_COUNT} "
                f"(applications of one event). Found {event.count} x {count} = {shown(total)}.",
            )
        return self._plan(event.event, total)

    def _plan_composed(self, event: Any, count: int) -> Any:
        if not isinstance(event.events, list | tuple):
            raise _Refusal(event, f"ComposedDpEvent.events must be a list of DpEvents. Found {event.events!r}.")
        plan = self._empty_plan()
        for sub in event.events:
            if not isinstance(sub, dp_event.DpEvent):
                raise _Refusal(event, f"ComposedDpEvent.events must contain DpEvents only. Found {sub!r}.")
            plan += self._plan(sub, count)
        return plan
