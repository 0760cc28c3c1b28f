"""Contract tests shared by every ``dp_accounting.PrivacyAccountant`` we ship (STYLE.md tier 4).

The pattern of dp-accounting's ``privacy_accountant_test.PrivacyAccountantTest``
(``absltest.skipThisClass``), written for pytest: :class:`AccountantContract`
is not collected (its name does not start with ``Test``); a test module
subclasses it as ``class TestMyAccountant(AccountantContract)`` and defines the
three hooks. Every check is also a module-level function, so a test can show
that a check fails on a broken accountant (a test that cannot fail is a defect).

Checked: an empty and a NoOp accountant give epsilon 0 and delta 0;
NonPrivate (bare or nested) gives epsilon inf and delta 1;
``compose(e, n)`` == n x ``compose(e)`` == ``compose(SelfComposedDpEvent(e, n))``
== ``compose(ComposedDpEvent([e] * n))``; ledger round trip (composing the
ledger, or its ``to_named_tuple`` round trip, into a fresh accountant gives the
same state); deep copies and pickles are equal and independent; epsilon and delta
are consistent (``get_delta(get_epsilon(d)) <= d``) for the whole ledger and for
each event alone; unsupported and invalid events are refused
(``supports()`` False, ``UnsupportedEventError`` naming the sub-event) and
leave the state (ledger, epsilon, delta, RDP) untouched, also when a valid
sibling precedes them; ``supports()`` never changes the state.
"""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

DELTAS = (1e-3, 1e-5, 1e-9)
EPSILONS = (0.5, 2.0, 8.0)


class UnknownDpEvent(dp_event.DpEvent):
    """A DpEvent type no accountant knows."""


def snapshot(accountant: dp_accounting.PrivacyAccountant) -> dict[str, Any]:
    """Everything observable about an accountant's state."""
    state: dict[str, Any] = {
        "ledger": accountant.ledger,
        "epsilons": [accountant.get_epsilon(d) for d in DELTAS],
    }
    with contextlib.suppress(NotImplementedError):  # get_delta is optional in dp-accounting
        state["deltas"] = [accountant.get_delta(e) for e in EPSILONS]
    if hasattr(accountant, "rdp"):
        state["rdp"] = np.array(accountant.rdp, dtype=float)
    return state


def assert_same_state(a: dict[str, Any], b: dict[str, Any], *, rtol: float = 0.0, ledger: bool = True) -> None:
    """Two snapshots agree (exactly when ``rtol`` = 0; ledgers compared when ``ledger``)."""
    if ledger:
        assert a["ledger"] == b["ledger"], f"ledger changed: {a['ledger']} != {b['ledger']}"
    for key in ("epsilons", "deltas", "rdp"):
        if key in a or key in b:
            np.testing.assert_allclose(np.asarray(a[key]), np.asarray(b[key]), rtol=rtol, atol=0, err_msg=key)


def assert_refused_untouched(
    accountant: dp_accounting.PrivacyAccountant, event: dp_event.DpEvent, offending: dp_event.DpEvent | None = None
) -> None:
    """``event`` is refused by dry run, ``supports`` and ``compose``, naming the
    offending sub-event, and the accountant's state is exactly unchanged."""
    before = snapshot(accountant)
    error = accountant._maybe_compose(event, 1, False)
    assert error is not None, f"dry run accepted {event}"
    if offending is not None:
        blamed = error.invalid_event
        assert blamed is offending or blamed == offending, f"dry run blamed {blamed}, expected {offending}"
    assert not accountant.supports(event)
    with pytest.raises(dp_accounting.UnsupportedEventError, match="caused by subevent"):
        accountant.compose(event)
    assert_same_state(before, snapshot(accountant))


def assert_epsilon_delta_consistent(accountant: dp_accounting.PrivacyAccountant) -> None:
    """Epsilon does not increase with delta, and ``get_delta(get_epsilon(d)) <= d`` (to 1e-9 relative)."""
    epsilons = [accountant.get_epsilon(d) for d in DELTAS]
    assert epsilons == sorted(epsilons), f"epsilon must not increase with delta: {epsilons}"
    for delta, epsilon in zip(DELTAS, epsilons, strict=True):
        if np.isfinite(epsilon):
            found = accountant.get_delta(epsilon)
            assert found <= delta * (1 + 1e-9), f"get_delta(get_epsilon({delta:g})) = {found!r} > {delta:g}"


