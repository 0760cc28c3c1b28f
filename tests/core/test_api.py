"""The keyword API: validation, refusals (NotApplicableError), best-of, labels."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import typing_extensions

import lastiter_plugins as lp
from lastiter_plugins import registry
from tests.support import pipeline, strongly_convex


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (dict(dataset_size=0), "dataset_size must be an integer >= 1. Found 0."),
        (dict(dataset_size=10.5), "dataset_size must be an integer"),
        (dict(batch_size=2000), "batch_size must be <= dataset_size = 1000. Found 2000."),
        (dict(noise_multiplier=0.0), "noise_multiplier must be a finite number > 0. Found 0.0."),
        (dict(noise_multiplier=-1.0), "noise_multiplier must be a finite number > 0"),
        (dict(noise_multiplier=float("nan")), "noise_multiplier must be a finite number > 0. Found nan."),
        (dict(noise_multiplier=float("inf")), "noise_multiplier must be a finite number > 0. Found inf."),
        (dict(clip_norm=0), "clip_norm must be a finite number > 0"),
        (dict(learning_rate=-0.1), "learning_rate must be a finite number > 0"),
        (dict(steps=0), "steps must be an integer >= 1. Found 0."),
        (dict(steps=True), "steps must be an integer >= 1. Found True."),
        (
            dict(sampling="random"),
            "sampling must be one of cyclic, shuffle_once, reshuffle, random_batch, poisson, random_allocation",
        ),
        (dict(relation="swap"), "relation must be one of replace_one, add_or_remove_one"),
        (dict(smoothness=-1.0), "smoothness must be a finite number >= 0. Found -1.0."),
        (dict(diameter=0.0), "diameter must be a finite number > 0. Found 0.0."),
        (dict(gradient_norms_within_clip="yes"), "gradient_norms_within_clip must be True or False"),
        (dict(clipping=False), "clipping was renamed: pass gradient_norms_within_clip=True"),
        (dict(smoothness=0.1, strong_convexity=0.5), "strong_convexity must be <= smoothness"),
        (dict(epochs=3), "exactly one of steps and epochs"),
        (dict(foo=1), "unknown parameter 'foo'"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_invalid_values_raise_value_error_naming_the_parameter(changes, fragment):
    with pytest.raises(ValueError, match=None) as info:
        lp.rdp("composition", [2.0], **pipeline(**changes))
    assert fragment in str(info.value)
    assert not isinstance(info.value, lp.NotApplicableError)


@pytest.mark.parametrize(
    ("orders", "fragment"),
    [([1.0], "orders must be finite and > 1. Found 1."), ([0.5, 2], "Found 0.5"), ([], "at least one order"),
     ([float("nan")], "Found nan"), (["a"], "orders must be a sequence of numbers")],
    ids=str,
)  # fmt: skip
def test_invalid_orders(orders, fragment):
    with pytest.raises(ValueError) as info:
        lp.rdp("composition", orders, **pipeline())
    assert fragment in str(info.value)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0, float("nan")])
def test_invalid_delta(delta):
    with pytest.raises(ValueError, match="delta must be in \\(0, 1\\)"):
        lp.epsilon("composition", delta, **pipeline())


def test_unknown_bound():
    with pytest.raises(ValueError, match="bound must be one of"):
        lp.rdp("nope", [2.0], **pipeline())


# (bound, params, fragment of the refusal): each precondition refuses, naming condition and theorem.
REFUSALS = [
    ("kong-ribero-cyclic", pipeline(learning_rate=0.1, smoothness=1.0, sampling="reshuffle"),
     "sampling must be one of cyclic, shuffle_once for kong-ribero-cyclic (Kong & Ribero 2024, arXiv 2407.05237, Theorem 2.3)"),
    ("kong-ribero-cyclic", pipeline(smoothness=1.0), "learning_rate (the constant SGD step size) must be given"),
    ("kong-ribero-cyclic", pipeline(learning_rate=0.1), "smoothness (M"),
    ("kong-ribero-cyclic", pipeline(learning_rate=0.6, smoothness=1.0),
     "learning_rate must be <= 1/(2(M+m)) (clipping may be active) = 0.5 for kong-ribero-cyclic "
     "(Kong & Ribero 2024, arXiv 2407.05237, Theorem 2.3). Found 0.6."),
    ("kong-ribero-cyclic", pipeline(learning_rate=1.1, smoothness=1.0, gradient_norms_within_clip=True),
     "learning_rate must be <= 1/(M+m) (the update is a gradient step: clipping never active, or the scalar-GLM route) = 1 for kong-ribero-cyclic"),
    ("kong-ribero-cyclic", pipeline(learning_rate=0.1, smoothness=1.0, relation="add_or_remove_one"),
     "relation must be replace_one for kong-ribero-cyclic"),
    ("kong-ribero-bounded", pipeline(learning_rate=0.1, smoothness=1.0), "diameter (D) must be declared"),
    ("kong-ribero-bounded", pipeline(learning_rate=0.1, smoothness=1.0, diameter=1.0, sampling="poisson"),
     "sampling must be one of cyclic, shuffle_once, reshuffle, random_batch"),
    ("kong-ribero-curvature-free", pipeline(sampling="poisson"), "Found poisson."),
    ("altschuler-talwar", pipeline(learning_rate=0.1, smoothness=1.0, diameter=1.0), "Found cyclic."),
    ("altschuler-talwar", pipeline(learning_rate=0.1, smoothness=1.0, diameter=1.0, sampling="random_batch",
                                   weak_convexity=0.1), "the losses must be convex"),
    ("altschuler-talwar", pipeline(learning_rate=2.5, smoothness=1.0, diameter=1.0, sampling="random_batch"),
     "learning_rate must be <= 2/M"),
    ("altschuler-talwar", pipeline(learning_rate=0.1, smoothness=1.0, diameter=1.0, sampling="poisson"),
     "learning_rate must be <= 2b/(nM) (poisson: a batch can hold all n examples) = 0.02 for altschuler-talwar"),
    ("liang-bounded", pipeline(learning_rate=0.1, smoothness=1.0, diameter=1.0, sampling="poisson",
                               relation="replace_one"), "relation must be add_or_remove_one for liang-bounded"),
    ("liang-unbounded", pipeline(sampling="poisson", relation="add_or_remove_one"), "smoothness (M"),
    ("ye-shokri-cyclic", strongly_convex(sampling="cyclic", gradient_norms_within_clip=False), "gradient_norms_within_clip or clipped_loss_convex_smooth"),
    ("ye-shokri-cyclic", strongly_convex(sampling="cyclic", strong_convexity=0.0), "strong_convexity (lam) must be > 0"),
    ("ye-shokri-cyclic", strongly_convex(sampling="cyclic", learning_rate=1.9), "learning_rate must be < 2/(lam+M)"),
    ("ye-shokri-cyclic", strongly_convex(sampling="cyclic", batch_size=1000), "ceil(dataset_size / batch_size) must be >= 2"),
    ("ye-shokri-shuffle", strongly_convex(sampling="cyclic"), "sampling must be one of shuffle_once"),
    ("ye-shokri-random", strongly_convex(sampling="poisson"), "sampling must be one of random_batch"),
    ("ye-shokri-convex", strongly_convex(sampling="cyclic", learning_rate=2.0, strong_convexity=0.0),
     "learning_rate must be < 2/M"),
    ("ye-shokri-convex", strongly_convex(sampling="cyclic", weak_convexity=0.2, strong_convexity=0.0),
     "the losses must be convex"),
    ("ye-shokri-full-batch", strongly_convex(sampling="cyclic"), "batch_size must equal dataset_size"),
    ("ye-shokri-full-batch", strongly_convex(sampling="cyclic", batch_size=1000, learning_rate=1.0),
     "learning_rate must be < 1/M"),
    ("composition", pipeline(relation="add_or_remove_one"), "relation must be replace_one for composition"),
    ("composition", pipeline(sampling="poisson", relation="replace_one"),
     "relation must be add_or_remove_one for composition"),
    ("best", pipeline(relation="add_or_remove_one"), "no proven bound applies to sampling=cyclic"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("bound", "params", "fragment"), REFUSALS, ids=[f"{b}-{i}" for i, (b, _, _) in enumerate(REFUSALS)]
)
def test_preconditions_refuse_with_named_condition(bound, params, fragment):
    for call in (lambda: lp.rdp(bound, [2.0, 8.0], **params), lambda: lp.epsilon(bound, 1e-5, **params)):
        with pytest.raises(lp.NotApplicableError) as info:
            call()
        assert fragment in str(info.value)
    if bound != "best":
        app = lp.applicable_bounds(**params)[bound]
        assert not app.applies and fragment in app.reason


def test_not_applicable_is_a_value_error():
    assert issubclass(lp.NotApplicableError, ValueError) and issubclass(lp.CalibrationError, ValueError)


def test_applicable_bounds_lists_every_bound_with_reasons_and_relations():
    table = lp.applicable_bounds(**strongly_convex(sampling="shuffle_once"))
    assert set(table) == set(lp.BOUND_IDS)
    applies = {b for b, a in table.items() if a.applies}
    assert applies == {
        "kong-ribero-cyclic",
        "kong-ribero-curvature-free",
        "ye-shokri-cyclic",
        "ye-shokri-shuffle",
        "ye-shokri-convex",
        "shifted-interpolation-cyclic",
        "shifted-interpolation-shuffle",
        "composition",
        "composition-gdp-epochs",  # one Gaussian mechanism per epoch, composed exactly
        # (docs/derivations/baselines.md#baselines)
        "best",
    }
    assert table["liang-bounded"].relation is lp.Relation.ADD_OR_REMOVE_ONE
    assert "Theorem 3.4" in table["liang-bounded"].reference
    assert "sampling must be one of poisson" in table["liang-bounded"].reason


def test_applicable_bounds_does_not_need_the_noise_multiplier():
    params = {k: v for k, v in pipeline().items() if k != "noise_multiplier"}
    assert lp.applicable_bounds(**params)["composition"].applies


def test_best_is_the_per_order_minimum_of_the_applicable_bounds():
    params = strongly_convex(sampling="shuffle_once")
    orders = np.array([1.5, 2.0, 8.0, 64.0])
    table = lp.applicable_bounds(**params)
    curves = [lp.rdp(b, orders, **params) for b, a in table.items() if a.applies and b != "best"]
    np.testing.assert_array_equal(lp.rdp("best", orders, **params), np.min(curves, axis=0))


def test_best_never_mixes_relations():
    """Under add_or_remove_one with Poisson, best may only use add_or_remove_one bounds."""
    params = pipeline(
        sampling="poisson", relation="add_or_remove_one", learning_rate=0.01, smoothness=1.0, diameter=1.0
    )
    result = lp.epsilon("best", 1e-5, **params)
    assert registry.BOUNDS[result.winner].relation_for(lp.Sampling.POISSON) is lp.Relation.ADD_OR_REMOVE_ONE
    assert result.relation is lp.Relation.ADD_OR_REMOVE_ONE
    # the replace-one-only kong-ribero-curvature-free and composition(SWOR) never enter this minimum
    replace_one = lp.applicable_bounds(**{**params, "relation": "replace_one"})
    assert not replace_one["liang-unbounded"].applies
    assert result.winner in ("liang-bounded", "liang-unbounded", "composition", "composition-pld-poisson")
    # the replace-one PLD row applies to the replace-one pipeline only
    assert replace_one["composition-pld-poisson-replace-one"].applies
    assert not lp.applicable_bounds(**params)["composition-pld-poisson-replace-one"].applies


AT_PARAMS = pipeline(
    sampling="random_batch", learning_rate=0.5, smoothness=1.0, diameter=0.5, gradient_norms_within_clip=True
)


def test_unproven_bound_never_enters_best_and_is_computed_only_by_name():
    table = lp.applicable_bounds(delta=1e-5, **AT_PARAMS)
    assert table["altschuler-talwar"].applies and table["altschuler-talwar"].result is None  # not asked for
    config, assumptions = lp.build(**AT_PARAMS)  # the same pipeline, given as objects
    asked = lp.applicable_bounds(delta=1e-5, unproven=["altschuler-talwar"], config=config, assumptions=assumptions)
    at = asked["altschuler-talwar"].result
    assert at is not None and not at.proof.proven
    best = lp.epsilon("best", 1e-5, **AT_PARAMS)
    assert best.winner != "altschuler-talwar" and best.proof.proven
    proven = [e.epsilon for b, e in asked.items() if b != lp.BEST and e.result is not None and e.proof.proven]
    assert best.epsilon == min(proven) == asked[lp.BEST].epsilon and asked[lp.BEST].result.winner == best.winner


def test_rdp_of_an_unproven_bound_warns_an_array_carries_no_mark():
    """issue 38: an unproven bound's number is marked where it is stated (EpsilonResult) and warned about where it
    is given bare: rdp's array."""
    with pytest.warns(lp.UnprovenBoundWarning, match="altschuler-talwar is unproven: the proof of Theorem 3.1") as w:
        lp.rdp("altschuler-talwar", [2.0, 8.0], **AT_PARAMS)
    assert w[0].filename == __file__  # the user's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lp.rdp("best", [2.0, 8.0], **AT_PARAMS)
        lp.rdp("bounded-domain-random", [2.0, 8.0], **AT_PARAMS)


