"""The dp-accounting adapter: LastIterateDpSgdEvent and LastIterateAccountant.

Runs on dp-accounting 0.4.3 (the main venv) and 0.6.x (scripts/test_dp_accounting_06.sh).
Small custom order grids keep it fast: dp-accounting's sampled-without-replacement
RDP takes about 2 s on the default grid.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import math
import re
import sys
import types
import warnings

import attr
import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant as dp_pld
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lastiter_plugins as lp
from lastiter_plugins.adapters.dp_accounting import (
    BoundId,
    LastIterateAccountant,
    LastIterateDpSgdEvent,
    LastIteratePldAccountant,
    SamplingScheme,
    _pld,
)
from tests.support import ROOT

from .accountant_contract import (
    AccountantContract,
    assert_count_equivalences,
    assert_epsilon_delta_consistent,
    assert_refused_untouched,
    assert_same_state,
    snapshot,
)

R1 = dp_accounting.NeighboringRelation.REPLACE_ONE
AOR = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
ORDERS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 128.0)
DELTA = 1e-5

# Events describe runs; the accountant chooses the bound (default "best").
KR = LastIterateDpSgdEvent("cyclic", 1000, 10, 2.0, 500, 0.5, smoothness=0.5)
BEST_CYCLIC = LastIterateDpSgdEvent("cyclic", 1000, 10, 1.5, 300, 0.5, smoothness=0.5)
KR_BOUNDED = LastIterateDpSgdEvent("reshuffle", 1000, 10, 2.0, 500, 0.5, smoothness=0.5, diameter=0.01)
AT = LastIterateDpSgdEvent("random_batch", 1000, 50, 2.0, 5000, 0.5, smoothness=1.0, diameter=0.5)
COMPOSITION_RB = LastIterateDpSgdEvent("random_batch", 1000, 100, 1.5, 200, None)
LIANG = LastIterateDpSgdEvent("poisson", 1000, 50, 2.0, 5000, 0.5, smoothness=1.0, diameter=0.5)
# f-DP (shifted interpolation) and bounded-domain runs: convex, smooth, clipping never active.
SI_CYCLIC = LastIterateDpSgdEvent("cyclic", 1000, 50, 4.0, 400, 1.0, smoothness=0.25, gradient_norms_within_clip=True)
SI_SHUFFLE = attr.evolve(SI_CYCLIC, sampling="shuffle_once")
SI_FULL = LastIterateDpSgdEvent(
    "cyclic",
    200,
    200,
    6.0,
    50,
    1.0,
    smoothness=0.5,
    strong_convexity=0.1,
    gradient_norms_within_clip=True,
    diameter=20.0,  # strong_convexity * D / 2 = C: a loss can meet it (no projection: none could)
)
BDR = attr.evolve(AT, gradient_norms_within_clip=True)

GAUSS = dp_event.GaussianDpEvent(1.0)
LAPLACE = dp_event.LaplaceDpEvent(2.0)
SWOR = dp_event.SampledWithoutReplacementDpEvent(1000, 100, dp_event.GaussianDpEvent(0.75))
POISSON = dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(2.0))


@pytest.fixture(autouse=True)
def _quiet_order_grid():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lp.OrderGridWarning)
        yield


def accountant(relation=R1, orders=ORDERS, bound="best") -> LastIterateAccountant:
    return LastIterateAccountant(bound=bound, orders=orders, neighboring_relation=relation)


def host_rdp(event, relation=R1, orders=ORDERS) -> np.ndarray:
    """dp-accounting's own RdpAccountant on a standard event."""
    return dp_rdp.RdpAccountant(list(orders), relation).compose(event).rdp


def core_rdp(event: LastIterateDpSgdEvent, relation=R1, orders=ORDERS, bound="best") -> np.ndarray:
    return lp.rdp(bound, list(orders), relation=relation.name.lower(), **event.to_params())


# ---------------------------------------------------------------- contract tests


class TestContractReplaceOne(AccountantContract):
    def make_accountant(self):
        return accountant(R1)

    def supported_events(self):
        return [KR, GAUSS, SWOR, dp_event.ComposedDpEvent([AT, LAPLACE]), BEST_CYCLIC, SI_CYCLIC, SI_SHUFFLE]

    def invalid_events(self):
        bad_noise = attr.evolve(KR, noise_multiplier=-1.0)
        bad_lr = attr.evolve(KR, noise_multiplier=float("nan"))
        nested = dp_event.PoissonSampledDpEvent(0.1, KR)
        return [
            (bad_noise, bad_noise),
            (bad_lr, bad_lr),
            (LIANG, LIANG),  # proven for add-or-remove only
            (dp_event.GaussianDpEvent(-1.0), dp_event.GaussianDpEvent(-1.0)),
            (dp_event.SampledWithoutReplacementDpEvent(10, 20, GAUSS),) * 2,
            (POISSON, POISSON),  # dp-accounting: Poisson needs add-or-remove
            (nested, KR),
            (dp_event.SelfComposedDpEvent(KR, 0),) * 2,  # the ledger (DpEventBuilder) needs count >= 1
        ]


class TestContractAddOrRemove(AccountantContract):
    def make_accountant(self):
        return accountant(AOR)

    def supported_events(self):
        return [LIANG, POISSON, GAUSS]

    def invalid_events(self):
        return [(KR, KR), (SWOR, SWOR), (dp_event.PoissonSampledDpEvent(1.5, GAUSS),) * 2]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # host: inf - inf in compute_delta
class TestContractHostRdpAccountant(AccountantContract):
    """The contract holds for dp-accounting's own RdpAccountant on valid events
    (it validates late, so no invalid events are listed for it)."""

    def make_accountant(self):
        return dp_rdp.RdpAccountant(list(ORDERS), R1)

    def supported_events(self):
        return [GAUSS, SWOR, LAPLACE]


class _LedgerFirst(LastIterateAccountant):
    """Broken on purpose: records the ledger before validating, as dp-accounting's base class does."""

    def compose(self, event, count=1):
        self._ledger.compose(event, count)
        return super().compose(event, count)


class _IgnoresCount(LastIterateAccountant):
    """Broken on purpose: composes once whatever the count."""

    def compose(self, event, count=1):
        return super().compose(event, 1)


def test_contract_detects_a_ledger_poisoned_by_late_validation():
    broken = _LedgerFirst(orders=ORDERS, neighboring_relation=R1).compose(KR)
    with pytest.raises(AssertionError, match="ledger changed"):
        assert_refused_untouched(broken, attr.evolve(KR, noise_multiplier=-1.0))


class _GridDeltaOnly(LastIterateAccountant):
    """Broken on purpose: answers delta on the grid even for a single run answered losslessly."""

    def get_delta_and_optimal_order(self, target_epsilon):
        return dp_rdp.compute_delta(self._orders, self._rdp, target_epsilon)


def test_contract_detects_a_delta_inconsistent_with_epsilon():
    with pytest.raises(AssertionError, match="get_delta"):
        assert_epsilon_delta_consistent(_GridDeltaOnly(orders=ORDERS, neighboring_relation=R1).compose(SI_CYCLIC))
    assert_epsilon_delta_consistent(accountant().compose(SI_CYCLIC))


def test_contract_detects_an_ignored_count():
    with pytest.raises(AssertionError):
        assert_count_equivalences(lambda: _IgnoresCount(orders=ORDERS, neighboring_relation=R1), KR, 3, 1e-12)


# ---------------------------------------------------------------- the event


def test_event_is_a_frozen_attrs_dp_event_with_the_documented_fields():
    assert issubclass(LastIterateDpSgdEvent, dp_event.DpEvent)
    assert [f.name for f in attr.fields(LastIterateDpSgdEvent)] == [
        "sampling",
        "dataset_size",
        "batch_size",
        "noise_multiplier",
        "steps",
        "learning_rate",
        "clip_norm",
        "smoothness",
        "weak_convexity",
        "strong_convexity",
        "diameter",
        "gradient_norms_within_clip",
        "clipped_loss_convex_smooth",
        "l2_outside_clip",
        "update",
        "allocations_per_epoch",
        "order_secret",
    ]
    defaults = LastIterateDpSgdEvent("cyclic", 100, 10, 1.0, 10, None)
    assert (defaults.clipped_loss_convex_smooth, defaults.l2_outside_clip, defaults.update.value) == (
        False,
        False,
        "sgd",
    )
    assert defaults.allocations_per_epoch == 1 and defaults.order_secret is True
    # every declaration of the core's keyword API is a field (relation is the accountant's), except the cut of
    # max_batch_size: such a run has (epsilon, delta) guarantees only, no Renyi curve or PLD for these accountants
    # to compose (docs/derivations/fixed-length-batches.md, part 5)
    fields = {f.name for f in attr.fields(LastIterateDpSgdEvent)}
    assert set(lp.PARAMETERS) - fields == {"relation", "epochs", "max_batch_size"}
    assert (defaults.clip_norm, defaults.smoothness, defaults.weak_convexity) == (1.0, None, 0.0)
    assert (defaults.strong_convexity, defaults.diameter, defaults.gradient_norms_within_clip) == (0.0, None, False)
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        KR.steps = 10


