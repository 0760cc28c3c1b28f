"""lastiter_plugins.validation: the public edge validates delta and the orders once; the layers below
trust them (evaluation, conversion, calibration's search, the adapters' calls into the core)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins import api, calibration, compare, evaluation, host, validation
from lastiter_plugins.adapters import dp_accounting as lp_dpa

DELTA = 1e-5
PARAMS = dict(dataset_size=1000, batch_size=50, noise_multiplier=2.0, epochs=5, sampling="shuffle_once",
              learning_rate=0.5, smoothness=0.26, strong_convexity=0.01, l2_outside_clip=True,
              clipped_loss_convex_smooth=True)  # fmt: skip

#: every module that imports a validator by name (so that a spy replaces each)
_IMPORTERS = (
    api,
    calibration,
    evaluation,
    compare.table,
    compare.sweep,
    host,
    lp_dpa._events,
    lp_dpa._rdp,
    lp_dpa._pld,
)


@pytest.fixture
def counted(monkeypatch):
    calls = {"validate_delta": 0, "validate_orders": 0}
    for name in calls:
        real = getattr(validation, name)

        def spy(*args, _name=name, _real=real, **kwargs):
            if args and args[0] is not None:  # validate_orders(None) is the default grid, not a check
                calls[_name] += 1
            return _real(*args, **kwargs)

        for module in _IMPORTERS:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, spy)
    return calls


def test_epsilon_validates_delta_once(counted):
    lp.epsilon("best", DELTA, **PARAMS)
    assert counted["validate_delta"] == 1


def test_compute_epsilon_validates_delta_and_orders_once(counted):
    config, assumptions = lp.build(**PARAMS)
    lp.epsilon("best", DELTA, [2.0, 4.0, 8.0], config=config, assumptions=assumptions)
    assert counted == {"validate_delta": 1, "validate_orders": 1}


def test_rdp_validates_orders_once(counted):
    lp.rdp("best", [2.0, 4.0], **PARAMS)
    assert counted["validate_orders"] == 1


def test_calibration_validates_once_however_many_points_it_tries(counted):
    lp.calibrate_noise("best", 3.0, DELTA, orders=[2.0, 4.0, 8.0, 16.0], **PARAMS)
    assert counted == {"validate_delta": 1, "validate_orders": 1}


def test_dp_accounting_event_rdp_validates_its_orders_once(counted):
    event = lp_dpa.LastIterateDpSgdEvent(
        dataset_size=1000, batch_size=50, noise_multiplier=2.0, steps=100, sampling="shuffle_once", learning_rate=0.5
    )
    event.rdp("composition", orders=[2.0, 4.0])
    assert counted["validate_orders"] == 1


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-5, math.nan, True, "1e-5", None])
def test_invalid_delta_is_refused_at_the_edge(bad):
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\)"):
        lp.epsilon("best", bad, **PARAMS)


@pytest.mark.parametrize("bad", [[1.0], [0.5, 2.0], [math.inf], [], "x"])
def test_invalid_orders_are_refused_at_the_edge(bad):
    with pytest.raises(ValueError, match="orders"):
        lp.rdp("best", bad, **PARAMS)


@pytest.mark.parametrize(
    ("name", "value"),
    [("target_epsilon", 0.0), ("target_epsilon", math.inf), ("max_noise_multiplier", -1.0), ("rtol", math.nan)],
)
def test_calibration_refuses_non_positive_numbers(name, value):
    kwargs = {"target_epsilon": 3.0, "max_noise_multiplier": 1e4, "rtol": 1e-4, name: value}
    target = kwargs.pop("target_epsilon")
    with pytest.raises(ValueError, match=f"{name} must be a finite number > 0"):
        lp.calibrate_noise("best", target, DELTA, **kwargs, **PARAMS)


def test_validate_epsilon_accepts_zero_and_inf_and_refuses_negatives():
    assert validation.validate_epsilon(0) == 0.0
    assert validation.validate_epsilon(math.inf) == math.inf
    for bad in (-1.0, math.nan, True, "1"):
        with pytest.raises(ValueError, match="epsilon must be a number >= 0"):
            validation.validate_epsilon(bad)


_HUGE = "Found 1.000e+400 (an integer)."


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: lp.epsilon("best", 10**400, **PARAMS), f"delta must be in (0, 1). {_HUGE}"),
        (lambda: lp.rdp("best", [2.0, 10**400], **PARAMS), f"orders must be finite and > 1. {_HUGE}"),
        (lambda: lp.calibrate_noise("best", 10**400, DELTA, **PARAMS), f"target_epsilon must be a finite number > 0. {_HUGE}"),
        (lambda: validation.validate_epsilon(10**400),
         f"epsilon must be a number >= 0 that a double holds (at most 1.8e308, or inf). {_HUGE}"),
        (lambda: validation.validate_epsilon(-(10**400)), "epsilon must be a number >= 0. Found -1.000e+400 (an integer)."),
    ],
    ids=["delta", "orders", "target-epsilon", "epsilon", "negative-epsilon"],
)  # fmt: skip
def test_integers_beyond_a_double_get_the_one_line_message(call, message):
    """issue 38: an integer no double holds raised OverflowError (float(10**400)); it is named, abbreviated."""
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value) == message


def test_default_orders_are_read_only_and_copied():
    grid = validation.validate_orders(None)
    grid[0] = 99.0
    assert lp.DEFAULT_ORDERS[0] != 99.0
    with pytest.raises(ValueError):
        lp.DEFAULT_ORDERS[0] = 1.5
    assert np.all(lp.DEFAULT_ORDERS > 1)
