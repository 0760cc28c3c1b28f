"""Robustness of the public API and the CLI under invalid input (hypothesis).

Contract: every invalid input raises ValueError (NotApplicableError and
CalibrationError are subclasses) naming the parameter or, on the command line,
exits with status 2 and ONE line on stderr; never another exception type, a NaN,
a negative epsilon, or a finite epsilon for a violated precondition. A value that
is valid after all (None for an optional parameter, -0.0 for a lower bound of 0,
a boolean for a flag) gives exactly what the API gives for the same pipeline
spelled canonically. Extreme but valid values: tests/core/test_numerics.py.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import lastiter_plugins as lp
from tests.support import cli_flags, pipeline, strongly_convex

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
BOUNDS = list(lp.BOUND_IDS)
SAMPLINGS = [s.value for s in lp.Sampling]
VALID = strongly_convex(steps=300, diameter=1.0, sampling="shuffle_once")
ORDERS = [2.0, 8.0]

BAD_NUMBERS = st.one_of(
    st.floats(max_value=0.0, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, -0.0, 1e308 * 10]),
    st.text(max_size=5),
    st.sampled_from([None, True, False, [1.0], {}, object(), 1j]),
)


# What each parameter accepts (an oracle written from the README, independent of config.py):
# "count" an integer >= 1; "positive" a finite number > 0; "nonnegative" a finite number >= 0;
# "flag" True or False; "choice" one of the listed names. OPTIONAL parameters may be None
# (not declared / the default); REQUIRED ones may not.
KINDS = {
    "dataset_size": "count",
    "batch_size": "count",
    "steps": "count",
    "noise_multiplier": "positive",
    "learning_rate": "positive",
    "clip_norm": "positive",
    "diameter": "positive",
    "smoothness": "nonnegative",
    "weak_convexity": "nonnegative",
    "strong_convexity": "nonnegative",
    "gradient_norms_within_clip": "flag",
    "sampling": "choice",
    "relation": "choice",
}
OPTIONAL = {"learning_rate", "clip_norm", "diameter", "smoothness", "relation"}


def _accepted(key, value):
    """(accepted, canonical value): whether ``key=value`` is a valid value on its own, by KINDS."""
    if value is None:
        return key in OPTIONAL, None
    kind = KINDS[key]
    if kind == "flag":
        return isinstance(value, bool), value
    if kind == "choice":
        return False, None  # BAD_NUMBERS never holds a sampling scheme or relation name
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False, None
    if kind == "count":
        return value >= 1 and int(value) == value, int(value)
    if kind == "positive":
        return value > 0, float(value)
    return value >= 0, float(value) + 0.0  # -0.0 + 0.0 == 0.0


def _canonical(params):
    """The same pipeline with None meaning "not given" (the README's default)."""
    return {k: v for k, v in params.items() if v is not None}


def _quiet(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lp.OrderGridWarning)
        return call()


def _outcome(call, params):
    """("value", v), ("not applicable", message) or ("invalid", message) of ``call(params)``."""
    try:
        return "value", _quiet(lambda: call(params))
    except lp.NotApplicableError as exc:
        return "not applicable", str(exc)
    except ValueError as exc:
        return "invalid", str(exc)


CALLS = {
    "rdp": lambda bound, p: lp.rdp(bound, ORDERS, **p).tolist(),
    "epsilon": lambda bound, p: [lp.epsilon(bound, 1e-5, **p).epsilon],
    "applicable_bounds": lambda bound, p: {b: e.applies for b, e in lp.applicable_bounds(**p).items()},
}


# ------------------------------------------------------------------ API: invalid values


@pytest.mark.parametrize("key", sorted(KINDS))
@settings(max_examples=25, deadline=None)
@given(value=BAD_NUMBERS, bound=st.sampled_from(BOUNDS))
def test_invalid_parameter_values_raise_value_error_naming_the_parameter(key, value, bound):
    """A value that is invalid (by KINDS, or with the rest of VALID: smoothness below strong_convexity)
    raises a plain ValueError naming the parameter from rdp, epsilon and applicable_bounds; a valid one
    gives exactly the canonical pipeline's outcome: the same refusal, or the same numbers, >= 0 and finite."""
    params = {**VALID, key: value}
    accepted, canonical_value = _accepted(key, value)
    if key == "smoothness" and accepted and canonical_value is not None:
        accepted = canonical_value >= VALID["strong_convexity"]  # strong_convexity must be <= smoothness
    canonical = _canonical({**VALID, key: canonical_value})
    for name, call in CALLS.items():
        kind, got = _outcome(functools.partial(call, bound), params)
        if not accepted:
            assert kind == "invalid", (name, key, value, kind, got)
            assert key in got, (name, key, value, got)
            continue
        expected = _outcome(functools.partial(call, bound), canonical)
        assert expected[0] != "invalid", (name, canonical, expected)
        assert (kind, got) == expected, (name, key, value)
        if kind == "value" and name != "applicable_bounds":
            assert all(math.isfinite(v) and v >= 0 for v in got), (name, key, value, got)


@SETTINGS
@given(orders=st.one_of(
    st.lists(st.floats(max_value=1.0), min_size=1, max_size=3),
    st.sampled_from([[], "abc", [[2.0, 3.0], [4.0]], [math.nan], [math.inf], [2.0, "x"], 1.0]),
))  # fmt: skip
def test_invalid_orders_raise_value_error(orders):
    with pytest.raises(ValueError):
        lp.rdp("composition", orders, **VALID)


@SETTINGS
@given(delta=st.one_of(st.floats().filter(lambda d: not 0 < d < 1), st.sampled_from([True, "1e-5", None, 1j])))
def test_invalid_delta_raises_value_error(delta):
    with pytest.raises(ValueError):
        lp.epsilon("composition", delta, **VALID)


@SETTINGS
@given(target=st.one_of(st.floats(max_value=0.0), st.sampled_from([math.inf, math.nan, "1", None, True])))
def test_invalid_calibration_target_raises_value_error(target):
    with pytest.raises(ValueError):
        lp.calibrate_noise("composition", target, 1e-5, **{k: v for k, v in VALID.items() if k != "noise_multiplier"})


@SETTINGS
@given(
    bound=st.one_of(st.text(max_size=12).filter(lambda s: s not in lp.BOUND_IDS), st.sampled_from([None, 3, b"best"]))
)
def test_unknown_bound_raises_value_error(bound):
    with pytest.raises(ValueError):
        lp.rdp(bound, [2.0], **VALID)


def test_unknown_or_missing_parameters_raise_value_error():
    with pytest.raises(ValueError, match="unknown parameter"):
        lp.rdp("composition", [2.0], lr=0.1, **VALID)
    for key in ("dataset_size", "batch_size", "noise_multiplier", "sampling"):
        with pytest.raises(ValueError, match=key):
            lp.rdp("composition", [2.0], **{k: v for k, v in VALID.items() if k != key})
    with pytest.raises(ValueError, match="exactly one of steps and epochs"):
        lp.rdp("composition", [2.0], epochs=3, **VALID)


# ------------------------------------------------------------------ API: preconditions


PIPELINES = st.fixed_dictionaries(
    {
        "dataset_size": st.integers(1, 500),
        "batch_size": st.integers(1, 50),
        "noise_multiplier": st.floats(0.2, 20.0),
        "steps": st.integers(1, 3000),
        "sampling": st.sampled_from(SAMPLINGS),
        "relation": st.sampled_from(["replace_one", "add_or_remove_one"]),
        "learning_rate": st.one_of(st.none(), st.floats(1e-4, 10.0)),
        "smoothness": st.one_of(st.none(), st.floats(0.0, 10.0)),
        "weak_convexity": st.floats(0.0, 2.0) | st.just(0.0),
        "strong_convexity": st.just(0.0) | st.floats(0.0, 1.0),
        "diameter": st.one_of(st.none(), st.floats(1e-3, 100.0)),
        "gradient_norms_within_clip": st.booleans(),
    }
).filter(lambda p: p["batch_size"] <= p["dataset_size"])


def _drop_inconsistent(p):
    if p["smoothness"] is not None and p["strong_convexity"] > p["smoothness"]:
        p["strong_convexity"] = p["smoothness"]
    return p


# best on a pipeline whose only valid proven bound is a PLD row (no Renyi curve to take the minimum of)
_ONLY_PLD = dict(dataset_size=1, batch_size=1, noise_multiplier=1.0, steps=1, sampling="poisson",
                 relation="replace_one", learning_rate=None, smoothness=None, weak_convexity=0.0,
                 strong_convexity=0.0, diameter=None, gradient_norms_within_clip=False)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(params=PIPELINES.map(_drop_inconsistent), bound=st.sampled_from(BOUNDS))
@example(params=_ONLY_PLD, bound="best")
def test_a_bound_that_does_not_apply_never_returns_a_number(params, bound):
    apps = lp.applicable_bounds(**params)
    app = apps[bound]
    # the proven bounds best takes its minimum over (those valid for the declared relation)
    usable = [e for e in apps.values() if e.bound != "best" and e.applies and e.proof.proven]
    usable = [e for e in usable if e.relation is apps["best"].relation]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not app.applies:
            with pytest.raises(lp.NotApplicableError):
                lp.rdp(bound, [2.0, 8.0], **params)
            with pytest.raises(lp.NotApplicableError):
                lp.epsilon(bound, 1e-5, **params)
            assert app.reasons and all(r for r in app.reasons)
        else:
            if bound in lp.BOUNDS and not lp.BOUNDS[bound].has_renyi_curve:  # a profile without a Renyi curve
                with pytest.raises(lp.NotApplicableError, match="no Renyi-DP curve"):
                    lp.rdp(bound, [2.0, 8.0], **params)
            elif bound == "best" and all(not lp.BOUNDS[e.bound].has_renyi_curve for e in usable):
                # best's Renyi curve is the minimum of the valid bounds' curves: none has one, so it refuses
                # (naming the PLD rows and the missing Renyi curve) rather than invent one; its epsilon stays
                with pytest.raises(lp.NotApplicableError, match="no proven bound with a Renyi-DP curve") as info:
                    lp.rdp(bound, [2.0, 8.0], **params)
                assert "no Renyi curve" in str(info.value), info.value
                assert all(e.bound in str(info.value) for e in usable), (info.value, usable)
            else:
                values = lp.rdp(bound, [1.5, 2.0, 8.0, 64.0], **params)
                assert not np.isnan(values).any() and (values >= 0).all(), values
            result = lp.epsilon(bound, 1e-5, **params)
            assert not math.isnan(result.epsilon) and result.epsilon >= 0, result
            # a privacy profile converts exactly (no order); an RDP curve at an order > 1
            assert result.order is None if result.kind is not lp.Kind.RDP else result.order > 1, result


def _violations(p):
    """Independent encoding of docs/bounds.md preconditions: bound ids that must refuse ``p``."""
    must_refuse = set()
    s, rel, lr, big_m = p["sampling"], p["relation"], p["learning_rate"], p["smoothness"]
    m, lam, d, clip = p["weak_convexity"], p["strong_convexity"], p["diameter"], not p["gradient_norms_within_clip"]
    if s not in ("cyclic", "shuffle_once") or rel != "replace_one":
        must_refuse |= {"kong-ribero-cyclic", "ye-shokri-cyclic", "ye-shokri-convex"}
    if s not in ("random_batch", "poisson") or rel != "replace_one":
        must_refuse.add("altschuler-talwar")
    if s != "poisson" or rel != "add_or_remove_one":
        must_refuse |= {"liang-bounded", "liang-unbounded"}
    if s != "shuffle_once" or rel != "replace_one":
        must_refuse.add("ye-shokri-shuffle")
    if s != "random_batch" or rel != "replace_one":
        must_refuse.add("ye-shokri-random")
    if s in ("poisson", "random_allocation"):
        must_refuse |= {"kong-ribero-bounded", "kong-ribero-curvature-free"}  # batches larger than b
    if lr is None or big_m is None:
        must_refuse |= {"kong-ribero-cyclic", "kong-ribero-bounded", "altschuler-talwar", "liang-bounded",
                        "ye-shokri-cyclic", "ye-shokri-shuffle", "ye-shokri-random", "ye-shokri-convex",
                        "ye-shokri-full-batch"}  # fmt: skip
    if d is None:
        must_refuse |= {"kong-ribero-bounded", "altschuler-talwar", "liang-bounded"}
    if clip:
        must_refuse |= {"ye-shokri-cyclic", "ye-shokri-shuffle", "ye-shokri-random", "ye-shokri-convex",
                        "ye-shokri-full-batch"}  # fmt: skip
    if lam <= 0:
        must_refuse |= {"ye-shokri-cyclic", "ye-shokri-shuffle", "ye-shokri-random"}
    if m > 0 and lam == 0:
        must_refuse |= {"altschuler-talwar", "ye-shokri-convex", "ye-shokri-full-batch"}
    if p["batch_size"] != p["dataset_size"]:
        must_refuse.add("ye-shokri-full-batch")
    if s not in ("cyclic", "shuffle_once", "reshuffle", "random_allocation") or rel != "replace_one":
        must_refuse.add("composition-gdp-epochs")
    k = p.get("allocations_per_epoch", 1)
    groups_of_one = -(-p["dataset_size"] * k // p["batch_size"]) < 2 * k  # an allocation needs two steps
    if s != "random_allocation" or rel != "add_or_remove_one" or p["steps"] > 10**6 or groups_of_one:
        must_refuse.add("composition-pld-random-allocation")
    if s != "random_allocation" or rel != "replace_one" or p["steps"] > 10**6 or groups_of_one:
        must_refuse.add("composition-pld-random-allocation-replace-one")
    if s != "poisson" or rel != "add_or_remove_one" or p["steps"] > 10**6:
        must_refuse.add("composition-pld-poisson")
    if s != "poisson" or rel != "replace_one" or p["steps"] > 10**6:
        must_refuse.add("composition-pld-poisson-replace-one")
    if s != "random_batch" or rel != "replace_one" or p["steps"] > 10**6:
        must_refuse.add("composition-pld-random-batch")
    if lr is not None and big_m is not None:
        curvature = big_m + m
        if curvature > 0 and lr > (1 / (2 * curvature) if clip else 1 / curvature):
            must_refuse |= {"kong-ribero-cyclic", "kong-ribero-bounded"}
        if big_m > 0 and lr > 2 / big_m:
            must_refuse.add("altschuler-talwar")
        if lr >= 2 / (lam + big_m) if lam + big_m > 0 else False:
            must_refuse |= {"ye-shokri-cyclic", "ye-shokri-shuffle", "ye-shokri-random"}
    return must_refuse


@settings(max_examples=150, deadline=None)
@given(params=PIPELINES.map(_drop_inconsistent))
def test_violated_preconditions_are_refused(params):
    """Independently of the registry's own checks: a violated precondition of
    docs/bounds.md never yields a number."""
    for bound in _violations(params):
        with pytest.raises(lp.NotApplicableError):
            lp.rdp(bound, [2.0], **params)
        with pytest.raises(lp.NotApplicableError):
            lp.epsilon(bound, 1e-5, **params)


def test_calibration_of_an_inapplicable_bound_is_refused():
    with pytest.raises(lp.NotApplicableError):
        lp.calibrate_noise("liang-bounded", 1.0, 1e-5, **{k: v for k, v in VALID.items() if k != "noise_multiplier"})


# ------------------------------------------------------------------ CLI

HAS_CLI = importlib.util.find_spec("lastiter_plugins.cli") is not None
needs_cli = pytest.mark.skipif(not HAS_CLI, reason="lastiter_plugins.cli not written yet")

CLI_VALID = cli_flags(pipeline(steps=300, learning_rate=0.1, smoothness=1.0, sampling="shuffle_once"))
CLI_FLAGS = ["--dataset-size", "--batch-size", "--noise-multiplier", "--learning-rate", "--steps", "--smoothness",
             "--clip-norm", "--weak-convexity", "--strong-convexity", "--diameter", "--sampling", "--relation"]  # fmt: skip
BAD_TEXT = st.one_of(
    st.sampled_from(["-1", "0", "nan", "inf", "-inf", "abc", "", "1e999", "0x10", "1.5.2", "--", "None"]),
    st.text(alphabet="-.e0123456789xn", min_size=1, max_size=6),
)


def _with(argv, flag, value):
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def _cli(capsys, argv):
    from lastiter_plugins.cli import main

    code = main(argv)
    _, err = capsys.readouterr()
    return code, err


def _assert_one_line_error_or_success(code, err):
    assert code in (0, 2), (code, err)
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert "Traceback" not in err


@needs_cli
@SETTINGS
@given(command=st.sampled_from(["rdp", "epsilon", "bounds"]), flag=st.sampled_from(CLI_FLAGS), value=BAD_TEXT)
def test_cli_invalid_flag_values_exit_2_with_one_line(capsys, command, flag, value):
    argv = [command, *_with(CLI_VALID, flag, value)]
    if command != "bounds":
        argv += ["--bound", "ye-shokri-shuffle"]
    if command != "rdp":
        argv += ["--delta", "1e-5"]
    else:
        argv += ["--orders", "2,4"]
    code, err = _cli(capsys, argv)
    _assert_one_line_error_or_success(code, err)


@needs_cli
@pytest.mark.parametrize(
    "extra",
    [["--delta", "0"], ["--delta", "2"], ["--delta", "nan"], ["--bound", "nope"], ["--orders", "0.5,2"],
     ["--orders", "a,b"], ["--unknown-flag", "1"], ["--bound", "liang-bounded"]],
    ids=["delta-0", "delta-2", "delta-nan", "unknown-bound", "order-below-1", "orders-text", "unknown-flag",
         "not-applicable"],
)  # fmt: skip
def test_cli_fixed_invalid_inputs_exit_2_with_one_line(capsys, extra):
    argv = ["epsilon", *CLI_VALID, "--bound", "ye-shokri-shuffle", "--delta", "1e-5"]
    for i in range(0, len(extra), 2):
        argv = _with(argv, extra[i], extra[i + 1])
    if "--orders" in extra:
        argv = ["rdp", *[a for a in argv[1:] if a not in ("--delta", "1e-5")]]
    code, err = _cli(capsys, argv)
    assert code == 2, err
    _assert_one_line_error_or_success(code, err)


@needs_cli
def test_cli_module_entry_point_exits_2_with_one_line():
    """``python -m lastiter_plugins.cli`` as a process: exit status 2, one stderr line, no traceback."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lastiter_plugins.cli",
            "epsilon",
            *_with(CLI_VALID, "--dataset-size", "-5"),
            "--bound",
            "best",
            "--delta",
            "1e-5",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr
    assert "dataset_size" in proc.stderr or "dataset-size" in proc.stderr