def test_a_random_allocation_event_reaches_the_core_with_its_allocations_per_epoch():
    """main's random allocation (allocations_per_epoch) kept on the host contract: the event's k is the core's."""
    event = LastIterateDpSgdEvent("random_allocation", 1000, 50, 2.0, 100, None, allocations_per_epoch=2)
    one = attr.evolve(event, allocations_per_epoch=1)
    acc = accountant(AOR).compose(event)
    expected = lp.epsilon("best", 1e-5, relation="add_or_remove_one", **event.to_params()).epsilon
    assert acc.get_epsilon(1e-5) == expected
    assert expected != lp.epsilon("best", 1e-5, relation="add_or_remove_one", **one.to_params()).epsilon


def test_an_adam_run_gets_the_every_iterate_number():
    """update="any" (Adam, momentum, a schedule): the accountant gives the core's best over the every-iterate
    rows; a last-iterate bound named for it is not supported."""
    sgd = LastIterateDpSgdEvent(
        "shuffle_once",
        1000,
        10,
        1.0,
        2000,
        0.1,
        smoothness=1.0,
        strong_convexity=0.1,
        gradient_norms_within_clip=True,
        diameter=20.0,  # strong_convexity * D / 2 = C: a loss can meet it
    )
    adam = attr.evolve(sgd, update="any")
    acc = LastIterateAccountant(neighboring_relation=R1)  # a shuffle-once run: replace-one
    acc.compose(adam)
    params = {**adam.to_params(), "relation": acc.neighboring_relation.name.lower()}
    expected = lp.epsilon("best", 1e-5, **params)
    assert expected.protects is lp.Protects.EVERY_ITERATE
    assert acc.get_epsilon(1e-5) == pytest.approx(expected.epsilon, rel=1e-12)
    assert acc.get_epsilon(1e-5) > _fresh_epsilon(sgd)  # plain SGD: a last-iterate row wins
    assert LastIterateAccountant(bound="ye-shokri-shuffle", neighboring_relation=R1).supports(sgd)
    assert not LastIterateAccountant(bound="ye-shokri-shuffle", neighboring_relation=R1).supports(adam)


def _fresh_epsilon(event):
    acc = LastIterateAccountant(neighboring_relation=R1)
    acc.compose(event)
    return acc.get_epsilon(1e-5)


def test_event_to_named_tuple_round_trips_alone_and_nested():
    named = KR.to_named_tuple()
    assert named.module_name == "lastiter_plugins.adapters.dp_accounting"
    assert named.class_name == "LastIterateDpSgdEvent"
    assert not hasattr(named, "bound")
    assert named.sampling is SamplingScheme.CYCLIC and named.steps == 500
    assert dp_event.DpEvent.from_named_tuple(named) == KR
    nested = dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(BEST_CYCLIC, 3), GAUSS, AT])
    assert dp_event.DpEvent.from_named_tuple(nested.to_named_tuple()) == nested


def test_event_accepts_strings_and_enums_alike():
    from_strings = LastIterateDpSgdEvent("shuffle-once", 100, 10, 1.0, 10, None)
    from_enums = LastIterateDpSgdEvent(lp.Sampling.SHUFFLE_ONCE, 100, 10, 1.0, 10, None)
    assert from_strings == from_enums and hash(from_strings) == hash(from_enums)
    assert from_strings.sampling is SamplingScheme.SHUFFLE_ONCE
    assert {b.value for b in BoundId} == set(lp.BOUND_IDS)  # the ids LastIterateAccountant(bound=...) takes


def test_event_rejects_unknown_sampling_and_says_where_the_bound_went():
    with pytest.raises(ValueError, match="sampling must be one of"):
        attr.evolve(KR, sampling="shuffled")
    with pytest.raises(ValueError, match=r"bound moved from the event to the accountant"):
        LastIterateDpSgdEvent("best", "cyclic", 1000, 10, 2.0, 500, 0.5)  # the old positional form
    with pytest.raises(TypeError, match=r"LastIterateAccountant\(bound=\.\.\.\)"):
        LastIterateDpSgdEvent(bound="best", **KR.to_params())
    with pytest.raises(ValueError, match="gradient_norms_within_clip"):
        LastIterateDpSgdEvent("cyclic", 1000, 10, 2.0, 500, 0.5, clipping=False)
    with pytest.raises(ValueError, match="bound must be one of"):
        LastIterateAccountant(bound="kong-ribero")


def test_the_accountant_decides_the_bound_for_the_same_event():
    ledger = None
    for bound in ("kong-ribero-cyclic", "composition", "best"):
        acc = accountant(bound=bound).compose(KR)
        np.testing.assert_array_equal(acc.rdp, core_rdp(KR, bound=bound))
        assert acc.bound == bound and f"bound {bound}" in acc.statement(DELTA)
        ledger = ledger or acc.ledger
        assert acc.ledger == ledger  # the ledger describes the mechanism only
    best = accountant().compose(KR).rdp
    assert np.all(best <= accountant(bound="composition").compose(KR).rdp)
    assert np.all(best <= accountant(bound="kong-ribero-cyclic").compose(KR).rdp)


# ---------------------------------------------------------------- agreement with the core


@pytest.mark.parametrize(
    ("event", "relation", "bound"),
    [
        (KR, R1, "kong-ribero-cyclic"),
        (BEST_CYCLIC, R1, "best"),
        (KR_BOUNDED, R1, "kong-ribero-bounded"),
        (AT, R1, "best"),
        (COMPOSITION_RB, R1, "composition"),
        (LIANG, AOR, "liang-bounded"),
        (SI_CYCLIC, R1, "shifted-interpolation-cyclic"),
        (SI_SHUFFLE, R1, "shifted-interpolation-shuffle"),
        (SI_FULL, R1, "shifted-interpolation-full-batch"),
        (SI_SHUFFLE, R1, "best"),
        (BDR, R1, "bounded-domain-random"),
        (BDR, R1, "best"),
    ],
    ids=[
        "kong-ribero-cyclic",
        "best",
        "kong-ribero-bounded",
        "random-batch-best",
        "composition-rb",
        "liang",
        "si-cyclic",
        "si-shuffle",
        "si-full-batch",
        "best-si-shuffle",
        "bounded-domain-random",
        "best-bounded-domain-random",
    ],
)
@pytest.mark.parametrize("orders", [ORDERS, None], ids=["custom-orders", "default-orders"])
def test_single_run_agrees_with_the_core(event, relation, bound, orders):
    # One run and nothing else: exactly the core's lossless epsilon (f-DP profiles converted exactly).
    acc = accountant(relation, orders=orders, bound=bound).compose(event)
    expected = core_rdp(event, relation, orders=acc.orders, bound=bound)
    np.testing.assert_array_equal(acc.rdp, expected)
    params = dict(relation=relation.name.lower(), **event.to_params())
    core = lp.epsilon(bound, DELTA, orders=None if orders is None else list(orders), **params)
    assert acc.get_epsilon_and_optimal_order(DELTA) == (core.epsilon, core.order)
    assert (core.order is None) == (core.kind in (lp.Kind.GDP, lp.Kind.PLD))  # a profile, converted exactly
    for delta in (1e-3, DELTA, 1e-9):
        eps = acc.get_epsilon(delta)
        found = acc.get_delta(eps)
        assert found <= delta * (1 + 1e-9)  # consistent with its own epsilon
        assert found <= dp_rdp.compute_delta(acc.orders, expected, eps)[0]  # never above the grid conversion