def test_epsilon_result_is_labelled():
    result = lp.epsilon("best", 1e-5, **strongly_convex(sampling="shuffle_once"))
    assert result.winner == "shifted-interpolation-shuffle"
    assert result.kind is lp.Kind.GDP and result.order is None
    assert result.protects == "the final model only"
    text = str(result)
    for part in ("final model only", "replace_one", "shuffle_once", "shifted-interpolation-shuffle", "1e-05"):
        assert part in text
    d = result.to_dict()
    assert d["relation"] == "replace_one" and d["epsilon"] == result.epsilon
    assert d["proof"] == "proven" and d["kind"] == "gdp" and d["order"] is None
    comp = lp.epsilon("composition", 1e-5, **pipeline())
    assert comp.protects == "every iterate"
    # an unproven bound is computed when asked for by name, and says so everywhere it is shown
    at = lp.epsilon("altschuler-talwar", 1e-5, **AT_PARAMS)
    assert not at.proof.proven and "unproven: the proof of Theorem 3.1" in str(at)
    assert at.to_dict()["proof"].startswith("unproven: ")


def test_epsilon_matches_dp_accounting_conversion():
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders = lp.DEFAULT_ORDERS
    params = strongly_convex(sampling="cyclic")
    curve = lp.rdp("ye-shokri-cyclic", orders, **params)
    result = lp.epsilon("ye-shokri-cyclic", 1e-6, **params)
    # lossless: never above the grid optimum, and exactly dp-accounting's conversion at the order returned
    assert result.epsilon <= compute_epsilon(orders, curve, 1e-6)[0] * (1 + 1e-12)
    at_order = lp.rdp("ye-shokri-cyclic", [result.order], **params)
    assert result.epsilon == pytest.approx(compute_epsilon([result.order], at_order, 1e-6)[0], rel=1e-12)


