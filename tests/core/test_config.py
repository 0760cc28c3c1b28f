"""lastiter_plugins.config: TrainingConfig and LossAssumptions validate on construction.

Every invalid field raises ValueError naming the field, the constraint and the value (the message
fragments below are the ones the keyword API and the command line show, tests/core/test_api.py);
valid values are normalised (integral floats and numpy integers to int, spellings of an enum to the
member, numpy booleans to bool, -0.0 to 0.0); the objects are frozen and ``replace`` validates again;
the derived quantities (steps per epoch, full and started epochs, q) are the documented formulas.
"""

from __future__ import annotations

import enum
import math
import re
import warnings

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins.config import refuse_renamed

MAX_COUNT = 2**53  # the largest count every bound computes exactly in double precision


def config(**overrides):
    params = {"dataset_size": 100, "batch_size": 10, "noise_multiplier": 1.0, "steps": 25, "sampling": "cyclic"}
    return lp.TrainingConfig(**{**params, **overrides})


# ------------------------------------------------------------------ TrainingConfig: refusals


CONFIG_REFUSALS = [
        ("dataset_size", 0, "dataset_size must be an integer >= 1. Found 0."),
        ("dataset_size", 10.5, "dataset_size must be an integer >= 1. Found 10.5."),
        ("dataset_size", True, "dataset_size must be an integer >= 1. Found True."),
        ("dataset_size", "100", "dataset_size must be an integer >= 1. Found '100'."),
        ("dataset_size", math.inf, "dataset_size must be an integer >= 1. Found inf."),
        ("dataset_size", MAX_COUNT + 1, "dataset_size must be an integer <= 2**53"),
        ("batch_size", 0, "batch_size must be an integer >= 1. Found 0."),
        ("batch_size", 101, "batch_size must be <= dataset_size = 100. Found 101."),
        ("steps", 0, "steps must be an integer >= 1. Found 0."),
        ("steps", -3, "steps must be an integer >= 1. Found -3."),
        ("steps", 10**30, r"steps must be an integer <= 2\*\*53 = 9007199254740992 .*Found 1\.000e\+30 \(an integer\)"),
        ("noise_multiplier", 0.0, "noise_multiplier must be a finite number > 0. Found 0.0."),
        ("noise_multiplier", -1.0, "noise_multiplier must be a finite number > 0. Found -1.0."),
        ("noise_multiplier", math.nan, "noise_multiplier must be a finite number > 0. Found nan."),
        ("noise_multiplier", math.inf, "noise_multiplier must be a finite number > 0. Found inf."),
        ("noise_multiplier", 10**400, "noise_multiplier must be a finite number > 0. Found 1.000e+400 (an integer)."),
        ("noise_multiplier", "1.0", "noise_multiplier must be a finite number > 0. Found '1.0'."),
        ("noise_multiplier", None, "noise_multiplier must be a finite number > 0. Found None."),
        ("learning_rate", 0.0, "learning_rate must be a finite number > 0. Found 0.0."),
        ("clip_norm", 0.0, "clip_norm must be a finite number > 0. Found 0.0."),
        ("clip_norm", math.inf, "clip_norm must be a finite number > 0. Found inf."),
        ("sampling", "shuffled", "sampling must be one of cyclic, shuffle_once, reshuffle, random_batch, poisson, "
                                 "random_allocation. "
                                 "Found 'shuffled'."),
        ("sampling", None, "sampling must be one of"),
        ("relation", "add_one", "relation must be one of replace_one, add_or_remove_one. Found 'add_one'."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "value", "message"), CONFIG_REFUSALS, ids=[f"{f}={v!r}"[:40] for f, v, _ in CONFIG_REFUSALS]
)
def test_an_invalid_field_is_refused_naming_it(field, value, message):
    with pytest.raises(ValueError, match=message if "\\" in message or ".*" in message else re.escape(message)):
        config(**{field: value})