def _certified_delta_floors(event, epsilons, low, high):
    """For each epsilon, the smallest delta any candidate of best certifies for the run, computed
    independently: exact profiles of the GDP bounds, and dp-accounting's conversion formula on a
    dense order grid over [low, high] for every candidate's RDP curve."""
    params = event.to_params()
    config, assumptions = lp.build(**params)

    def log_deltas(orders, r, eps):
        improved = (orders - 1) * (r - eps + np.log1p(-1 / orders)) - np.log(orders)
        return np.minimum(improved, 0.5 * np.log1p(-np.exp(-r)))

    coarse = np.linspace(max(low, 1.0101), high, 2001)
    floors = np.ones(len(epsilons))
    for bid, evaluation in lp.applicable_bounds(**params).items():
        if bid == "best" or not (evaluation.applies and evaluation.proof.proven):
            continue
        spec = lp.BOUNDS[bid]
        if not spec.has_renyi_curve:  # a privacy profile only (a PLD row, a truncated profile)
            floors = np.minimum(floors, [spec.profile(config, assumptions).delta(eps) for eps in epsilons])
            continue
        r = lp.rdp(bid, coarse, **params)
        for i, eps in enumerate(epsilons):
            j = int(np.argmin(log_deltas(coarse, r, eps)))  # then brute force around the coarse minimum
            fine = np.linspace(coarse[max(j - 1, 0)], coarse[min(j + 1, coarse.size - 1)], 401)
            found = float(
                np.exp(min(log_deltas(coarse, r, eps).min(), log_deltas(fine, lp.rdp(bid, fine, **params), eps).min()))
            )
            if spec.kind is lp.Kind.GDP:
                found = min(found, spec.profile(config, assumptions).delta(eps))
            floors[i] = min(floors[i], found)
    return floors


@pytest.mark.parametrize(
    "event", [KR, BEST_CYCLIC, SI_CYCLIC, SI_SHUFFLE, BDR], ids=["kr", "best-cyclic", "si-cyclic", "si-shuffle", "bdr"]
)
def test_single_run_delta_is_never_below_what_the_bounds_certify(event):
    # get_delta for one run searches orders beyond the grid: every number it returns must be one a
    # candidate bound certifies at some order (or its exact profile), never less.
    acc = accountant().compose(event)
    epsilons = (0.5, 2.0, acc.get_epsilon(DELTA), 8.0)
    floors = _certified_delta_floors(event, epsilons, min(ORDERS), max(ORDERS))
    for eps, floor in zip(epsilons, floors, strict=True):
        assert acc.get_delta(eps) >= floor * (1 - 1e-6)
        assert acc.get_delta(eps) <= dp_rdp.compute_delta(list(ORDERS), acc.rdp, eps)[0]


def test_composition_with_anything_else_uses_the_rdp_grid():
    params = SI_CYCLIC.to_params()
    lossless = lp.epsilon("best", DELTA, orders=list(ORDERS), **params)
    assert lossless.kind is lp.Kind.GDP  # the run's best is its f-DP profile, converted exactly
    assert accountant().compose(SI_CYCLIC).get_epsilon(DELTA) == lossless.epsilon
    # a NoOp is no event: still the one run
    with_no_op = dp_event.ComposedDpEvent([SI_CYCLIC, dp_event.NoOpDpEvent()])
    assert accountant().compose(with_no_op).get_epsilon(DELTA) == lossless.epsilon
    # the same run twice (k copies are k runs), another run, or a standard event: the sum of the RDP
    # curves (the f-DP bound enters with its implied RDP alpha mu^2 / 2) converted on the grid
    mu = SI_CYCLIC.gaussian_mu()
    np.testing.assert_allclose(core_rdp(SI_CYCLIC), np.array(ORDERS) * mu**2 / 2, rtol=1e-12)
    for acc, curve in (
        (accountant().compose(SI_CYCLIC, 2), 2 * core_rdp(SI_CYCLIC)),
        (accountant().compose(SI_CYCLIC).compose(SI_FULL), core_rdp(SI_CYCLIC) + core_rdp(SI_FULL)),
        (accountant().compose(SI_CYCLIC).compose(GAUSS), core_rdp(SI_CYCLIC) + host_rdp(GAUSS)),
    ):
        np.testing.assert_allclose(acc.rdp, curve, rtol=1e-14)
        eps, order = acc.get_epsilon_and_optimal_order(DELTA)
        assert (eps, order) == lp.conversion.rdp_to_epsilon(np.array(ORDERS), acc.rdp, DELTA)
        assert eps > lossless.epsilon and order in ORDERS
        assert acc.get_delta(eps) == dp_rdp.compute_delta(list(ORDERS), acc.rdp, eps)[0]


def test_statement_says_how_a_single_run_was_converted():
    assert "privacy profile converted exactly" in accountant().compose(SI_CYCLIC).statement(DELTA)
    assert "RDP order" in accountant().compose(SI_CYCLIC).compose(GAUSS).statement(DELTA)
    assert "RDP order" in accountant(bound="kong-ribero-cyclic").compose(KR).statement(DELTA)
    # best on KR: the exact per-epoch Gaussian composition (a profile) now beats kong-ribero-cyclic
    assert "privacy profile converted exactly" in accountant().compose(KR).statement(DELTA)


def test_default_orders_agree_with_lastiter_epsilon():
    acc = LastIterateAccountant(neighboring_relation=R1).compose(KR)
    np.testing.assert_array_equal(acc.orders, lp.DEFAULT_ORDERS)
    assert acc.neighboring_relation is R1
    assert acc.get_epsilon(DELTA) == lp.epsilon("best", DELTA, **KR.to_params()).epsilon


def test_runs_compose_additively():
    acc = accountant().compose(KR, 3).compose(BEST_CYCLIC)
    expected = 3 * core_rdp(KR) + core_rdp(BEST_CYCLIC)
    np.testing.assert_allclose(acc.rdp, expected, rtol=1e-14)
    assert acc.get_epsilon(DELTA) == pytest.approx(dp_rdp.compute_epsilon(list(ORDERS), expected, DELTA)[0])


def test_mixed_nested_pipeline_is_the_sum_of_its_parts():
    pipeline = dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(GAUSS, 5),
            KR,
            SWOR,
            dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([KR, dp_event.NoOpDpEvent(), LAPLACE]), 2),
        ]
    )
    acc = accountant().compose(pipeline)
    expected = 5 * host_rdp(GAUSS) + 3 * core_rdp(KR) + host_rdp(SWOR) + 2 * host_rdp(LAPLACE)
    np.testing.assert_allclose(acc.rdp, expected, rtol=1e-12)
    assert acc.ledger == pipeline
    statement = acc.statement(DELTA)
    assert "replace_one" in statement and "final model only of 3 DP-SGD run(s)" in statement
    assert "outputs of 8 standard mechanism" in statement


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.recursive(
        st.sampled_from([KR, GAUSS, LAPLACE, KR_BOUNDED, BEST_CYCLIC, dp_event.NoOpDpEvent()]),
        lambda children: st.one_of(
            st.lists(children, min_size=1, max_size=3).map(dp_event.ComposedDpEvent),
            st.tuples(children, st.integers(1, 4)).map(lambda t: dp_event.SelfComposedDpEvent(*t)),
        ),
        max_leaves=8,
    )
)
def test_any_composition_tree_is_the_weighted_sum_of_its_leaves(tree):
    def leaf_weights(event, weight, out):
        if isinstance(event, dp_event.ComposedDpEvent):
            for sub in event.events:
                leaf_weights(sub, weight, out)
        elif isinstance(event, dp_event.SelfComposedDpEvent):
            leaf_weights(event.event, weight * event.count, out)
        elif not isinstance(event, dp_event.NoOpDpEvent):
            out.append((event, weight))
        return out

    expected = np.zeros(len(ORDERS))
    for leaf, weight in leaf_weights(tree, 1, []):
        curve = core_rdp(leaf) if isinstance(leaf, LastIterateDpSgdEvent) else host_rdp(leaf)
        expected = expected + weight * curve
    np.testing.assert_allclose(accountant().compose(tree).rdp, expected, rtol=1e-12)