def test_orders_are_copied_and_default_grid_is_read_only():
    orders = np.array([2.0, 4.0])
    lp.rdp("composition", orders, **pipeline())
    assert orders.tolist() == [2.0, 4.0]
    with pytest.raises(ValueError):
        lp.DEFAULT_ORDERS[0] = 5.0
    assert 1.0 < lp.DEFAULT_ORDERS.min() <= 1.01 and lp.DEFAULT_ORDERS.max() == 1e4
    assert len(lp.DEFAULT_ORDERS) >= 200


def test_warns_when_optimum_is_at_the_grid_edge():
    with pytest.warns(lp.OrderGridWarning, match="edge of the order grid"):
        lp.epsilon("composition", 1e-5, orders=[2.0, 3.0], **pipeline())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lp.epsilon("composition", 1e-5, **pipeline())


def test_typed_config_objects_round_trip_and_are_frozen():
    config, assumptions = lp.build(**strongly_convex(sampling="cyclic"))
    assert config.steps_per_epoch == 100 and config.full_epochs == 20 and config.epochs_started == 20
    assert config.sampling is lp.Sampling.CYCLIC and config.relation is lp.Relation.REPLACE_ONE
    with pytest.raises(AttributeError):
        config.steps = 3
    with pytest.raises(ValueError):
        config.replace(steps=0)
    assert lp.epsilon("ye-shokri-cyclic", 1e-5, config=config, assumptions=assumptions).epsilon == pytest.approx(
        lp.epsilon("ye-shokri-cyclic", 1e-5, **strongly_convex(sampling="cyclic")).epsilon
    )
    assert lp.Relation.parse("ADD-OR-REMOVE-ONE") is lp.Relation.ADD_OR_REMOVE_ONE


