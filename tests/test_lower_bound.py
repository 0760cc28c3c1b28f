"""How tight (issue 19, requirement 5): best's lower bound, the exact epsilon of an instance meeting
every declaration (docs/decisions.md, section 20). It must never exceed best (a bug in a bound if it
does), it is None with a reason where no instance fits, and the instance must meet the declarations."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

import lastiter_plugins as lp
from lastiter_plugins import compare, evaluation
from lastiter_plugins.errors import BoundBelowTruthError
from lastiter_plugins.lower_end import instances as lb

DELTA = 1e-5
BASE = dict(dataset_size=40, batch_size=10, noise_multiplier=2.0, learning_rate=0.5, smoothness=1.0)
SAMPLINGS = ("cyclic", "shuffle_once", "reshuffle", "random_batch", "poisson")


def _grid():
    """(id, params): every sampling scheme, both relations, convex / strongly convex (l2 outside the
    clip) / a diameter, short and long runs, a short last batch."""
    out = []
    for sampling, relation, shape, steps in itertools.product(
        SAMPLINGS, ("replace_one", "add_or_remove_one"), ("convex", "strong", "diameter"), (8, 40)
    ):
        if relation == "add_or_remove_one" and sampling != "poisson":
            continue
        params = dict(BASE, sampling=sampling, relation=relation, steps=steps, gradient_norms_within_clip=True)
        if shape == "strong":
            params.update(strong_convexity=0.2, l2_outside_clip=True)
        if shape == "diameter":
            params.update(diameter=1.0)
        out.append(pytest.param(params, id=f"{sampling}-{relation}-{shape}-T{steps}"))
    out.append(pytest.param(dict(BASE, dataset_size=45, sampling="cyclic", steps=13), id="cyclic-short-batch"))
    out.append(pytest.param(dict(BASE, dataset_size=45, sampling="shuffle_once", steps=13), id="shuffle-short-batch"))
    return out


_RESULTS: dict[str, lp.EpsilonResult] = {}


def _best(params) -> lp.EpsilonResult:
    key = repr(sorted(params.items()))
    if key not in _RESULTS:
        _RESULTS[key] = lp.epsilon("best", DELTA, lower_bound=True, **params)
    return _RESULTS[key]


@pytest.mark.parametrize("params", _grid())
def test_lower_bound_never_above_best(params):
    result = _best(params)
    assert result.lower_bound_note  # asked for: a number, or why none
    if result.lower_bound is None:
        assert "too large" in result.lower_bound_note or "no " in result.lower_bound_note
        return
    assert 0.0 <= result.lower_bound <= result.epsilon, (result.lower_bound, result)
    assert f"[{result.lower_bound:.4g}, {result.epsilon:.4g}]" in result.tightness_line


def test_some_grid_instances_are_computed():
    """The grid above is not vacuous: the cheap instances give numbers, close to best where best is tight."""
    computed = [_best(p.values[0]) for p in _grid()]
    assert sum(r.lower_bound is not None for r in computed) >= 25
    full_batch = lp.epsilon(
        "best",
        DELTA,
        lower_bound=True,
        **dict(BASE, batch_size=40, sampling="cyclic", steps=20, strong_convexity=0.2, l2_outside_clip=True),
        gradient_norms_within_clip=True,
    )
    assert full_batch.lower_bound / full_batch.epsilon > 0.95  # shifted interpolation is exact on G2 full batch


@pytest.mark.parametrize(
    "extra, words",
    [
        (dict(strong_convexity=0.2, gradient_norms_within_clip=True), "no loss meets these declarations"),
        (dict(strong_convexity=0.2, clipped_loss_convex_smooth=True), "no loss meets these declarations"),
        (dict(strong_convexity=0.2, diameter=1.0, gradient_norms_within_clip=True), "bounded domain"),
        (dict(strong_convexity=0.2), "clipping may be active"),
        (dict(relation="add_or_remove_one", gradient_norms_within_clip=True, sampling="cyclic"), "add-or-remove"),
    ],
    ids=["strong-within-clip", "strong-glm", "strong-diameter", "strong-clipping-active", "add-remove-cyclic"],
)
def test_no_instance_says_why(extra, words):
    params = dict(BASE, sampling="shuffle_once", steps=8) | extra
    config, assumptions = lp.build(**params)
    found = lb.lower_bound(config, assumptions, DELTA)
    assert found.epsilon is None and words in found.note
    try:
        result = lp.epsilon("best", DELTA, lower_bound=True, **params)
    except lp.NotApplicableError:
        return
    assert result.lower_bound is None and words in result.lower_bound_note
    assert "no lower end" in result.tightness_line


def test_too_large_is_refused_not_approximated():
    params = dict(BASE, sampling="random_batch", steps=30, strong_convexity=0.2, l2_outside_clip=True)
    config, assumptions = lp.build(**params, gradient_norms_within_clip=True)
    found = lb.lower_bound(config, assumptions, DELTA)
    assert found.epsilon is None and lb.TOO_LARGE in found.note


@pytest.mark.parametrize("params", _grid())
def test_instance_meets_every_declaration(params):
    """The chosen instance's own constants against the declared ones, one by one."""
    config, a = lp.build(**params)
    found = lb.lower_bound(config, a, DELTA)
    if found.instance is None:
        return
    inst = found.instance
    assert lb.violations(inst, config, a) == []
    assert inst.config == config
    assert a.smoothness is None or inst.smoothness <= a.smoothness
    assert inst.strong_convexity >= a.strong_convexity
    assert inst.diameter == a.diameter
    assert inst.max_gradient_norm <= config.clip_norm
    if a.l2_outside_clip:
        assert inst.per_example_strong_convexity == 0 and inst.l2_outside >= a.strong_convexity
    else:
        assert inst.l2_outside == 0