# ---------------------------------------------------------------- refusals and validation


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"noise_multiplier": -1.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"noise_multiplier": "2"}, "noise_multiplier"),
        ({"dataset_size": 0}, "dataset_size"),
        ({"batch_size": 2000}, "batch_size"),
        ({"steps": 0}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"learning_rate": 5.0}, "learning_rate"),
        ({"smoothness": None}, "smoothness"),
        ({"gradient_norms_within_clip": "yes"}, "gradient_norms_within_clip"),
        ({"clip_norm": 0.0}, "clip_norm"),
        ({"weak_convexity": -1.0}, "weak_convexity"),
        ({"sampling": "random_batch"}, "sampling"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_parameters_are_refused_naming_the_parameter(changes, named):
    event = attr.evolve(KR, **changes)
    acc = accountant(bound="kong-ribero-cyclic").compose(GAUSS)
    assert not acc.supports(event)
    error = acc._maybe_compose(event, 1, False)
    assert error.invalid_event is event and named in error.error_message
    assert_refused_untouched(acc, dp_event.ComposedDpEvent([KR, event]), event)
    with pytest.raises(dp_accounting.UnsupportedEventError, match=named):
        acc.compose(event)


def test_relation_mismatch_is_refused_with_the_reason():
    with pytest.raises(dp_accounting.UnsupportedEventError, match="relation must be replace_one"):
        accountant(AOR).compose(KR)
    with pytest.raises(dp_accounting.UnsupportedEventError, match="relation must be add_or_remove_one"):
        accountant(R1, bound="liang-bounded").compose(LIANG)
    # best under replace-one: only the PLD row applies, and it has no Renyi curve to compose with
    # another event (alone, the run is answered from its profile: see the tests at the end)
    with pytest.raises(
        dp_accounting.UnsupportedEventError,
        match="composition-pld-poisson-replace-one applies, but it has no Renyi curve",
    ):
        accountant(R1).compose(GAUSS).compose(LIANG)


def test_last_iterate_event_inside_a_sampling_wrapper_is_refused():
    event = dp_event.SampledWithoutReplacementDpEvent(1000, 10, KR)
    error = accountant()._maybe_compose(event, 1, False)
    assert error.invalid_event == KR and "can only be composed" in error.error_message


def test_zero_noise_is_a_valid_non_private_run():
    acc = accountant().compose(attr.evolve(KR, noise_multiplier=0))
    assert acc.get_epsilon(DELTA) == math.inf and acc.get_delta(100.0) == 1.0
    assert not accountant(bound="kong-ribero-cyclic").supports(attr.evolve(KR, noise_multiplier=0, learning_rate=5.0))


def test_count_is_validated_before_anything_changes():
    acc = accountant().compose(KR)
    before = (acc.ledger, acc.rdp)
    with pytest.raises(ValueError, match="count must be an integer >= 1"):
        acc.compose(GAUSS, 0)
    with pytest.raises(TypeError, match="count must be an integer"):
        acc.compose(GAUSS, 1.5)
    with pytest.raises(TypeError, match="count must be an integer"):
        acc.compose(GAUSS, True)
    with pytest.raises(TypeError, match="must be `DpEvent`"):
        acc.compose("gaussian")
    assert acc.ledger == before[0]
    np.testing.assert_array_equal(acc.rdp, before[1])
    assert acc._maybe_compose(GAUSS, -1, False) is not None
    np.testing.assert_array_equal(accountant().compose(KR, np.int64(2)).rdp, accountant().compose(KR, 2).rdp)


def test_constructor_validates_and_copies():
    with pytest.raises(ValueError, match="neighboring_relation must be REPLACE_ONE or ADD_OR_REMOVE_ONE"):
        LastIterateAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    for bad in ([], [1.0], [2.0, float("nan")]):
        with pytest.raises(ValueError, match="orders"):
            LastIterateAccountant(orders=bad)
    orders = np.array(ORDERS)
    acc = LastIterateAccountant(orders=orders, neighboring_relation=R1)
    orders[:] = 2.0
    np.testing.assert_array_equal(acc.orders, ORDERS)
    for relation in (lp.Relation.ADD_OR_REMOVE_ONE, "add_or_remove_one", AOR):
        acc = LastIterateAccountant(orders=ORDERS, neighboring_relation=relation)
        assert acc.neighboring_relation is AOR and acc.relation is lp.Relation.ADD_OR_REMOVE_ONE


@pytest.mark.parametrize("delta", [-0.1, 1.5, float("nan"), "0.1"], ids=["negative", "above-1", "nan", "str"])
def test_get_epsilon_validates_delta(delta):
    with pytest.raises(ValueError, match="target_delta must be in"):
        accountant().compose(KR).get_epsilon(delta)


@pytest.mark.parametrize("epsilon", [-1.0, float("nan")], ids=["negative", "nan"])
def test_get_delta_validates_epsilon(epsilon):
    with pytest.raises(ValueError, match="target_epsilon must be a number >= 0"):
        accountant().compose(KR).get_delta(epsilon)


# ---------------------------------------------------------------- calibration


@pytest.mark.parametrize(
    ("event", "target"),
    [
        pytest.param(KR, 3.0, id="kr"),
        pytest.param(SI_CYCLIC, 2.0, id="si-cyclic"),
        pytest.param(SI_SHUFFLE, 2.0, id="si-shuffle"),
        pytest.param(BDR, 8.0, id="bdr"),
    ],
)
def test_calibrate_dp_mechanism_finds_the_noise_multiplier(event, target):
    # One run alone: the accountant's epsilon is the core's lossless one, so the host's calibration
    # agrees with lastiter_plugins.calibrate_noise (f-DP bounds included).
    def eps(z):
        return accountant().compose(attr.evolve(event, noise_multiplier=z)).get_epsilon(DELTA)

    z = dp_accounting.calibrate_dp_mechanism(
        lambda: accountant(), lambda z: attr.evolve(event, noise_multiplier=z), target, DELTA
    )
    assert eps(z) <= target < eps(z * (1 - 1e-4))
    params = {k: v for k, v in event.to_params().items() if k != "noise_multiplier"}
    core = lp.calibrate_noise("best", target, DELTA, orders=list(ORDERS), **params).noise_multiplier
    # both are the smallest noise meeting the target, each to its own tolerance: the core's meets it through the
    # host's accountant too, and they agree (which of the two lies closer to the root depends on the searches)
    assert eps(core) <= target and z == pytest.approx(core, rel=2e-4)


def test_calibrate_dp_mechanism_with_the_pld_accountant():
    target, interval = 2.0, 1e-3
    z = dp_accounting.calibrate_dp_mechanism(
        lambda: pld(interval=interval), lambda z: attr.evolve(SI_CYCLIC, noise_multiplier=z), target, DELTA
    )
    assert pld(interval=interval).compose(attr.evolve(SI_CYCLIC, noise_multiplier=z)).get_epsilon(DELTA) <= target
    params = {k: v for k, v in SI_CYCLIC.to_params().items() if k != "noise_multiplier"}
    core = lp.calibrate_noise("shifted-interpolation-cyclic", target, DELTA, **params).noise_multiplier
    assert lp.epsilon("shifted-interpolation-cyclic", DELTA, noise_multiplier=z, **params).epsilon <= target
    assert z == pytest.approx(core, rel=1e-3)  # PLD rounds up by at most its discretisation


def test_calibrate_dp_mechanism_on_a_mixed_pipeline():
    target, FIXED = 4.0, dp_event.GaussianDpEvent(4.0)  # the fixed part alone: epsilon about 1.2
    assert accountant().compose(FIXED, 2).get_epsilon(DELTA) < target

    def pipeline(z):
        return dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(FIXED, 2), attr.evolve(AT, noise_multiplier=z)])

    z = dp_accounting.calibrate_dp_mechanism(lambda: accountant(), pipeline, target, DELTA)
    assert accountant().compose(pipeline(z)).get_epsilon(DELTA) <= target
    assert accountant().compose(pipeline(z * (1 - 1e-3))).get_epsilon(DELTA) > target


# ---------------------------------------------------------------- REPLACE_ONE: standard events next to ours


def test_replace_one_gaussian_step_matches_the_hand_derived_value():
    # One full-batch DP-SGD step, C = 1, z = 2: replacing one example moves the
    # clipped sum by up to 2C, the noise std is zC, so at order a
    # D_a(N(0, (zC)^2) || N(2C, (zC)^2)) = a (2C)^2 / (2 (zC)^2) = 2a/z^2 = 4 at a = 8.
    z, order = 2.0, 8.0
    acc = accountant(R1, orders=[order]).compose(dp_event.GaussianDpEvent(z / 2))
    np.testing.assert_allclose(acc.rdp, [4.0], rtol=1e-15)
    # improved conversion at a single order: eps = r + log(1 - 1/a) - log(delta a) / (a - 1)
    hand = 4.0 + math.log(7.0 / 8.0) - math.log(DELTA * 8.0) / 7.0
    assert acc.get_epsilon(DELTA) == pytest.approx(hand, rel=1e-12)
    assert hand == pytest.approx(5.2141092, abs=1e-7)
    # The pitfall: GaussianDpEvent(z) assumes sensitivity C and under-states the RDP four-fold.
    naive = accountant(R1, orders=[order]).compose(dp_event.GaussianDpEvent(z))
    np.testing.assert_allclose(acc.rdp / naive.rdp, [4.0], rtol=1e-15)