def test_relation_accepts_dp_accounting_enum():
    import dp_accounting

    assert lp.Relation.parse(dp_accounting.NeighboringRelation.REPLACE_ONE) is lp.Relation.REPLACE_ONE


def test_calibrate_noise_reaches_target_and_refuses_impossible_targets():
    params = strongly_convex(sampling="shuffle_once")
    params.pop("noise_multiplier")
    z = lp.calibrate_noise("best", 2.0, 1e-5, **params).noise_multiplier
    assert lp.epsilon("best", 1e-5, noise_multiplier=z, **params).epsilon <= 2.0
    assert lp.epsilon("best", 1e-5, noise_multiplier=0.99 * z, **params).epsilon > 2.0
    with pytest.raises(lp.CalibrationError, match="no noise_multiplier <= max_noise_multiplier = 10"):
        lp.calibrate_noise("kong-ribero-curvature-free", 1e-3, 1e-5, max_noise_multiplier=10.0, **params)
    with pytest.raises(lp.NotApplicableError):
        lp.calibrate_noise("ye-shokri-random", 1.0, 1e-5, **params)
    with pytest.raises(ValueError, match="target_epsilon must be a finite number > 0"):
        lp.calibrate_noise("best", math.inf, 1e-5, **params)


def test_no_finite_epsilon_is_ever_returned_for_a_violated_precondition():
    """Every (bound, sampling) pair that is not covered raises; none returns a number."""
    for bound in lp.BOUNDS:
        for sampling in lp.Sampling:
            params = pipeline(sampling=sampling.value, learning_rate=0.1, smoothness=1.0, diameter=1.0)
            app = lp.applicable_bounds(**params)[bound]
            if app.applies:
                assert math.isfinite(lp.epsilon(bound, 1e-5, **params).epsilon)
            else:
                with pytest.raises(lp.NotApplicableError):
                    lp.epsilon(bound, 1e-5, **params)


