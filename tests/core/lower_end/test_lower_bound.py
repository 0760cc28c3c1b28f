"""How tight (issue 19, requirement 5): best's lower bound, the exact epsilon of an instance meeting
every declaration (docs/derivations/lower-end.md#lower-end). It must never exceed best (a bug in a bound if it
does), it is None with a reason where no instance fits, and the instance must meet the declarations."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins import compare, evaluation
from lastiter_plugins.errors import BoundBelowTruthError
from lastiter_plugins.lower_end import exact, mixture
from lastiter_plugins.lower_end import instances as lb
from tests.support import sweep_size

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
        (dict(strong_convexity=0.2, diameter=1.0, gradient_norms_within_clip=True), "may leave"),
        (dict(strong_convexity=0.2, sampling="poisson"), "per-example l2 term with Poisson"),
        (dict(relation="add_or_remove_one", gradient_norms_within_clip=True, sampling="cyclic"), "add-or-remove"),
    ],
    ids=["strong-within-clip", "strong-glm", "strong-small-segment", "strong-poisson", "add-remove-cyclic"],
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


def test_too_large_is_refused_not_approximated(monkeypatch):
    monkeypatch.setattr(mixture, "MAX_WORK", 10.0)
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
    first = " ".join(compare.format_comparison(comparison).split())  # wrapped at 120 columns
    assert f"lower end: {declared.lower_bound:.4g}" in first
    text = " ".join(compare.format_comparison(comparison, explain=True).split())
    assert "the worst case over models meeting your declarations lies in" in text


# ---------------------------------------------------------------- the exact linear-loss instance at any size
# (issue 30, item 2; docs/derivations/lower-end.md#exact-linear-instances)


def _certified(laws: exact.GaussianLaws) -> tuple[float, float]:
    """The certified interval of the exact epsilon from exact.py (cells, an independent computation)."""
    return laws.hockey_stick(cells=20_000).epsilon(DELTA)


def _exact_cases():
    """(id, lower-bound params, exact.py's laws of the same instance): small instances whose exact laws
    exact.py enumerates (2^T membership patterns, per-pass positions) or sums (Binomial counts)."""
    full = dict(
        dataset_size=40, batch_size=10, noise_multiplier=1.5, learning_rate=0.5, gradient_norms_within_clip=True
    )
    g2 = dict(strong_convexity=0.3, smoothness=0.3)
    cases = []
    for sampling, relation, steps in [
        ("poisson", "add_or_remove_one", 30),
        ("poisson", "replace_one", 30),
        ("random_batch", "replace_one", 30),
        ("reshuffle", "replace_one", 10),
    ]:
        p = dict(full, sampling=sampling, relation=relation, steps=steps, smoothness=1.0)
        cases.append(pytest.param(p, exact.g1_laws, id=f"G1-{sampling}-{relation}"))
    for sampling, relation, steps in [
        ("poisson", "add_or_remove_one", 8),
        ("poisson", "replace_one", 8),
        ("random_batch", "replace_one", 8),
        ("reshuffle", "replace_one", 10),
        ("shuffle_once", "replace_one", 13),
        ("cyclic", "replace_one", 13),
    ]:
        # full batches: exact.g2_laws contracts by 1 - eta lam |B| / b = 1 - eta lam, as the term outside the clip
        p = dict(full, sampling=sampling, relation=relation, steps=steps, l2_outside_clip=True, **g2)
        cases.append(pytest.param(p, exact.g2_laws, id=f"G2-{sampling}-{relation}"))
    return cases


@pytest.mark.parametrize("params, exact_laws", _exact_cases())
def test_lower_end_never_above_the_certified_exact_value(params, exact_laws):
    """The lower end is below the upper end of exact.py's certified interval of the same instance's
    epsilon, and close to it (the half-line tests are optimal: it is the exact epsilon)."""
    config, a = lp.build(**params)
    found = lb.lower_bound(config, a, DELTA)
    low, high = _certified(exact_laws(params))
    assert found.epsilon is not None, found.note
    assert found.epsilon <= high * (1 + 1e-9), (found.epsilon, low, high)
    assert found.epsilon >= low - 2e-3 * (1 + low), (found.epsilon, low, high)  # G2: lattice flooring loses a little


@pytest.mark.parametrize(
    "extra",
    [dict(diameter=2.0, gradient_norms_within_clip=True), {}],
    ids=["on-a-segment", "clipping-may-be-active"],
)
def test_contracting_instance_never_above_its_unconstrained_law(extra):
    """G4 (a per-example l2 term; projected onto a segment, or clipped where it may be): below the
    certified exact epsilon of its law without projection or clipping (the same Gaussian mixture:
    exact.g2_laws with clip norm gamma and the same noise), and close to it (the escape is tiny)."""
    params = dict(
        dataset_size=40, batch_size=10, noise_multiplier=1.0, learning_rate=0.5, steps=24, smoothness=0.3,
        strong_convexity=0.3, sampling="shuffle_once", **extra,
    )  # fmt: skip
    config, a = lp.build(**params)
    found = lb.lower_bound(config, a, DELTA)
    assert found.epsilon is not None and found.note.startswith("G4"), found.note
    inst = lb._candidates(config, a)[0]
    assert inst.gamma < config.clip_norm and lb.violations(inst.properties(config, a), config, a) == []
    same = {k: v for k, v in params.items() if k not in ("diameter", "gradient_norms_within_clip")}
    same.update(clip_norm=inst.gamma, noise_multiplier=params["noise_multiplier"] / inst.gamma)
    low, high = _certified(exact.g2_laws(exact.g2_params(**same)))
    assert low * 0.99 <= found.epsilon <= high * (1 + 1e-9), (found.epsilon, low, high)


def test_floored_mixing_law_is_stochastically_below_the_truth():
    """Every Poisson membership pattern enumerated (T = 8, contracting weights off the lattice): the law
    built on the lattice is below the exact law of S in the stochastic order, and loses only its trimmed mass."""
    rho, steps, q = 0.83, 8, 0.3
    c = rho ** np.arange(steps - 1, -1, -1)
    patterns = (np.arange(2**steps)[:, None] >> np.arange(steps)[None, :]) & 1
    k = patterns.sum(axis=1)
    truth_w = q**k * (1 - q) ** (steps - k)
    truth_s = patterns @ c
    config, _ = lp.build(dataset_size=10, batch_size=3, noise_multiplier=1.0, steps=steps, sampling="poisson")
    law = lb._mixing_law(dataclasses.replace(config, batch_size=3), c, 2.0**-4, exact=False)
    assert abs(config.sampling_probability - q) < 1e-12
    for x in np.linspace(0, c.sum(), 200):
        assert law.weights[law.values <= x].sum() + law.trimmed + 1e-12 >= truth_w[truth_s <= x].sum()
    assert abs(law.weights.sum() - 1.0) < 1e-9 and law.trimmed < 1e-30


def _random_settings(count: int, seed: int = 30):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        sampling = SAMPLINGS[rng.integers(len(SAMPLINGS))]
        relation = "add_or_remove_one" if sampling == "poisson" and rng.random() < 0.5 else "replace_one"
        n = int(rng.integers(50, 5000))
        b = int(rng.integers(1, max(2, n // 5)))
        p = dict(
            dataset_size=n, batch_size=b, noise_multiplier=float(rng.uniform(0.5, 5.0)), sampling=sampling,
            relation=relation, steps=int(rng.integers(1, 3000)), learning_rate=float(rng.uniform(0.1, 1.0)),
            smoothness=1.0, gradient_norms_within_clip=True,
        )  # fmt: skip
        shape = rng.integers(5)
        if shape == 1:
            p.update(strong_convexity=float(10 ** rng.uniform(-4, -1)), l2_outside_clip=True)
        elif shape == 2 and sampling != "poisson":
            p.update(strong_convexity=float(10 ** rng.uniform(-3, -1)), diameter=float(10 ** rng.uniform(0, 2)))
        elif shape == 3:
            p.update(diameter=float(10 ** rng.uniform(0, 3)))
        elif shape == 4 and sampling != "poisson":  # per-example l2, clipping may be active
            p.update(strong_convexity=float(10 ** rng.uniform(-4, -1)))
            del p["gradient_norms_within_clip"]
        out.append(pytest.param(p, id=f"random-{i}-{sampling}-{relation}-shape{shape}"))
    return out


@pytest.mark.parametrize("params", _random_settings(sweep_size(16, 200)))
def test_never_above_best_on_random_settings(params):
    """with_lower_bound raises BoundBelowTruthError if the lower end exceeds a proven bound."""
    try:
        result = lp.epsilon("best", DELTA, lower_bound=True, **params)
    except lp.NotApplicableError:
        return
    if result.lower_bound is not None:
        assert 0.0 <= result.lower_bound <= result.epsilon * (1 + 1e-9)


ISSUE_POISSON = dict(dataset_size=50000, learning_rate=1.0, smoothness=1.0, gradient_norms_within_clip=True)
ISSUE_POISSON.update(sampling="poisson", relation="add_or_remove_one")
GLM = dict(
    dataset_size=450, batch_size=45, noise_multiplier=3.2, sampling="poisson", relation="add_or_remove_one",
    learning_rate=1 / 0.27, smoothness=0.26, strong_convexity=0.01, l2_outside_clip=True,
    clipped_loss_convex_smooth=True,
)  # fmt: skip


@pytest.mark.parametrize(
    "params, delta, known",
    [
        (dict(ISSUE_POISSON, batch_size=500, noise_multiplier=0.8, steps=1000), 1e-6, 1.909),
        (dict(ISSUE_POISSON, batch_size=500, noise_multiplier=0.8, steps=10000), 1e-6, 6.52),
        (dict(ISSUE_POISSON, batch_size=500, noise_multiplier=1.0, steps=5000), 1e-6, None),
        (dict(ISSUE_POISSON, batch_size=4100, noise_multiplier=3.0, steps=2500), 1e-6, None),
        (dict(GLM, epochs=20), 1e-5, None),
        (dict(GLM, epochs=200, relation="replace_one"), 1e-5, None),
        ("builtin", 1e-5, None),
    ],
    ids=[
        "q0.01-z0.8-T1000",
        "q0.01-z0.8-T10000",
        "q0.01-z1-T5000",
        "q0.082-z3-T2500",
        "glm-E20",
        "glm-E200-r1",
        "builtin",
    ],
)
def test_present_on_the_issue_settings(params, delta, known):
    """Issue 30, item 2: a lower end on the convex Poisson settings (the linear-loss values the issue
    quotes), the GLM setting of docs/anchor-table.md and the built-in scenario, in about a second."""
    if params == "builtin":
        from lastiter_plugins.scenarios import BUILTIN_SCENARIO

        params = {k: v for k, v in BUILTIN_SCENARIO.items() if k not in ("name", "delta")}
    start = time.perf_counter()
    result = lp.epsilon("best", delta, lower_bound=True, **params)
    took = time.perf_counter() - start
    assert result.lower_bound is not None and 0 < result.lower_bound <= result.epsilon, result.lower_bound_note
    if known is not None:
        assert math.isclose(result.lower_bound, known, rel_tol=2e-3), result.lower_bound
    assert took < 10.0  # about 1 s on a quiet machine; generous for a shared one


def test_large_runs_stay_fast():
    """n = 1e6, T = 1e6 (Poisson, G1 and G2): the lower end alone in a few seconds."""
    for extra in ({}, dict(strong_convexity=1e-4, l2_outside_clip=True)):
        config, a = lp.build(
            dataset_size=10**6, batch_size=10**4, noise_multiplier=1.0, steps=10**6, sampling="poisson",
            learning_rate=1.0, smoothness=1.0, gradient_norms_within_clip=True, **extra,
        )  # fmt: skip
        start = time.perf_counter()
        found = lb.lower_bound(config, a, DELTA)
        assert found.epsilon is not None and found.epsilon > 0, found.note
        assert time.perf_counter() - start < 15.0


def test_wide_segment_short_run_does_not_overflow():
    """D/s so large that the projected walk's grid error bound is no float (found by fuzzing): G3 is
    refused and the linear instance on the segment answers (the projection never acts there)."""
    params = dict(
        dataset_size=33367, batch_size=1246, noise_multiplier=0.366, sampling="cyclic", steps=2,
        learning_rate=0.251, smoothness=0.126, gradient_norms_within_clip=True, diameter=88.18,
    )  # fmt: skip
    result = lp.epsilon("best", 4e-6, lower_bound=True, **params)
    assert result.lower_bound is not None and result.lower_bound_note.startswith("G4")
    assert result.lower_bound <= result.epsilon