def test_replace_one_epochs_as_gaussian_events_equal_the_composition_bound():
    # Each epoch uses every example once: one Gaussian mechanism of sensitivity 2C per epoch.
    z, epochs = 1.7, 4
    standard = accountant().compose(dp_event.GaussianDpEvent(z / 2), epochs)
    ours = accountant(bound="composition").compose(LastIterateDpSgdEvent("reshuffle", 1000, 10, z, epochs * 100, None))
    np.testing.assert_allclose(standard.rdp, ours.rdp, rtol=1e-14)
    np.testing.assert_allclose(standard.rdp, epochs * 2 * np.array(ORDERS) / z**2, rtol=1e-14)


def test_replace_one_random_batches_as_sampled_events_equal_the_composition_bound():
    n, b, z, steps = 1000, 100, 1.5, 200
    step = dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z / 2))
    standard = accountant().compose(step, steps)
    ours = accountant(bound="composition").compose(LastIterateDpSgdEvent("random_batch", n, b, z, steps, None))
    np.testing.assert_allclose(standard.rdp, ours.rdp, rtol=1e-12)


def test_add_or_remove_poisson_steps_equal_the_composition_bound():
    n, b, z, steps = 1000, 50, 1.2, 300
    integer_orders = [o for o in ORDERS if float(o).is_integer()]
    step = dp_event.PoissonSampledDpEvent(b / n, dp_event.GaussianDpEvent(z))
    standard = accountant(AOR, integer_orders).compose(step, steps)
    ours = accountant(AOR, integer_orders, bound="composition").compose(
        LastIterateDpSgdEvent("poisson", n, b, z, steps, None)
    )
    np.testing.assert_allclose(standard.rdp, ours.rdp, rtol=1e-9)


# ---------------------------------------------------------------- PLD: runs certified mu-GDP

HOST_VERSION = tuple(int(x) for x in importlib.metadata.version("dp-accounting").split(".")[:2])
# What the installed PLDAccountant(REPLACE_ONE) does to GaussianDpEvent(s): shift 1 (0.4.3) or 2 (0.6),
# read from the version here, independently of the adapter's measurement.
R1_SHIFT = 2.0 if HOST_VERSION >= (0, 6) else 1.0


def pld(relation=R1, bound="best", interval=1e-4) -> LastIteratePldAccountant:
    return LastIteratePldAccountant(bound=bound, neighboring_relation=relation, value_discretization_interval=interval)


class TestContractPld(AccountantContract):
    # A Gaussian composed n times at once is exact (noise / sqrt(n)); composed one by one, the host
    # convolves discretised PLDs: equal to about 1e-5 at this discretisation (1e-3, for speed), as for
    # dp-accounting's own PLDAccountant below.
    rtol = 1e-4

    def make_accountant(self):
        return pld(interval=1e-3)

    def supported_events(self):
        return [SI_CYCLIC, GAUSS, dp_event.ComposedDpEvent([SI_FULL, dp_event.GaussianDpEvent(2.0)]), SI_SHUFFLE]

    def invalid_events(self):
        bad_noise = attr.evolve(SI_CYCLIC, noise_multiplier=-1.0)
        return [
            (COMPOSITION_RB, COMPOSITION_RB),  # no mu-GDP bound applies to it (random batches)
            (bad_noise, bad_noise),
            (dp_event.GaussianDpEvent(-1.0),) * 2,
            (dp_event.PoissonSampledDpEvent(0.1, SI_CYCLIC), SI_CYCLIC),
            (dp_event.SelfComposedDpEvent(SI_CYCLIC, 0),) * 2,
        ]


class TestContractHostPldAccountant(AccountantContract):
    """dp-accounting's own PLDAccountant meets the contract with the same tolerance."""

    rtol = 1e-4

    def make_accountant(self):
        return dp_pld.PLDAccountant(R1, 1e-3)

    def supported_events(self):
        return [GAUSS, dp_event.ComposedDpEvent([GAUSS, dp_event.GaussianDpEvent(2.0)])]


def test_host_gaussian_shift_is_measured_right():
    assert _pld.host_gaussian_shift(R1) == R1_SHIFT
    assert _pld.host_gaussian_shift(AOR) == 1.0


def test_an_unknown_host_gaussian_convention_is_refused(monkeypatch):
    class OtherShift(dp_pld.PLDAccountant):  # a host reading GaussianDpEvent(s) as a shift of 1.5 / s
        def _maybe_compose(self, event, count, do_compose):
            if isinstance(event, dp_event.GaussianDpEvent):
                event = dp_event.GaussianDpEvent(event.noise_multiplier / 1.5)
            return super()._maybe_compose(event, count, do_compose)

    monkeypatch.setattr(_pld, "_dp_pld", types.SimpleNamespace(PLDAccountant=OtherShift))
    _pld.host_gaussian_shift.cache_clear()
    try:
        with pytest.raises(lp.UnsupportedHostError, match="neither the 1-GDP value"):
            LastIteratePldAccountant()
    finally:
        _pld.host_gaussian_shift.cache_clear()


@pytest.mark.parametrize(
    ("event", "bound"),
    [
        (SI_CYCLIC, "shifted-interpolation-cyclic"),
        (SI_FULL, "shifted-interpolation-full-batch"),
        (SI_CYCLIC, "best"),
        (SI_FULL, "best"),
    ],
    ids=["si-cyclic", "si-full-batch", "best-cyclic", "best-full-batch"],
)
@pytest.mark.parametrize("interval", [1e-4, 1e-2], ids=["fine", "coarse"])
def test_pld_single_run_is_the_core_epsilon_up_to_discretisation(event, bound, interval):
    acc = pld(bound=bound, interval=interval).compose(event)
    winner = lp.epsilon(bound, DELTA, **event.to_params()).winner
    mu = event.gaussian_mu(bound)
    assert lp.BOUNDS[winner].profile(*lp.build(**event.to_params())).mus == (mu,)
    for delta in (1e-3, DELTA, 1e-9):
        core = lp.epsilon(bound, delta, **event.to_params())
        assert core.winner == winner and core.kind is lp.Kind.GDP
        ours = acc.get_epsilon(delta)
        assert ours >= core.epsilon - interval  # never below the exact value by more than the discretisation
        assert ours <= core.epsilon + interval
        # the same through delta: the host's delta at the exact epsilon is the exact mu-GDP delta, rounded up
        assert acc.get_delta(core.epsilon) >= lp.profiles.gdp_delta(mu, core.epsilon) * (1 - 1e-6)
    assert f"mu-GDP by {bound}" in acc.statement(DELTA) and "final model only" in acc.statement(DELTA)


def test_pld_uses_the_worst_position_gaussian_for_shuffle_once():
    # The shuffle-once profile is a mixture (one Gaussian per position), not one Gaussian: best uses
    # shifted-interpolation-cyclic (its largest component, valid for shuffle_once), which is looser.
    acc = pld().compose(SI_SHUFFLE)
    params = SI_SHUFFLE.to_params()
    cyclic = lp.epsilon("shifted-interpolation-cyclic", DELTA, **params).epsilon
    assert acc.get_epsilon(DELTA) == pytest.approx(cyclic, abs=1e-4)
    assert acc.get_epsilon(DELTA) > lp.epsilon("best", DELTA, **params).epsilon + 0.1
    profile = lp.BOUNDS["shifted-interpolation-shuffle"].profile(*lp.build(**params))
    assert SI_SHUFFLE.gaussian_mu() == pytest.approx(profile.max_mu, rel=1e-12)
    with pytest.raises(dp_accounting.UnsupportedEventError, match="mixture of Gaussian privacy profiles"):
        pld(bound="shifted-interpolation-shuffle").compose(SI_SHUFFLE)
    with pytest.raises(lp.NotApplicableError, match="shifted-interpolation-cyclic also covers shuffle_once"):
        SI_SHUFFLE.gaussian_mu("shifted-interpolation-shuffle")