def assert_count_equivalences(
    make_accountant: Callable[[], dp_accounting.PrivacyAccountant], event: dp_event.DpEvent, n: int, rtol: float
) -> None:
    """compose(e, n) == n x compose(e) == SelfComposed(e, n) == Composed([e] * n)."""
    by_count = make_accountant().compose(event, n)
    repeated = make_accountant()
    for _ in range(n):
        repeated.compose(event)
    self_composed = make_accountant().compose(dp_event.SelfComposedDpEvent(event, n))
    composed = make_accountant().compose(dp_event.ComposedDpEvent([event] * n))
    reference = snapshot(by_count)
    expected_ledger = dp_accounting.DpEventBuilder()
    expected_ledger.compose(event, n)
    assert reference["ledger"] == expected_ledger.build()
    assert_same_state(reference, snapshot(repeated), rtol=rtol)
    assert_same_state(reference, snapshot(self_composed), rtol=rtol)
    assert_same_state(reference, snapshot(composed), rtol=rtol, ledger=False)


def assert_ledger_round_trip(
    make_accountant: Callable[[], dp_accounting.PrivacyAccountant], accountant: dp_accounting.PrivacyAccountant
) -> None:
    """Composing ``accountant.ledger`` (and its named-tuple round trip) into a fresh accountant gives the same state."""
    reference = snapshot(accountant)
    replayed = make_accountant().compose(accountant.ledger)
    assert_same_state(reference, snapshot(replayed))
    restored_ledger = dp_event.DpEvent.from_named_tuple(accountant.ledger.to_named_tuple())
    assert restored_ledger == accountant.ledger
    assert_same_state(reference, snapshot(make_accountant().compose(restored_ledger)))


NON_PRIVATE_FORMS = [
    dp_event.NonPrivateDpEvent(),
    dp_event.ComposedDpEvent([dp_event.NonPrivateDpEvent()]),
    dp_event.ComposedDpEvent([dp_event.NoOpDpEvent(), dp_event.NonPrivateDpEvent()]),
    dp_event.SelfComposedDpEvent(dp_event.NonPrivateDpEvent(), 10),
]
UNSUPPORTED_LEAVES = [dp_event.UnsupportedDpEvent(), UnknownDpEvent()]
NESTINGS = {
    "bare": lambda e: e,
    "composed": lambda e: dp_event.ComposedDpEvent([e]),
    "self-composed": lambda e: dp_event.SelfComposedDpEvent(e, 10),
}