def test_a_run_of_more_than_2_to_the_53_steps_is_refused_from_epochs():
    limit = MAX_COUNT // 10  # ceil(100 / 10) = 10 steps per epoch
    assert lp.TrainingConfig.from_epochs(epochs=limit, dataset_size=100, batch_size=10, noise_multiplier=1.0,
                                         sampling="cyclic").steps == limit * 10  # fmt: skip
    with pytest.raises(
        ValueError, match=f"epochs must be <= 2\\*\\*53 / ceil\\(dataset_size / batch_size\\) = {limit} "
    ):
        lp.TrainingConfig.from_epochs(epochs=limit + 1, dataset_size=100, batch_size=10, noise_multiplier=1.0,
                                      sampling="cyclic")  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("epochs must be an integer >= 1. Found 0.")):
        lp.TrainingConfig.from_epochs(
            epochs=0, dataset_size=100, batch_size=10, noise_multiplier=1.0, sampling="cyclic"
        )


# ------------------------------------------------------------------ TrainingConfig: normalisation


def test_valid_values_are_normalised():
    c = config(dataset_size=np.int64(100), batch_size=10.0, steps=np.float64(25.0), noise_multiplier=np.float32(2.0),
               learning_rate=1, clip_norm=3, sampling=" Shuffle-Once ", relation="ADD-OR-REMOVE-ONE")  # fmt: skip
    assert (c.dataset_size, c.batch_size, c.steps) == (100, 10, 25)
    assert all(type(v) is int for v in (c.dataset_size, c.batch_size, c.steps))
    assert all(type(v) is float for v in (c.noise_multiplier, c.learning_rate, c.clip_norm))
    assert (c.noise_multiplier, c.learning_rate, c.clip_norm) == (2.0, 1.0, 3.0)
    assert c.sampling is lp.Sampling.SHUFFLE_ONCE and c.relation is lp.Relation.ADD_OR_REMOVE_ONE
    assert config().learning_rate is None and config().clip_norm == 1.0
    assert config().relation is lp.Relation.REPLACE_ONE
    assert config(batch_size=100).batch_size == 100 and config(steps=MAX_COUNT).steps == MAX_COUNT


def test_an_enum_of_another_library_is_parsed_by_its_name():
    class NeighboringRelation(enum.Enum):  # as dp_accounting.NeighboringRelation
        ADD_OR_REMOVE_ONE = 1
        REPLACE_ONE = 2

    assert config(relation=NeighboringRelation.REPLACE_ONE).relation is lp.Relation.REPLACE_ONE
    assert config(relation=NeighboringRelation.ADD_OR_REMOVE_ONE).relation is lp.Relation.ADD_OR_REMOVE_ONE


def test_enums_print_as_their_values():
    assert str(lp.Sampling.RANDOM_BATCH) == "random_batch" and f"{lp.Relation.REPLACE_ONE}" == "replace_one"
    assert f"{lp.Sampling.POISSON:>9}" == "  poisson"
    assert lp.Sampling.CYCLIC == "cyclic"  # a str enum


# ------------------------------------------------------------------ TrainingConfig: frozen, replace, derived values


def test_frozen_and_replace_validates_again():
    c = config()
    with pytest.raises(AttributeError):
        c.batch_size = 20
    changed = c.replace(batch_size=20, sampling="poisson")
    assert (changed.batch_size, changed.sampling, c.batch_size, c.sampling) == (20, "poisson", 10, "cyclic")
    with pytest.raises(ValueError, match=re.escape("batch_size must be <= dataset_size = 100. Found 200.")):
        c.replace(batch_size=200)
    with pytest.raises(ValueError, match="noise_multiplier must be a finite number > 0"):
        c.replace(noise_multiplier=-0.5)
    assert config(learning_rate=0.1).replace(learning_rate=None).learning_rate is None


@pytest.mark.parametrize(
    ("n", "b", "steps", "per_epoch", "full", "started"),
    [(100, 10, 25, 10, 2, 3), (100, 10, 30, 10, 3, 3), (101, 10, 22, 11, 2, 2), (101, 10, 23, 11, 2, 3),
     (7, 7, 1, 1, 1, 1), (10, 3, 3, 4, 0, 1)],
)  # fmt: skip
def test_epochs_are_passes_of_ceil_n_over_b_steps(n, b, steps, per_epoch, full, started):
    c = config(dataset_size=n, batch_size=b, steps=steps)
    assert (c.steps_per_epoch, c.full_epochs, c.epochs_started) == (per_epoch, full, started)
    assert c.sampling_probability == b / n
    assert lp.TrainingConfig.from_epochs(epochs=3, dataset_size=n, batch_size=b, noise_multiplier=1.0,
                                         sampling="cyclic").steps == 3 * per_epoch  # fmt: skip