# ---------------------------------------------------------------- small frictions: enums, float, typed parameters

_ENUMS = [lp.Sampling, lp.Relation, lp.Kind, lp.Protects]


@pytest.mark.parametrize(
    "member",
    [m for cls in _ENUMS for m in cls],
    ids=str,
)
def test_str_and_format_of_every_enum_give_its_value(member):
    assert str(member) == member.value
    assert f"{member}" == member.value and f"{member:>30}" == f"{member.value:>30}"
    assert member == member.value  # still a str


def test_float_of_an_epsilon_result_is_its_epsilon():
    result = lp.epsilon("best", 1e-5, **strongly_convex(sampling="shuffle_once"))
    assert float(result) == result.epsilon and math.isfinite(float(result))


def test_parameters_typed_dict_is_the_single_list_of_parameters():
    assert tuple(lp.Parameters.__annotations__) == lp.PARAMETERS
    assert lp.Parameters.__required_keys__ == {"dataset_size", "batch_size", "sampling"}
    params: lp.Parameters = {"dataset_size": 1000, "batch_size": 10, "sampling": "cyclic", "steps": 5}
    assert lp.applicable_bounds(**params)["composition"].applies


@pytest.mark.parametrize(
    "function",
    [lp.build, lp.rdp, lp.epsilon, lp.applicable_bounds, lp.calibrate_noise, lp.advise],
    ids=lambda f: f.__name__,
)
def test_public_functions_type_their_keyword_parameters(function):
    """``**params: Unpack[Parameters]``; a function that also takes the objects has two overloads: the keyword
    parameters, or ``config`` (a TrainingConfig) and ``assumptions`` without them."""
    overloads = typing_extensions.get_overloads(function)
    keyword, objects = overloads or (function, None)
    hint = typing_extensions.get_type_hints(keyword, include_extras=True)["params"]
    assert typing_extensions.get_origin(hint) is typing_extensions.Unpack
    assert typing_extensions.get_args(hint) == (lp.Parameters,)
    assert (objects is None) == (function is lp.build)
    if objects is not None:
        hints = typing_extensions.get_type_hints(objects, include_extras=True)
        assert hints["config"] is lp.TrainingConfig and "params" not in hints
        assert hints["assumptions"] == lp.LossAssumptions | None