@pytest.mark.parametrize("sampling", ["poisson", "random_batch"])
def test_gaussian_mu_of_a_membership_run_is_refused_with_the_reason(sampling):
    """The membership rows' profiles are mixtures (Poisson: against the run without the record; the smaller
    of two profiles where the exact optimum's law is computed), not one Gaussian: a typed refusal naming
    that, never an AssertionError (it was one for Poisson)."""
    event = attr.evolve(SI_CYCLIC, sampling=sampling, steps=100)
    relation = "add_or_remove_one" if sampling == "poisson" else "replace_one"
    with pytest.raises(lp.NotApplicableError, match="no proven mu-GDP bound"):
        event.gaussian_mu("best", relation)


@pytest.mark.parametrize(
    "other",
    [GAUSS, LAPLACE, dp_event.PoissonSampledDpEvent(0.05, GAUSS)],
    ids=["gaussian", "laplace", "poisson-sampled-gaussian"],
)
def test_pld_composition_is_dp_accountings_own_pld_of_the_dominating_gaussian(other):
    # The run is mu-GDP: the Gaussian mechanism of sensitivity 1 and noise 1/mu, which the installed
    # host's PLDAccountant(REPLACE_ONE) calls GaussianDpEvent(R1_SHIFT / mu). Same discretisation,
    # same compositions in the same order: the same numbers, exactly.
    interval = 1e-3
    mu = SI_CYCLIC.gaussian_mu()
    host = dp_pld.PLDAccountant(R1, interval).compose(dp_event.GaussianDpEvent(R1_SHIFT / mu))
    alone = host.get_epsilon(DELTA)
    ours = pld(interval=interval).compose(SI_CYCLIC)
    assert ours.get_epsilon(DELTA) == alone
    if not host.supports(other):  # 0.4.3: Poisson needs add-or-remove; 0.6: Laplace needs it
        error = ours._maybe_compose(other, 1, False)
        assert error is not None and error.invalid_event is other
        assert HOST_VERSION >= (0, 6) if other is LAPLACE else HOST_VERSION < (0, 6)
        return
    host.compose(other)
    ours.compose(other)
    for delta in (1e-3, DELTA, 1e-9):
        assert ours.get_epsilon(delta) == host.get_epsilon(delta)
    for eps in (0.5, 2.0, 8.0):
        assert ours.get_delta(eps) == host.get_delta(eps)
    assert ours.get_epsilon(DELTA) > alone


def test_pld_is_tighter_than_rdp_for_a_run_composed_with_standard_events():
    pipeline = dp_event.ComposedDpEvent([SI_CYCLIC, dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(3.0), 4)])
    via_pld = pld(interval=1e-3).compose(pipeline).get_epsilon(DELTA)
    via_rdp = accountant().compose(pipeline).get_epsilon(DELTA)
    if R1_SHIFT == 1.0:  # same meaning of GaussianDpEvent in both accountants (0.4.3)
        assert via_pld < via_rdp
    mu = math.hypot(SI_CYCLIC.gaussian_mu(), 2.0 * R1_SHIFT / 3.0)  # GDP composition: exact
    exact = lp.profiles.gdp_epsilon(mu, DELTA)
    assert exact - 1e-3 <= via_pld <= exact + 1e-2