def test_a_violating_instance_is_detected():
    """violations() would catch an instance that misses a declaration (each field changed in turn)."""
    config, a = lp.build(**dict(BASE, sampling="cyclic", steps=8, strong_convexity=0.2, l2_outside_clip=True))
    good = lb.lower_bound(config, dataclasses.replace(a, gradient_norms_within_clip=True), DELTA).instance
    declared = dataclasses.replace(a, gradient_norms_within_clip=True)
    assert good is not None and lb.violations(good, config, declared) == []
    bad = [
        dataclasses.replace(good, smoothness=2.0),
        dataclasses.replace(good, strong_convexity=0.1),
        dataclasses.replace(good, diameter=1.0),
        dataclasses.replace(good, max_gradient_norm=2.0 * config.clip_norm),
        dataclasses.replace(good, per_example_strong_convexity=0.2, l2_outside=0.0),
        dataclasses.replace(good, config=config.replace(steps=7)),
    ]
    for inst in bad:
        assert lb.violations(inst, config, declared), inst
    glm = dataclasses.replace(declared, clipped_loss_convex_smooth=True)
    assert lb.violations(dataclasses.replace(good, scalar_glm=False), config, glm)


def test_a_bound_below_the_truth_raises(monkeypatch):
    """If a proven bound ever reports less than the exact epsilon of a valid instance, it is an error."""
    params = dict(BASE, sampling="cyclic", steps=8, gradient_norms_within_clip=True)
    config, a = lp.build(**params)
    honest = evaluation.epsilon_result("best", config, a, DELTA)
    lowered = dataclasses.replace(honest, epsilon=0.5 * lb.lower_bound(config, a, DELTA).epsilon)
    with pytest.raises(BoundBelowTruthError, match="below the exact epsilon"):
        evaluation.with_lower_bound(lowered, config, a)


def test_not_computed_unless_asked():
    params = dict(BASE, sampling="cyclic", steps=8, gradient_norms_within_clip=True)
    result = lp.epsilon("best", DELTA, **params)
    assert result.lower_bound is None and result.lower_bound_note == "" and result.tightness_line == ""
    d = lp.epsilon("best", DELTA, lower_bound=True, **params).to_dict()
    assert d["lower_bound"] is not None and d["lower_bound_note"].startswith("G1")


def test_compare_shows_the_interval():
    params = dict(BASE, sampling="shuffle_once", steps=8, gradient_norms_within_clip=True)
    comparison = compare.compare(DELTA, **params)
    declared = comparison.best[0]
    assert declared.lower_bound is not None and declared.lower_bound <= declared.epsilon
    text = " ".join(compare.format_comparison(comparison).split())  # wrapped at 120 columns
    assert "the worst case over models meeting your declarations lies in" in text