def test_numpy_bool_flags_are_accepted_and_other_values_refused():
    import numpy as np

    _, a = lp.build(**strongly_convex(sampling="cyclic", gradient_norms_within_clip=np.bool_(True)))
    assert a.gradient_norms_within_clip is True
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="gradient_norms_within_clip must be True or False"):
            lp.build(**strongly_convex(sampling="cyclic", gradient_norms_within_clip=bad))


def test_using_a_result_as_the_old_pair_is_deprecated():
    """Version 0.1's epsilon() returned (epsilon, order); the result still unpacks, with a warning (removed
    at 1.0)."""
    result = lp.epsilon("composition", 1e-5, dataset_size=1000, batch_size=10, noise_multiplier=1.0, steps=500,
                        sampling="cyclic")  # fmt: skip
    with pytest.warns(DeprecationWarning, match="removed in 1.0"):
        eps, order = result
    assert (eps, order) == (result.epsilon, result.order)
    with pytest.warns(DeprecationWarning):
        assert result[0] == result.epsilon
    with pytest.warns(DeprecationWarning):
        assert len(result) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert float(result) == result.epsilon and result.to_dict()["epsilon"] == result.epsilon


def test_every_public_function_takes_the_pipeline_as_keywords_or_as_objects_never_both():
    """epsilon, rdp, applicable_bounds, calibrate_noise and advise give the same answer for the pipeline as
    keyword parameters and as the objects build makes (what the adapters hold); both at once, assumptions
    without config, or an object of another type are refused."""
    params = strongly_convex(sampling="shuffle_once")
    config, assumptions = lp.build(**params)
    objects = dict(config=config, assumptions=assumptions)
    assert lp.epsilon("best", 1e-5, **params) == lp.epsilon("best", 1e-5, **objects)
    np.testing.assert_array_equal(lp.rdp("best", [2.0, 8.0], **params), lp.rdp("best", [2.0, 8.0], **objects))
    assert lp.applicable_bounds(delta=1e-5, **params) == lp.applicable_bounds(delta=1e-5, **objects)
    assert lp.advise(1e-5, top=2, **params) == lp.advise(1e-5, top=2, **objects)
    without_noise = {k: v for k, v in params.items() if k != "noise_multiplier"}
    calibrated = lp.calibrate_noise("composition", 2.0, 1e-5, **without_noise)
    assert calibrated == lp.calibrate_noise("composition", 2.0, 1e-5, **objects)  # its noise multiplier ignored
    # nothing declared by default: the same as LossAssumptions()
    assert lp.epsilon("composition", 1e-5, config=config) == lp.epsilon(
        "composition", 1e-5, config=config, assumptions=lp.LossAssumptions()
    )
    with pytest.raises(ValueError, match=r"not both\. Found config= and dataset_size="):
        lp.epsilon("best", 1e-5, config=config, dataset_size=10)
    with pytest.raises(ValueError, match="assumptions= needs config="):
        lp.applicable_bounds(assumptions=assumptions, **params)
    with pytest.raises(ValueError, match=r"config must be a TrainingConfig\. Found dict\."):
        lp.epsilon("best", 1e-5, config=params)
    with pytest.raises(ValueError, match=r"assumptions must be a LossAssumptions\. Found dict\."):
        lp.rdp("best", [2.0], config=config, assumptions={})