def test_pld_refusals_say_why_and_what_to_use():
    with pytest.raises(dp_accounting.UnsupportedEventError, match="no proven mu-GDP bound"):
        pld().compose(COMPOSITION_RB)
    # a cyclic run without a last-iterate mu-GDP bound composes as its every-iterate Gaussian composition
    assert pld().compose(KR).get_epsilon(DELTA) == pytest.approx(
        lp.epsilon("composition-gdp-epochs", DELTA, **KR.to_params()).epsilon, rel=1e-3
    )
    with pytest.raises(ValueError, match="Renyi-DP bound: use LastIterateAccountant"):
        LastIteratePldAccountant(bound="kong-ribero-cyclic")
    with pytest.raises(ValueError, match="value_discretization_interval must be a finite number > 0"):
        pld(interval=0.0)
    with pytest.raises(ValueError, match="neighboring_relation must be REPLACE_ONE or ADD_OR_REMOVE_ONE"):
        pld(relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
    with pytest.raises(lp.NotApplicableError, match="Renyi-DP bound, not a mu-GDP one"):
        SI_CYCLIC.gaussian_mu("ye-shokri-convex")
    # add-or-remove: standard events work, no mu-GDP bound is proven for the runs
    acc = pld(AOR, interval=1e-3).compose(POISSON)
    assert acc.get_epsilon(DELTA) == dp_pld.PLDAccountant(AOR, 1e-3).compose(POISSON).get_epsilon(DELTA)
    assert not acc.supports(SI_CYCLIC)


def test_pld_zero_noise_run_is_non_private():
    acc = pld().compose(attr.evolve(SI_CYCLIC, noise_multiplier=0))
    assert acc.get_epsilon(DELTA) == math.inf and acc.get_delta(100.0) == 1.0
    assert attr.evolve(SI_CYCLIC, noise_multiplier=0).gaussian_mu() == math.inf
    assert "a non-private operation" in acc.statement(DELTA)


# ---------------------------------------------------------------- every declaration; a run alone by its profile

#: The GLM route with torch weight decay outside the clip (issue "One number on every route"): the event
#: takes the declarations lp.rdp takes, and gives lp.epsilon's number (no false gradient_norms_within_clip).
GLM_WEIGHT_DECAY = dict(sampling="reshuffle", dataset_size=2000, batch_size=100, noise_multiplier=1.0, steps=400,
                        learning_rate=0.5, smoothness=0.26, strong_convexity=0.01, clipped_loss_convex_smooth=True,
                        l2_outside_clip=True)  # fmt: skip
#: The issue's reshuffle-like run with Poisson sampling: only rows without a Renyi curve apply.
POISSON_PROFILE_ONLY = dict(
    sampling="poisson",
    dataset_size=1000,
    batch_size=50,
    noise_multiplier=4.0,
    steps=400,
    learning_rate=1.0,
    smoothness=0.25,
    strong_convexity=0.05,
    gradient_norms_within_clip=True,
    diameter=40.0,
)  # fmt: skip  (lam D / 2 = C: possible)


def test_the_event_takes_every_declaration_of_the_core_and_gives_its_number():
    event = LastIterateDpSgdEvent(**GLM_WEIGHT_DECAY)
    assert event.to_params() == {k: v for k, v in {**GLM_WEIGHT_DECAY, **event.to_params()}.items()}
    acc = LastIterateAccountant(neighboring_relation=R1)
    acc.compose(event)
    core = lp.epsilon("best", DELTA, **event.to_params())
    assert acc.get_epsilon(DELTA) == core.epsilon
    # without the declarations the run gets a larger (every-iterate) number: they matter
    plain = {**GLM_WEIGHT_DECAY, "clipped_loss_convex_smooth": False, "l2_outside_clip": False}
    assert lp.epsilon("best", DELTA, **plain).epsilon > 1.5 * core.epsilon
    assert dp_event.DpEvent.from_named_tuple(event.to_named_tuple()) == event


@pytest.mark.parametrize(
    ("bound", "relation"),
    [("best", R1), ("shifted-interpolation-poisson-replace-one", R1), ("shifted-interpolation-poisson", AOR)],
)
def test_a_run_alone_gets_the_cores_number_from_its_profile(bound, relation):
    event = LastIterateDpSgdEvent(**POISSON_PROFILE_ONLY)
    acc = LastIterateAccountant(bound=bound, neighboring_relation=relation)
    assert acc.supports(event)
    acc.compose(event)
    core_relation = "replace_one" if relation == R1 else "add_or_remove_one"
    core = lp.epsilon(bound, DELTA, relation=core_relation, **event.to_params())
    eps, order = acc.get_epsilon_and_optimal_order(DELTA)
    assert (eps, order) == (core.epsilon, core.order)
    assert acc.get_delta(eps) <= DELTA * (1 + 1e-6)


def test_a_run_without_a_renyi_curve_is_refused_in_company_and_the_ledger_is_untouched():
    event = LastIterateDpSgdEvent(**POISSON_PROFILE_ONLY)
    gaussian = dp_event.GaussianDpEvent(2.0)
    acc = LastIterateAccountant(neighboring_relation=R1)  # replace-one: the run's rows have no Renyi curve
    acc.compose(event)
    before = acc.get_epsilon(DELTA)
    for other in (gaussian, event):
        assert not acc.supports(other)
        with pytest.raises(dp_accounting.UnsupportedEventError, match="no Renyi-DP curve"):
            acc.compose(other)
    assert acc.get_epsilon(DELTA) == before and acc.ledger == event
    # the other order: a standard event first, then the run
    acc = LastIterateAccountant(neighboring_relation=R1)
    acc.compose(gaussian)
    assert not acc.supports(event)
    with pytest.raises(dp_accounting.UnsupportedEventError, match="answered on its own"):
        acc.compose(event)
    # twice the same run is two events
    with pytest.raises(dp_accounting.UnsupportedEventError):
        LastIterateAccountant(neighboring_relation=R1).compose(event, 2)


def test_statements_say_what_the_winner_protects():
    """The issue: the PLD accountant's statement said "final model only" when the winner (a standard
    baseline) covers every iterate."""
    plain = LastIterateDpSgdEvent("reshuffle", 2000, 100, 1.0, 400, 0.5)  # best: composition-gdp-epochs
    for acc in (LastIterateAccountant(neighboring_relation=R1), LastIteratePldAccountant()):
        acc.compose(plain)
        text = acc.statement(DELTA)
        assert "every iterate of 1 DP-SGD run(s)" in text and "final model only" not in text
        assert "composition-gdp-epochs" in text
    for acc in (LastIterateAccountant(neighboring_relation=R1), LastIteratePldAccountant()):
        acc.compose(SI_CYCLIC)
        text = acc.statement(DELTA)
        assert "the final model only of 1 DP-SGD run(s)" in text and "shifted-interpolation-cyclic" in text
    # composed with another mechanism: the per-order minimum may use a last-iterate curve
    acc = LastIterateAccountant(orders=ORDERS, neighboring_relation=R1).compose(SI_CYCLIC).compose(GAUSS)
    assert "the final model only" in acc.statement(DELTA)
    acc = LastIterateAccountant(bound="composition", orders=ORDERS, neighboring_relation=R1).compose(SI_CYCLIC)
    acc.compose(GAUSS)
    assert "every iterate of 1 DP-SGD run(s), bound composition" in acc.statement(DELTA)


def test_the_accountant_defaults_to_add_or_remove_as_dp_accounting_s_do_and_says_so():
    """LastIterateAccountant() accounts under ADD_OR_REMOVE_ONE, the default of dp-accounting's accountants and
    the relation a Poisson run defaults to everywhere (it was REPLACE_ONE): a FutureWarning says so until 0.4.0.
    A run of a scheme with replace-one bounds only is refused, naming what to pass (as dp-accounting refuses
    a SampledWithoutReplacementDpEvent under ADD_OR_REMOVE_ONE)."""
    with pytest.warns(FutureWarning) as caught:
        acc = LastIterateAccountant()
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith("LastIterateAccountant() without neighboring_relation accounts under ADD_OR_REMOVE_ONE")
    assert "since lastiter-plugins 0.3.0 (0.2.0 used REPLACE_ONE" in message and "goes in 0.4.0" in message
    assert "neighboring_relation=NeighboringRelation.REPLACE_ONE to keep the 0.2.0 numbers" in message
    assert warning.filename == __file__
    assert acc.neighboring_relation is AOR and acc.relation is lp.Relation.ADD_OR_REMOVE_ONE
    poisson = LastIterateDpSgdEvent("poisson", 1000, 10, 1.0, 200, None)
    acc.compose(poisson)
    core = lp.epsilon("best", DELTA, relation="add_or_remove_one", **poisson.to_params())
    assert acc.get_epsilon(DELTA) == core.epsilon and "under add_or_remove_one neighbours" in acc.statement(DELTA)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        explicit = LastIterateAccountant(neighboring_relation=AOR)
        assert not explicit.supports(KR)
        with pytest.raises(dp_accounting.UnsupportedEventError, match=r"Runs with sampling=cyclic are accounted "
                           r"under replace_one: pass neighboring_relation=NeighboringRelation\.REPLACE_ONE"):  # fmt: skip
            explicit.compose(KR)
        # the event's own methods follow its scheme's default; no warning where it did not change
        np.testing.assert_array_equal(KR.rdp(orders=ORDERS), KR.rdp(orders=ORDERS, neighboring_relation=R1))
    with pytest.warns(FutureWarning, match="neighboring_relation left out with sampling='poisson'"):
        curve = poisson.rdp(orders=ORDERS)
    np.testing.assert_array_equal(curve, poisson.rdp(orders=ORDERS, neighboring_relation=AOR))


# ---------------------------------------------------------------- issue 38: unproven bounds, huge values

#: issue 38's run: random batches, strongly convex, within the clip, projected (altschuler-talwar applies, unproven)
RB_STRONGLY_CONVEX = LastIterateDpSgdEvent(
    "random_batch", 1000, 50, 4.0, 400, 1.0, smoothness=0.25, strong_convexity=0.05, diameter=2.0,
    gradient_norms_within_clip=True,
)  # fmt: skip
UNPROVEN = "altschuler-talwar"
_UNPROVEN_WARNING = r"altschuler-talwar is unproven: .* Its number is not a privacy guarantee; best never uses it\."


def test_an_unproven_bound_is_marked_and_warned_about_on_every_route():
    """issue 38: LastIterateAccountant(bound="altschuler-talwar") stated 1.535 as a plain guarantee, with no mark
    and no warning, where best (proven) is 2.540."""
    acc = LastIterateAccountant(bound=UNPROVEN, neighboring_relation=R1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # composing states no number: no warning there
        assert acc.supports(RB_STRONGLY_CONVEX)
        acc.compose(RB_STRONGLY_CONVEX)
    core = lp.epsilon(UNPROVEN, DELTA, relation="replace_one", **RB_STRONGLY_CONVEX.to_params())
    assert not core.proof.proven and f"From {UNPROVEN}: unproven: " in str(core)  # the API marks it (the answer's line)
    for bare in (acc.get_epsilon, acc.get_epsilon_and_optimal_order):
        with pytest.warns(lp.UnprovenBoundWarning, match=_UNPROVEN_WARNING) as caught:
            found = bare(DELTA)
        assert caught[0].filename == __file__  # at the user's line
    assert found[0] == core.epsilon == pytest.approx(1.535, abs=5e-4)
    with pytest.warns(lp.UnprovenBoundWarning, match=_UNPROVEN_WARNING):
        acc.get_delta(1.0)
    with pytest.warns(lp.UnprovenBoundWarning):
        statement = acc.statement(DELTA)
    assert f"bound {UNPROVEN} [unproven: the proof of Theorem 3.1" in statement
    assert f"From {UNPROVEN}: unproven: the proof of Theorem 3.1" in " ".join(statement.split())  # the answer too
    with pytest.warns(lp.UnprovenBoundWarning, match=_UNPROVEN_WARNING):
        RB_STRONGLY_CONVEX.rdp(UNPROVEN, ORDERS, R1)
    with pytest.warns(lp.UnprovenBoundWarning):  # composed with another mechanism: the sum on the grid
        composed = acc.compose(GAUSS).statement(DELTA)
    assert f"bound {UNPROVEN} [unproven: " in composed
    # best (proven) on the same run: no mark, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        best = LastIterateAccountant(neighboring_relation=R1).compose(RB_STRONGLY_CONVEX)
        assert best.get_epsilon(DELTA) == pytest.approx(2.540, abs=5e-4)
        assert "unproven" not in best.statement(DELTA)
        RB_STRONGLY_CONVEX.rdp("best", ORDERS, R1)
        LastIterateAccountant(bound=UNPROVEN, neighboring_relation=R1).compose(GAUSS).get_epsilon(DELTA)  # no run


def test_the_pld_accountant_marks_and_warns_about_an_unproven_winner(monkeypatch):
    """No mu-GDP row is unproven today; were one, the PLD accountant would mark and warn as the RDP one does."""
    from lastiter_plugins import registry

    assert all(lp.BOUNDS[b].proof.proven for b in _pld._gdp.gdp_bound_ids())
    row = "shifted-interpolation-cyclic"
    doubtful = dict(lp.BOUNDS)
    doubtful[row] = dataclasses.replace(lp.BOUNDS[row], proof=lp.Proof(False, "a test's doubt"))
    for namespace in (lp, registry):
        monkeypatch.setattr(namespace, "BOUNDS", types.MappingProxyType(doubtful))
    acc = LastIteratePldAccountant(bound=row).compose(SI_CYCLIC)
    with pytest.warns(lp.UnprovenBoundWarning, match=f"{row} is unproven: a test's doubt"):
        acc.get_epsilon(DELTA)
    with pytest.warns(lp.UnprovenBoundWarning):
        acc.get_delta(1.0)
    with pytest.warns(lp.UnprovenBoundWarning):
        assert f"[{row}: unproven: a test's doubt]" in acc.statement(DELTA)


@pytest.mark.parametrize("make", [lambda: accountant(R1), LastIteratePldAccountant], ids=["rdp", "pld"])
def test_huge_counts_and_values_get_one_line_value_errors(make):
    """issue 38: compose(event, 10**400) raised OverflowError; the library's counts are at most 2**53."""
    acc = make().compose(SI_CYCLIC)
    before = snapshot(acc)
    with pytest.raises(ValueError, match=r"^count must be an integer <= 2\*\*53 = 9007199254740992 \(the supported "
                       r"range is \[1, 2\*\*53\]\)\. Found 1\.000e\+400 \(an integer\)\.$"):  # fmt: skip
        acc.compose(GAUSS, 10**400)
    assert "count must be an integer <= 2**53" in acc._maybe_compose(GAUSS, 10**400, False).error_message
    with pytest.raises(ValueError, match=r"^target_delta must be in \[0, 1\]\. Found 1\.000e\+400 \(an integer\)\.$"):
        acc.get_epsilon(10**400)
    with pytest.raises(ValueError, match=r"^target_epsilon must be a number >= 0 that a double holds .* Found 1\.000e"):
        acc.get_delta(10**400)
    assert_same_state(before, snapshot(acc))


@pytest.mark.parametrize(
    ("event", "named"),
    [
        (dp_event.GaussianDpEvent(10**400), "GaussianDpEvent.noise_multiplier must be a number >= 0 that a double"),
        (dp_event.LaplaceDpEvent(-(10**400)), "LaplaceDpEvent.noise_multiplier must be a number > 0. Found -1.000e"),
        (dp_event.SelfComposedDpEvent(GAUSS, 10**400), "SelfComposedDpEvent.count must be an integer <= 2**53"),
        (dp_event.SelfComposedDpEvent(dp_event.SelfComposedDpEvent(GAUSS, 2**30), 2**30),
         "SelfComposedDpEvent.count times the count it is composed with must be <= 2**53"),
        (dp_event.SampledWithoutReplacementDpEvent(10**400, 10, GAUSS),
         "SampledWithoutReplacementDpEvent.source_dataset_size must be an integer <= 2**53"),
        (attr.evolve(SI_CYCLIC, steps=10**400), "steps must be an integer <= 2**53"),
    ],
    ids=["gaussian", "laplace", "self-composed", "nested-counts", "sampled", "run-steps"],
)  # fmt: skip
def test_huge_values_in_events_are_refused_naming_the_field(event, named):
    for acc in (accountant(R1), LastIteratePldAccountant()):
        assert_refused_untouched(acc.compose(SI_CYCLIC), event)
        assert named in acc._maybe_compose(event, 1, False).error_message


def test_huge_constructor_values_get_one_line_value_errors():
    with pytest.raises(ValueError, match=r"^orders must be finite and > 1\. Found 1\.000e\+400 \(an integer\)\.$"):
        LastIterateAccountant(orders=[2.0, 10**400], neighboring_relation=R1)
    with pytest.raises(
        ValueError, match=r"^value_discretization_interval must be a finite number > 0\. Found 1\.000e\+400"
    ):
        LastIteratePldAccountant(value_discretization_interval=10**400)


@pytest.mark.parametrize("make", [lambda: accountant(R1), LastIteratePldAccountant], ids=["rdp", "pld"])
def test_delta_at_a_huge_epsilon_is_a_number(make):
    """issue 38: get_delta(1e308) raised scipy's "f(a) and f(b) must have different signs" (the answer is 0)."""
    for events in ([SI_CYCLIC], [SI_CYCLIC, GAUSS]):
        acc = make()
        for event in events:
            acc.compose(event)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            deltas = [acc.get_delta(eps) for eps in (1e300, 1e308, sys.float_info.max, math.inf)]
        assert all(0.0 <= d <= acc.get_delta(10.0) for d in deltas), deltas
    best = LastIterateAccountant(neighboring_relation=R1).compose(RB_STRONGLY_CONVEX)  # the run
    assert best.get_delta(1e308) == 0.0


def test_pld_delta_beyond_the_hosts_overflow_is_never_below_the_truth():
    """dp-accounting's PLD gives NaN beyond epsilon 709 (exp overflows); the adapter answers delta at 700, valid since
    delta does not increase with epsilon. Ground truth: a Gaussian of mu = 40 (privacy losses up to about 1200),
    whose exact delta at epsilon 800 is about 0.49 (Dong, Roth & Su 2019, Cor. 2.13)."""
    acc = LastIteratePldAccountant(value_discretization_interval=1e-2)
    mu = 40.0
    acc.compose(dp_event.GaussianDpEvent(acc.host_gaussian_shift / mu))
    exact = lp.profiles.gdp_delta(mu, 800.0)
    assert 0.4 < exact < 0.6
    assert exact <= acc.get_delta(800.0) <= acc.get_delta(700.0) <= 1.0
    assert acc.get_delta(1e308) == acc.get_delta(700.0) >= float(lp.profiles.gdp_delta(mu, 1e308))


# ---------------------------------------------------------------- the example


def test_example_runs_and_its_numbers_hang_together(capsys):
    """examples/dp_accounting_last_iterate.py (docs/dp_accounting.md's complete run)."""
    spec = importlib.util.spec_from_file_location(
        "dp_accounting_example", ROOT / "examples" / "dp_accounting_last_iterate.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main()
    out = capsys.readouterr().out

    def number(label: str) -> float:
        return float(re.search(re.escape(label) + r" epsilon = ([\d.]+)", out).group(1))

    standard, alone = number("standard RDP accounting (every iterate released):"), number("last-iterate run alone:")
    rdp, pld = number("last-iterate accountant (RDP):"), number("last-iterate accountant (PLD):")
    assert alone < pld < rdp < standard  # the feature mean costs something; the PLD composes it more tightly
    assert number("ledger replayed into a fresh accountant:") == rdp
    assert float(re.search(r"\(check: epsilon = ([\d.]+)\)", out).group(1)) <= 3.0
    # each statement: the answer first (its line ends "...for the final model only; <relation>"), then the ledger
    assert out.count("for the final model only;") == 3 and out.count("for the final model only of") == 3
    assert "replace_one" in out


# ---------------------------------------------------------------- issue 41: the answer first, no impossible declarations


@pytest.mark.parametrize("make", [accountant, pld], ids=["rdp", "pld"])
def test_declarations_no_loss_meets_are_refused(make):
    """A real run has real losses: strongly convex with every gradient within the clip and no projection (or a
    projection too wide for the clip, lam D / 2 > C) is an event no accountant composes; lam D / 2 = C is."""
    no_projection = attr.evolve(SI_FULL, diameter=None)
    too_wide = attr.evolve(SI_FULL, diameter=30.0)
    for event, match in (
        (no_projection, r"no loss meets these declarations: .*strong_convexity=0\.1 with gradient_norms_within_clip"),
        (too_wide, r"no loss meets these declarations: strong_convexity \* diameter / 2 = 1\.5 > clip_norm = 1"),
    ):
        acc = make()
        assert not acc.supports(event)
        with pytest.raises(dp_accounting.UnsupportedEventError, match=match + r".*LastIterateDpSgdEvent"):
            acc.compose(event)
        with pytest.raises(lp.NotApplicableError, match=match):
            event.rdp("best", ORDERS, R1)
    assert make().supports(SI_FULL)  # diameter 20: 0.1 * 20 / 2 = C


@pytest.mark.parametrize("make", [accountant, pld], ids=["rdp", "pld"])
def test_the_statement_starts_with_the_answer(make):
    """issue 41: statement() starts with the answer (the number, what it protects, its relation, the winning row and
    its provenance) in a few lines of at most 120 characters, then the ledger's one line."""
    acc = make().compose(SI_CYCLIC)
    eps = acc.get_epsilon(DELTA)
    lines = acc.statement(DELTA).split("\n")
    assert lines[0].startswith(f"epsilon = {eps:.4g} at delta = {DELTA:g} for the final model only; replace_one")
    assert "\n  From shifted-interpolation-cyclic: published (" in "\n".join(lines)
    assert lines[-1].startswith(f"({eps:.4g}, {DELTA:g})-DP under replace_one neighbours")
    assert len(lines) <= 10 and max(map(len, lines[:-1])) <= 120
    composed = make().compose(SI_CYCLIC).compose(GAUSS)
    assert composed.statement(DELTA).startswith(f"epsilon = {composed.get_epsilon(DELTA):.4g} at delta = ")