class AccountantContract:
    """Base class of the contract tests. Define the hooks in a ``Test*`` subclass."""

    #: relative tolerance for equalities that go through floating-point sums
    rtol: float = 1e-12
    #: n in compose(e, n)
    repeat: int = 3

    def make_accountant(self) -> dp_accounting.PrivacyAccountant:
        """A fresh accountant (empty ledger)."""
        raise NotImplementedError

    def supported_events(self) -> Sequence[dp_event.DpEvent]:
        """Valid events the accountant must support (keep them cheap to compose)."""
        raise NotImplementedError

    def invalid_events(self) -> Sequence[tuple[dp_event.DpEvent, dp_event.DpEvent]]:
        """(event, offending sub-event) pairs the accountant must refuse (e.g. invalid parameters)."""
        return ()

    # ------------------------------------------------------------ empty / NoOp / NonPrivate

    def test_hooks_are_defined(self):
        assert self.supported_events(), "supported_events() must not be empty"

    def test_fresh_accountant_is_empty(self):
        accountant = self.make_accountant()
        assert accountant.ledger == dp_event.NoOpDpEvent()
        for delta in (1e-12, 0.0, 1.0):
            assert accountant.get_epsilon(delta) == 0
        for epsilon in (1e-12, 0.0, float("inf")):
            assert accountant.get_delta(epsilon) == 0

    def test_no_op(self):
        accountant = self.make_accountant()
        event = dp_event.NoOpDpEvent()
        assert accountant.supports(event)
        accountant.compose(event)
        assert accountant.ledger == dp_event.NoOpDpEvent()
        assert_same_state(snapshot(self.make_accountant()), snapshot(accountant))

    def test_no_op_after_events_changes_nothing(self):
        accountant = self.make_accountant().compose(self.supported_events()[0])
        before = snapshot(accountant)
        accountant.compose(dp_event.NoOpDpEvent(), 5)
        assert_same_state(before, snapshot(accountant))

    @pytest.mark.parametrize("event", NON_PRIVATE_FORMS, ids=["bare", "composed", "with-no-op", "self-composed"])
    def test_non_private(self, event):
        accountant = self.make_accountant()
        assert accountant.supports(event)
        accountant.compose(event)
        for delta in (0.99, 0.0, 1.0):
            assert accountant.get_epsilon(delta) == float("inf")
        for epsilon in (100.0, 0.0, float("inf")):
            assert accountant.get_delta(epsilon) == 1

    def test_non_private_after_events(self):
        accountant = self.make_accountant()
        for event in self.supported_events():
            accountant.compose(event)
        accountant.compose(dp_event.NonPrivateDpEvent())
        assert accountant.get_epsilon(1e-5) == float("inf")

    # ------------------------------------------------------------ composition algebra

    def test_compose_returns_self(self):
        accountant = self.make_accountant()
        assert accountant.compose(self.supported_events()[0]) is accountant

    def test_count_equivalences(self):
        for event in self.supported_events():
            assert_count_equivalences(self.make_accountant, event, self.repeat, self.rtol)

    def test_composition_is_additive_and_order_free(self):
        events = list(self.supported_events())
        forward, backward = self.make_accountant(), self.make_accountant()
        for event in events:
            forward.compose(event)
        for event in reversed(events):
            backward.compose(event)
        assert_same_state(snapshot(forward), snapshot(backward), rtol=self.rtol, ledger=False)
        together = self.make_accountant().compose(dp_event.ComposedDpEvent(events))
        assert_same_state(snapshot(forward), snapshot(together), rtol=self.rtol, ledger=False)

    def test_epsilon_grows_with_composition(self):
        event = self.supported_events()[0]
        once = self.make_accountant().compose(event)
        twice = self.make_accountant().compose(event, 2)
        for delta in DELTAS:
            assert twice.get_epsilon(delta) >= once.get_epsilon(delta)

    def test_epsilon_and_delta_are_consistent(self):
        accountant = self.make_accountant()
        for event in self.supported_events():
            accountant.compose(event)
        assert_epsilon_delta_consistent(accountant)

    def test_epsilon_and_delta_are_consistent_for_each_event_alone(self):
        # an accountant may answer a ledger of one event differently (e.g. exactly, without a grid)
        for event in self.supported_events():
            assert_epsilon_delta_consistent(self.make_accountant().compose(event))

    def test_copies_are_independent_and_equal(self):
        accountant = self.make_accountant().compose(self.supported_events()[0])
        for copied in (copy.deepcopy(accountant), pickle.loads(pickle.dumps(accountant))):
            assert_same_state(snapshot(accountant), snapshot(copied))
            before = snapshot(accountant)
            copied.compose(self.supported_events()[-1])
            assert_same_state(before, snapshot(accountant))

    def test_ledger_round_trip(self):
        accountant = self.make_accountant()
        for i, event in enumerate(self.supported_events()):
            accountant.compose(event, 1 + i % 2)
        assert_ledger_round_trip(self.make_accountant, accountant)

    # ------------------------------------------------------------ refusals

    def test_supports_changes_nothing(self):
        accountant = self.make_accountant().compose(self.supported_events()[0])
        before = snapshot(accountant)
        for event in self.supported_events():
            assert accountant.supports(event)
        for event, _ in self.invalid_events():
            accountant.supports(event)
        assert_same_state(before, snapshot(accountant))

    @pytest.mark.parametrize("nesting", list(NESTINGS))
    @pytest.mark.parametrize("leaf", UNSUPPORTED_LEAVES, ids=["UnsupportedDpEvent", "UnknownDpEvent"])
    def test_unsupported_is_refused_and_changes_nothing(self, leaf, nesting):
        accountant = self.make_accountant().compose(self.supported_events()[0])
        assert_refused_untouched(accountant, NESTINGS[nesting](leaf), leaf)

    def test_unsupported_after_valid_sibling_changes_nothing(self):
        accountant = self.make_accountant()
        leaf = dp_event.UnsupportedDpEvent()
        assert_refused_untouched(accountant, dp_event.ComposedDpEvent([*self.supported_events(), leaf]), leaf)

    def test_invalid_events_are_refused_and_change_nothing(self):
        valid = self.supported_events()[0]
        for event, offending in self.invalid_events():
            accountant = self.make_accountant().compose(valid)
            assert_refused_untouched(accountant, event, offending)
            assert_refused_untouched(accountant, dp_event.ComposedDpEvent([valid, event]), offending)
            assert_refused_untouched(accountant, dp_event.SelfComposedDpEvent(event, 2), offending)