def test_applicable_bounds_with_delta_carries_every_number_and_best():
    params = strongly_convex(sampling="shuffle_once")
    table = lp.applicable_bounds(delta=1e-5, **params)
    best = lp.epsilon("best", 1e-5, **params)
    assert list(table) == [*lp.BOUNDS, lp.BEST]
    assert table[lp.BEST].result == best and table[best.winner].epsilon == best.epsilon
    assert all(e.result is None for e in lp.applicable_bounds(**params).values())  # no delta: no numbers


@pytest.mark.parametrize(
    ("name", "replacement", "call"),
    [
        ("compute_epsilon", "epsilon(", lambda f, c, a: f("best", c, a, 1e-5)),
        ("compute_rdp", "rdp(", lambda f, c, a: f("best", c, a, [2.0, 8.0]).tolist()),
        ("evaluate_all", "applicable_bounds(", lambda f, c, a: f(c, a, 1e-5)),
        ("advise_config", "advise(", lambda f, c, a: f(1e-5, c, a, top=2)),
    ],
)
def test_the_overlapping_names_of_0_2_warn_and_name_their_replacement(name, replacement, call):
    params = strongly_convex(sampling="shuffle_once")
    config, assumptions = lp.build(**params)
    with pytest.warns(DeprecationWarning, match=rf"lastiter_plugins.{name} is deprecated and will be removed in 1.0; "
                      rf"use lastiter_plugins.{re.escape(replacement)}") as caught:  # fmt: skip
        old = getattr(lp, name)
    assert caught[0].filename == __file__  # the warning points at the code that used the name
    assert name not in lp.__all__ and name not in dir(lp)
    new = {
        "compute_epsilon": lambda: lp.epsilon("best", 1e-5, **params),
        "compute_rdp": lambda: lp.rdp("best", [2.0, 8.0], **params).tolist(),
        "evaluate_all": lambda: {b: e for b, e in lp.applicable_bounds(delta=1e-5, **params).items() if b != lp.BEST},
        "advise_config": lambda: lp.advise(1e-5, top=2, **params),
    }[name]()
    assert call(old, config, assumptions) == new


def test_best_has_one_provenance_on_every_route():
    """Issue 41: Poisson, replace-one, the issue's example (both 4.228): applicable_bounds' best said published
    (a default of its own) while epsilon('best') said derived here (its winner's)."""
    params = dict(dataset_size=60000, batch_size=256, noise_multiplier=1.1, sampling="poisson",
                  relation="replace_one", steps=14100)  # fmt: skip
    listed = lp.applicable_bounds(delta=1e-5, **params)[lp.BEST]
    result = lp.epsilon("best", 1e-5, **params)
    assert listed.result.epsilon == pytest.approx(result.epsilon) == pytest.approx(4.228, abs=1e-3)
    assert listed.published is result.published is listed.result.published is False
    assert listed.provenance == result.provenance and result.provenance.startswith("derived here")
    published = lp.applicable_bounds(delta=1e-5, **strongly_convex(sampling="cyclic"))[lp.BEST]
    assert published.published is published.result.published  # and where the winner is published


def test_str_is_the_answer_first_and_explain_the_rest():
    result = lp.epsilon("best", 1e-5, lower_bound=True, **strongly_convex(sampling="shuffle_once", diameter=10.0))
    lines = str(result).splitlines()
    assert lines[0].startswith(f"epsilon = {result.epsilon:.4g} at delta = 1e-05 for the final model only")
    assert "replace_one" in lines[0] + lines[1] and "shuffle_once" in " ".join(lines[:2])
    assert len(lines) <= 10 and f"From {result.winner}: " in str(result)
    for jargon in ("mu-GDP", "joint convexity", "G4", "order"):
        assert jargon not in str(result)
    explained = result.explain()
    assert explained.startswith(str(result)) and result.reference in explained and result.provenance in explained