# ------------------------------------------------------------------ LossAssumptions


ASSUMPTION_REFUSALS = [
        ({"smoothness": -1.0}, "smoothness must be a finite number >= 0. Found -1.0."),
        ({"smoothness": math.nan}, "smoothness must be a finite number >= 0. Found nan."),
        ({"smoothness": math.inf}, "smoothness must be a finite number >= 0. Found inf."),
        ({"weak_convexity": -0.1}, "weak_convexity must be a finite number >= 0. Found -0.1."),
        ({"weak_convexity": None}, "weak_convexity must be a finite number >= 0. Found None."),
        ({"strong_convexity": -0.1}, "strong_convexity must be a finite number >= 0. Found -0.1."),
        ({"diameter": 0.0}, "diameter must be a finite number > 0. Found 0.0."),
        ({"diameter": math.inf}, "diameter must be a finite number > 0. Found inf."),
        ({"gradient_norms_within_clip": 1}, "gradient_norms_within_clip must be True or False. Found 1 (int)."),
        ({"clipped_loss_convex_smooth": "yes"}, "clipped_loss_convex_smooth must be True or False. Found 'yes' (str)."),
        ({"l2_outside_clip": None}, "l2_outside_clip must be True or False. Found None (NoneType)."),
        ({"smoothness": 0.5, "strong_convexity": 0.6},
         "strong_convexity must be <= smoothness (a lam-strongly convex, M-smooth function has lam <= M). "
         "Found strong_convexity=0.6, smoothness=0.5."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    ASSUMPTION_REFUSALS,
    ids=[",".join(f"{k}={v!r}" for k, v in kw.items())[:40] for kw, _ in ASSUMPTION_REFUSALS],
)
def test_an_invalid_assumption_is_refused_naming_it(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lp.LossAssumptions(**kwargs)


def test_assumptions_are_normalised_and_frozen():
    a = lp.LossAssumptions(smoothness=1, weak_convexity=-0.0, strong_convexity=np.float64(0.5), diameter=2,
                           gradient_norms_within_clip=np.bool_(True))  # fmt: skip
    assert (a.smoothness, a.weak_convexity, a.strong_convexity, a.diameter) == (1.0, 0.0, 0.5, 2.0)
    assert math.copysign(1.0, a.weak_convexity) == 1.0  # -0.0 is 0
    assert type(a.gradient_norms_within_clip) is bool and a.gradient_norms_within_clip
    assert type(a.smoothness) is float and type(a.diameter) is float
    with pytest.raises(AttributeError):
        a.smoothness = 2.0
    # undeclared smoothness: strong convexity is not compared with it; smoothness 0 is a valid (linear) declaration
    assert lp.LossAssumptions(strong_convexity=3.0).smoothness is None
    assert lp.LossAssumptions(smoothness=0.0).smoothness == 0.0
    assert lp.LossAssumptions(smoothness=0.5, strong_convexity=0.5).strong_convexity == 0.5


@pytest.mark.parametrize(
    ("kwargs", "clipping_may_be_active", "update_is_gradient_step", "convex"),
    [
        ({}, True, False, True),
        ({"gradient_norms_within_clip": True}, False, True, True),
        ({"clipped_loss_convex_smooth": True}, True, True, True),
        ({"weak_convexity": 0.2}, True, False, False),
        ({"weak_convexity": 0.2, "strong_convexity": 0.1, "smoothness": 1.0}, True, False, True),
    ],
    ids=["nothing", "within-clip", "glm-route", "weakly-convex", "strongly-convex"],
)  # fmt: skip
def test_derived_flags(kwargs, clipping_may_be_active, update_is_gradient_step, convex):
    a = lp.LossAssumptions(**kwargs)
    assert (a.clipping_may_be_active, a.update_is_gradient_step, a.convex) == (
        clipping_may_be_active,
        update_is_gradient_step,
        convex,
    )


def test_a_renamed_keyword_is_refused_naming_the_new_one():
    with pytest.raises(ValueError, match="clipping was renamed: pass gradient_norms_within_clip=True"):
        refuse_renamed({"clipping": False})
    refuse_renamed({"gradient_norms_within_clip": True})  # the new name passes
    with pytest.raises(TypeError):
        lp.LossAssumptions(clipping=False)


# ------------------------------------------------------------------ the relation left out: the scheme's default


def test_the_default_relation_follows_the_sampling_scheme():
    """add_or_remove_one for Poisson (Opacus' and dp-accounting's convention), replace_one where only it is
    defined; one table, read by every route."""
    from lastiter_plugins.config import DEFAULT_RELATION, default_relation

    assert set(DEFAULT_RELATION) == set(lp.Sampling)
    assert default_relation("poisson") is lp.Relation.ADD_OR_REMOVE_ONE
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a scheme added in 0.3.0 had no other default: no warning
        assert config(sampling="random_allocation").relation is lp.Relation.ADD_OR_REMOVE_ONE
    for sampling in ("cyclic", "shuffle_once", "reshuffle", "random_batch"):
        assert default_relation(sampling) is lp.Relation.REPLACE_ONE
        assert config(sampling=sampling).relation is lp.Relation.REPLACE_ONE
    # every scheme's default has bounds: some row covers the scheme under that relation
    for sampling, relation in DEFAULT_RELATION.items():
        assert any(spec.relation_for(sampling) is relation for spec in lp.BOUNDS.values()), sampling


def test_poisson_without_a_relation_is_add_or_remove_with_a_future_warning():
    with pytest.warns(FutureWarning) as caught:
        c = config(sampling="poisson")
    assert c.relation is lp.Relation.ADD_OR_REMOVE_ONE
    (warning,) = caught
    message = str(warning.message)
    assert message.startswith("relation left out with sampling='poisson': accounted under add_or_remove_one")
    assert "since lastiter-plugins 0.3.0 (0.2.0 used replace_one" in message and "goes in 0.4.0" in message
    assert "Pass relation='replace_one' to keep the 0.2.0 number" in message
    assert warning.filename == __file__  # attributed to the caller, not to the library
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # given, or another scheme, or a copy: no warning
        assert config(sampling="poisson", relation="replace_one").relation is lp.Relation.REPLACE_ONE
        assert config(sampling="cyclic").relation is lp.Relation.REPLACE_ONE
        assert c.replace(steps=3).relation is lp.Relation.ADD_OR_REMOVE_ONE
        # a copy keeps the relation it was built with, also when the sampling changes
        assert config(sampling="cyclic").replace(sampling="poisson").relation is lp.Relation.REPLACE_ONE


def test_the_warning_spells_the_parameter_as_the_route_does():
    from lastiter_plugins.config import resolve_relation

    with pytest.warns(FutureWarning, match="Pass --relation replace_one to keep the 0.2.0 number, or --relation "):
        resolve_relation(None, "poisson", name="--relation")
    with pytest.warns(FutureWarning, match="Pass neighboring_relation='replace_one'"):
        resolve_relation(None, "poisson", name="neighboring_relation")


# ------------------------------------------------------------------ a sample rate as a batch size


@pytest.mark.parametrize(
    ("n", "rate", "b"),
    [
        (60000, 1 / 235, 256),  # Opacus' 1/len(loader) with batch_size 256
        (125, 1 / 6, 21),  # n not a multiple of L
        (11, 1 / 5, 3),  # a drop_last loader: L = floor(11 / 2)
        (100, 0.1, 10),
        (100, 0.35, 35),
        (20, 0.33, 7),  # n q = 6.6
        (10, 1.0, 10),
        (3, 1 / 5, 1),  # fewer examples than batches
    ],
)
def test_poisson_batch_size_never_accounts_a_smaller_rate(n, rate, b):
    """b/n >= the rate > b/n - 1/n (docs/derivations/poisson-amplification.md#sample-rate, part 1)."""
    from lastiter_plugins.config import poisson_batch_size

    assert poisson_batch_size(n, rate) == b
    assert rate <= b / n < rate + 1 / n


def test_poisson_batch_size_rounds_up_in_floating_point_too():
    from lastiter_plugins.config import poisson_batch_size

    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(2, 10**6))
        rate = float(rng.uniform(1 / n, (n - 1) / n))
        b = poisson_batch_size(n, rate)
        assert b / n >= rate and (b - 1) / n < rate, (n, rate, b)


@pytest.mark.parametrize(
    ("n", "rate", "fragment"),
    [
        (10, 0.95, r"sample_rate must be 1 or at most \(n - 1\) / n = 0.9 for dataset_size = 10"),
        (10, 0.0, r"sample_rate must be a number in \(0, 1\]. Found 0.0."),
        (10, 1.5, r"sample_rate must be a number in \(0, 1\]. Found 1.5."),
        (10, True, r"sample_rate must be a number in \(0, 1\]. Found True."),
        (0, 0.5, "dataset_size must be an integer >= 1. Found 0."),
    ],
)
def test_poisson_batch_size_refuses(n, rate, fragment):
    from lastiter_plugins.config import poisson_batch_size

    with pytest.raises(ValueError, match=fragment):
        poisson_batch_size(n, rate)


def test_poisson_steps_counts_the_run_s_own_steps():
    from lastiter_plugins.config import poisson_steps

    assert poisson_steps(30, 1 / 235) == 7050 and poisson_steps(1, 1 / 5) == 5 and poisson_steps(2, 1.0) == 2
    with pytest.raises(ValueError, match=r"sample_rate must be 1/L for an integer L .* give the number of steps"):
        poisson_steps(3, 0.3)
    with pytest.raises(ValueError, match=r"epochs must be an integer >= 1\. Found 0\."):
        poisson_steps(0, 0.5)


def _exact_one_step_epsilon(rate: float, z: float, delta: float) -> float:
    """The exact epsilon at ``delta`` of one step of the Poisson-sampled Gaussian (add-or-remove, sensitivity 1,
    noise z): P = N(0, z^2) against M = (1 - q) P + q N(1, z^2), both orders. The privacy loss is monotone in
    the output, so each hockey-stick divergence is a difference of normal CDFs."""
    from scipy import optimize, stats

    def hockey(eps: float) -> float:
        def tail(x):  # P(X > x) for X ~ N(0, z^2) and N(1, z^2)
            return stats.norm.sf(x / z), stats.norm.sf((x - 1) / z)

        # M over P: the loss log(1 - q + q exp((2x - 1) / (2 z^2))) exceeds eps for x > x1
        arg = (math.exp(eps) - 1 + rate) / rate
        x1 = z * z * math.log(arg) + 0.5
        p0, p1 = tail(x1)
        forward = (1 - rate) * p0 + rate * p1 - math.exp(eps) * p0
        # P over M: the loss -log(1 - q + q exp(...)) exceeds eps for x < x2 (if any)
        inner = (math.exp(-eps) - 1 + rate) / rate
        backward = 0.0
        if inner > 0:
            x2 = z * z * math.log(inner) + 0.5
            p0, p1 = tail(x2)
            backward = (1 - p0) - math.exp(eps) * ((1 - rate) * (1 - p0) + rate * (1 - p1))
        return max(forward, backward, 0.0)

    return optimize.brentq(lambda e: hockey(e) - delta, 0.0, 50.0, xtol=1e-12)


@pytest.mark.parametrize(("n", "rate"), [(20, 0.33), (30, 1 / 7), (12, 0.26), (40, 0.5)])
def test_ground_truth_the_rate_a_sample_rate_is_accounted_at_is_never_too_small(n, rate):
    """One step of the run at rate q' has an exact epsilon; best at b = poisson_batch_size(n, q') is never
    below it, while describing the run by b - 1 (a rate below q') is: the test fails if the mapping ever
    rounds the rate down (docs/derivations/poisson-amplification.md#sample-rate)."""
    from lastiter_plugins.config import poisson_batch_size

    z, delta = 0.8, 1e-3
    truth = _exact_one_step_epsilon(rate, z, delta)
    b = poisson_batch_size(n, rate)
    common = dict(dataset_size=n, noise_multiplier=z, steps=1, sampling="poisson", relation="add_or_remove_one")
    assert lp.epsilon("best", delta, batch_size=b, **common).epsilon >= truth
    assert (b - 1) / n < rate and lp.epsilon("best", delta, batch_size=b - 1, **common).epsilon < truth
