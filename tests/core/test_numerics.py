"""Numerics never crash: extreme but valid inputs, for every bound, the API and the CLI.

Contract: z = 1e-200 or 1e200, n = 1e9 with b = 1, T = 1e12 (and their combinations, with
and without a diameter, strong convexity or the scalar-GLM flag, every sampling scheme)
give a finite epsilon, ``inf`` where the guarantee is vacuous, or a ValueError naming the
parameter and its supported range; never another exception, a floating-point warning, a
NaN, a number below what a noisier pipeline gets, a traceback from the CLI, memory that
grows with n/b or T, or a loop over T.
"""

from __future__ import annotations

import itertools
import json
import math
import time
import tracemalloc
import warnings

import numpy as np
import pytest

import lastiter_plugins as lp
from lastiter_plugins import profiles
from lastiter_plugins.bounds import sgm, shifted_interpolation, ye_shokri
from lastiter_plugins.cli import main
from tests.support import cli_flags, pipeline

DELTA = 1e-5
ORDERS = [1.0000001, 3.5, 1e4, 1e9, 1e300]  # 1e9: far beyond any binomial sum
SECONDS = 20.0  # per call: generous on shared CPUs, but a loop over T = 1e12 would take hours
NOISES = (1e-200, 1e-100, 1.0, 1e10, 1e200)  # increasing

SHAPES = {  # (dataset_size, batch_size, steps)
    "n1e9-b1-T1e12": (10**9, 1, 10**12),
    "n1e9-b1-T1": (10**9, 1, 1),
    "full-batch-T1e12": (1000, 1000, 10**12),
    "n1000-b10-T1e12": (1000, 10, 10**12),
}
_SMOOTH = {"learning_rate": 0.1, "smoothness": 1.0}
ASSUMPTIONS = {
    "no-assumption": {},
    "strongly-convex": {**_SMOOTH, "strong_convexity": 0.1, "gradient_norms_within_clip": True},
    "strongly-convex-diameter": {
        **_SMOOTH,
        "strong_convexity": 0.1,
        "gradient_norms_within_clip": True,
        "diameter": 1.0,
    },
    "glm-diameter": {**_SMOOTH, "clipped_loss_convex_smooth": True, "diameter": 1.0},
    "weakly-convex-diameter": {**_SMOOTH, "weak_convexity": 0.5, "diameter": 1.0},
}
SAMPLINGS = [s.value for s in lp.Sampling]
# A mixture over the secret position of the differing example: with noise 1e-200 only the positions
# used last leak, and their total weight can be below delta (a finite epsilon is then correct).
MIXTURES = {"shifted-interpolation-shuffle", "shifted-interpolation-reshuffle", "best"}
# The same for the Poisson and random-batch PLD rows (an exact profile, not an RDP curve): without noise, a
# step leaks only when the record is sampled, so with q = 1e-9 and one step delta(0) <= 1e-9 < DELTA: epsilon 0.
MIXTURES |= {"composition-pld-poisson", "composition-pld-poisson-replace-one", "composition-pld-random-batch"}
# The same for the membership mixtures: without noise, only the runs that use the record leak.
MIXTURES |= {
    "shifted-interpolation-random-batch",
    "shifted-interpolation-poisson",
    "shifted-interpolation-poisson-replace-one",
    "shifted-interpolation-random-allocation",
    "shifted-interpolation-random-allocation-replace-one",
}


def _relation(sampling: str) -> str:
    return "add_or_remove_one" if sampling == "poisson" else "replace_one"


def _strict(call):
    """``call()`` with every floating-point warning an error, timed."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.simplefilter("ignore", lp.OrderGridWarning)
        value = call()
    elapsed = time.perf_counter() - start
    assert elapsed < SECONDS, f"{elapsed:.1f} s"
    return value


def _has_rdp(bound: str) -> bool:
    """A PLD row is a privacy profile without a Renyi curve (its RDP is refused, with the reason)."""
    return bound not in lp.BOUNDS or lp.BOUNDS[bound].has_renyi_curve


def _numbers(bound: str, params: dict) -> tuple[np.ndarray | None, float] | None:
    """(RDP at ORDERS, epsilon) of ``bound``, or None where it does not apply (as applicable_bounds says)."""
    applies = lp.applicable_bounds(**params)[bound].applies
    try:
        eps = _strict(lambda: lp.epsilon(bound, DELTA, **params)).epsilon
        rdp = _strict(lambda: lp.rdp(bound, ORDERS, **params)) if _has_rdp(bound) else None
    except lp.NotApplicableError:
        assert not applies, bound
        return None
    assert applies, bound
    if rdp is None:
        with pytest.raises(lp.NotApplicableError, match="no Renyi-DP curve"):
            lp.rdp(bound, ORDERS, **params)
    else:
        assert rdp.shape == (len(ORDERS),) and not np.isnan(rdp).any() and (rdp >= 0).all(), (bound, rdp)
    assert not math.isnan(eps) and eps >= 0, (bound, eps)
    return rdp, eps


@pytest.mark.parametrize("assumptions", list(ASSUMPTIONS), ids=str)
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
def test_every_bound_at_extreme_noise_and_size(shape, sampling, assumptions):
    """Every bound id (best included) at z = 1e-200 .. 1e200: a number or inf (never NaN, a warning or
    another exception), non-increasing in z; finite at z = 1 (every order up to 1e9), 0 at z = 1e200,
    inf at z = 1e-200 outside the mixtures."""
    n, b, steps = SHAPES[shape]
    base = pipeline(dataset_size=n, batch_size=b, steps=steps, sampling=sampling, relation=_relation(sampling))
    base.update(ASSUMPTIONS[assumptions])
    noises = NOISES if steps > 1 else (NOISES[0], 1.0, NOISES[-1])  # one step: the extremes suffice
    computed = 0
    for bound in lp.BOUND_IDS:
        results = [_numbers(bound, {**base, "noise_multiplier": z}) for z in noises]
        if results[0] is None:
            assert all(r is None for r in results), bound  # applicability never depends on z
            continue
        computed += 1
        for (rdp_less, eps_less), (rdp_more, eps_more) in itertools.pairwise(results):  # more noise: never worse
            assert rdp_less is None or np.all(rdp_less >= rdp_more * (1 - 1e-9)), (bound, rdp_less, rdp_more)
            assert eps_less >= eps_more * (1 - 1e-9), (bound, eps_less, eps_more)
        rdp_one, eps_one = results[noises.index(1.0)]
        assert rdp_one is None or np.all(np.isfinite(rdp_one[:-1])), (bound, rdp_one)
        assert math.isfinite(eps_one), (bound, eps_one)
        assert results[-1][1] <= 1e-6, (bound, results[-1])  # noise 1e200 times the clip norm: nothing leaks
        if bound not in MIXTURES:
            assert results[0][1] == math.inf, (bound, results[0])  # no noise: the guarantee is vacuous
    assert computed >= 2  # composition and best at least


# ------------------------------------------------------------------ memory and time, one by one


def _peak_bytes(call) -> int:
    tracemalloc.start()
    try:
        _strict(call)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("bound", ["shifted-interpolation-shuffle", "ye-shokri-shuffle", "best"])
def test_shuffle_once_with_a_billion_batches_needs_bounded_memory(bound):
    """l = n/b = 1e9 batch positions: the profile is grouped into blocks, never one entry per position."""
    params = pipeline(dataset_size=10**9, batch_size=1, steps=10**12, sampling="shuffle_once")
    params.update(ASSUMPTIONS["strongly-convex-diameter"])
    assert _peak_bytes(lambda: lp.epsilon(bound, DELTA, **params)) < 200 * 2**20


def test_shuffle_once_profile_has_few_components_for_any_number_of_batches():
    weights, mus = shifted_interpolation.shuffle_once_profile(
        step_mu=2.0, contraction=0.99, dataset_size=2**53, batch_size=1, steps=2**53
    )
    assert weights.size <= 2 * (shifted_interpolation.EXACT_POSITIONS + 3000)
    assert weights.sum() == pytest.approx(1.0, abs=1e-12) and np.all(np.isfinite(mus)) and np.all(mus >= 0)


def _mixture_delta(weights, mus, eps):
    """sum_j w_j delta_{mu_j}(eps), component by component (no merging of components)."""
    return float(np.sum(np.asarray(weights) * profiles.gdp_delta(np.asarray(mus), eps)))


@pytest.mark.parametrize(
    ("n", "b", "steps", "contraction", "diameter_ratio"),
    [
        (4000, 1, 4000 * 3 + 777, 0.9999, None),  # a partial last pass
        (8001, 2, 4001 * 2, 0.999, None),  # a short last batch
        (3900, 1, 3900 * 4, 1.0, None),  # convex
        (4096, 1, 4096 + 1234, 0.99, 50.0),  # projection, the restarts
        (3500, 1, 2000, 0.9, None),  # T < l: unused positions
    ],
    ids=["partial-pass", "short-batch", "convex", "diameter", "unused"],
)
def test_grouped_shuffle_profile_is_above_the_per_position_one(monkeypatch, n, b, steps, contraction, diameter_ratio):
    """The blocks (docstring of shuffle_once_profile: mu_j is non-increasing in r_j within a group, each
    block gets its largest mu) give a profile above the exact per-position mixture, and close to it."""
    kw = dict(step_mu=1.0, contraction=contraction, dataset_size=n, batch_size=b, steps=steps)
    exact_w, exact_mu = shifted_interpolation.shuffle_once_profile(**kw, diameter_ratio=diameter_ratio)
    assert exact_w.size == -(-n // b)  # <= EXACT_POSITIONS: one component per position
    monkeypatch.setattr(shifted_interpolation, "EXACT_POSITIONS", 16)
    grouped_w, grouped_mu = shifted_interpolation.shuffle_once_profile(**kw, diameter_ratio=diameter_ratio)
    assert grouped_w.size < exact_w.size / 4
    assert grouped_w.sum() == pytest.approx(1.0, abs=1e-12)
    for eps in (0.0, 0.1, 0.5, 1.0, 2.0, 4.0):
        exact, grouped = _mixture_delta(exact_w, exact_mu, eps), _mixture_delta(grouped_w, grouped_mu, eps)
        assert grouped >= exact * (1 - 1e-12), (eps, exact, grouped)
        assert grouped <= exact * 1.05 + 1e-15, (eps, exact, grouped)


def test_sampled_gaussian_at_huge_orders_is_the_gaussian_bound():
    """Orders above MAX_SUMMED_ORDER: alpha / (2 s^2), above the exact sum at the largest summed order."""
    top = float(sgm.MAX_SUMMED_ORDER)
    orders = np.array([top, np.nextafter(top, np.inf), 1e9, 1e15])
    for values in (sgm.sgm_rdp(0.01, 2.0, orders), sgm.sgm_without_replacement_rdp(0.01, 2.0, orders)):
        np.testing.assert_allclose(values[1:], orders[1:] / 8.0, rtol=1e-15)
        assert values[0] <= values[1]
    peak = _peak_bytes(lambda: lp.rdp("composition", [1e9, 1e15], **pipeline(sampling="poisson",
                                                                           relation="add_or_remove_one")))  # fmt: skip
    assert peak < 50 * 2**20


@pytest.mark.parametrize("z", [1e-200, 1e-130, 1e200, 1e150], ids=str)
def test_sampled_gaussian_at_extreme_noise(z):
    """Noise so small that 1/(2 s^2) > 1e250: inf at every order; so large that it underflows: 0 up to
    the rounding of a sum of probabilities (orders <= 256, where Wang et al.'s sum is exact)."""
    orders = np.array([1.01, 1.5, 2.0, 3.0, 200.0])
    for values in (
        _strict(lambda: sgm.sgm_rdp(0.1, z, orders, exact_fractional=True)),
        _strict(lambda: sgm.sgm_without_replacement_rdp(0.1, z, orders)),
    ):
        if z < 1:
            np.testing.assert_array_equal(values, np.full(orders.shape, math.inf))
        else:
            assert np.all(values >= 0) and np.all(values <= 1e-15), values


def _exact_recursion(orders, **kw):
    return ye_shokri.random_batch_rdp(orders, tolerance=-1.0, max_iterations=10**12, exact_steps=10**12, **kw)


@pytest.mark.parametrize("seed", range(6))
def test_random_batch_jumps_are_above_the_exact_recursion(seed):
    """The jumps (after only 64 exact steps here) and the fixed point bound the exact recursion from above."""
    rng = np.random.default_rng(seed)
    orders = np.array([1.01, 1.5, 2.0, 4.0, 16.0, 64.0, 256.0])
    kw = dict(
        noise_multiplier=10 ** rng.uniform(-0.3, 1.3),
        sampling_probability=10 ** rng.uniform(-3, -0.5),
        steps=int(10 ** rng.uniform(4, 5)),
        contraction=1 - 10 ** rng.uniform(-4, -1),
    )
    exact = _exact_recursion(orders, **kw)
    jumped = _strict(lambda: ye_shokri.random_batch_rdp(orders, exact_steps=64, **kw))
    assert np.all(jumped >= exact * (1 - 1e-9)), (kw, jumped, exact)
    assert np.all(jumped <= exact * 1.01 + 1e-12), (kw, jumped / exact)


@pytest.mark.parametrize("strong_convexity", [5e-7, 1e-4, 0.5], ids=str)
def test_random_batch_recursion_does_not_loop_over_a_trillion_steps(strong_convexity):
    """T = 1e12: extrapolated (a contraction close to 1 converges over ~1e7 steps), non-decreasing in T."""
    params = pipeline(dataset_size=10**9, batch_size=1, sampling="random_batch", learning_rate=0.1, steps=None,
                      smoothness=1.0, strong_convexity=strong_convexity, gradient_norms_within_clip=True)  # fmt: skip
    short = _strict(lambda: lp.rdp("ye-shokri-random", ORDERS[:3], **{**params, "steps": 10**6}))
    long = _strict(lambda: lp.rdp("ye-shokri-random", ORDERS[:3], **{**params, "steps": 10**12}))
    assert np.all(np.isfinite(long)) and np.all(long >= short * (1 - 1e-9))


# ------------------------------------------------------------------ calibration


@pytest.mark.parametrize(
    ("sampling", "assumptions", "shape"),
    [
        ("cyclic", "strongly-convex-diameter", "n1e9-b1-T1e12"),
        ("shuffle_once", "glm-diameter", "n1e9-b1-T1e12"),
        ("reshuffle", "no-assumption", "n1e9-b1-T1e12"),
        ("poisson", "no-assumption", "n1e9-b1-T1e12"),
        ("random_batch", "glm-diameter", "n1000-b10-T1e12"),
        ("cyclic", "no-assumption", "full-batch-T1e12"),
    ],
    ids=str,
)
def test_calibrate_noise_at_extreme_sizes(sampling, assumptions, shape):
    """A noise multiplier that meets the target (re-checked), or CalibrationError (a ValueError)."""
    n, b, steps = SHAPES[shape]
    params = pipeline(dataset_size=n, batch_size=b, steps=steps, sampling=sampling, relation=_relation(sampling))
    params.update(ASSUMPTIONS[assumptions])
    params.pop("noise_multiplier")
    try:
        z = _strict(lambda: lp.calibrate_noise("best", 1.0, DELTA, **params)).noise_multiplier
    except lp.CalibrationError as exc:
        assert "max_noise_multiplier" in str(exc)
        assert lp.epsilon("best", DELTA, noise_multiplier=1e4, **params).epsilon > 1.0
        return
    assert 0 < z <= 1e4 and lp.epsilon("best", DELTA, noise_multiplier=z, **params).epsilon <= 1.0


# ------------------------------------------------------------------ out of range: ValueError naming the parameter


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"steps": 2**53 + 1}, "steps must be an integer <= 2**53"),
        ({"steps": 10**400}, "steps must be an integer <= 2**53"),
        ({"dataset_size": 10**400, "batch_size": 1}, "dataset_size must be an integer <= 2**53"),
        ({"batch_size": 10**400}, "batch_size must be an integer <= 2**53"),
        ({"noise_multiplier": 10**400}, "noise_multiplier must be a finite number > 0"),
        ({"diameter": 10**400}, "diameter must be a finite number > 0"),
        ({"steps": None, "epochs": 10**15}, "epochs must be <= 2**53 / ceil(dataset_size / batch_size)"),
    ],
    ids=["steps-2**53+1", "steps-1e400", "n-1e400", "b-1e400", "z-1e400", "D-1e400", "epochs-1e15"],
)
def test_out_of_range_values_name_the_parameter_and_the_range(changes, fragment):
    params = {k: v for k, v in {**pipeline(), **changes}.items() if v is not None}
    for call in (lambda: lp.rdp("best", [2.0], **params), lambda: lp.epsilon("composition", DELTA, **params)):
        with pytest.raises(ValueError) as info:
            call()
        assert fragment in str(info.value) and not isinstance(info.value, lp.NotApplicableError)


# ------------------------------------------------------------------ the command line


def _cli(capsys, argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def _extreme_flags(z, sampling, shape="n1e9-b1-T1e12", assumptions="strongly-convex-diameter"):
    n, b, steps = SHAPES[shape]
    params = pipeline(dataset_size=n, batch_size=b, steps=steps, noise_multiplier=z, sampling=sampling,
                      relation=_relation(sampling), **ASSUMPTIONS[assumptions])  # fmt: skip
    return cli_flags(params)


@pytest.mark.parametrize("z", [1e-200, 1e200], ids=str)
@pytest.mark.parametrize("sampling", ["shuffle_once", "random_batch", "poisson"], ids=str)
def test_cli_epsilon_and_bounds_at_extremes(capsys, z, sampling):
    code, out, err = _cli(
        capsys, ["epsilon", "--bound", "best", "--delta", DELTA, *_extreme_flags(z, sampling), "--format", "json"]
    )
    assert code == 0 and not err, err
    eps = json.loads(out)["epsilon"]  # JSON writes inf as null
    assert (eps is None or eps > 0) if z < 1 else eps == pytest.approx(0.0, abs=1e-6)
    code, out, err = _cli(capsys, ["bounds", "--delta", DELTA, *_extreme_flags(z, sampling), "--format", "json"])
    assert code == 0 and not err, err
    rows = json.loads(out)["bounds"]
    assert all(r["epsilon"] is None or r["epsilon"] >= 0 for r in rows)
    assert any(r["applies"] and r["bound"] != "best" for r in rows)


@pytest.mark.parametrize("z", [1e-200, 1e200], ids=str)
def test_cli_compare_with_flags_at_extremes(capsys, z):
    code, out, err = _cli(capsys, ["compare", *_extreme_flags(z, "shuffle_once"), "--format", "json"])
    assert code == 0, err
    assert json.loads(out)["rows"]


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--noise-multiplier", "1e-400", "noise_multiplier"),  # parses to 0.0
        ("--noise-multiplier", "1e400", "noise_multiplier"),  # parses to inf
        ("--steps", str(10**20), "steps must be an integer <= 2**53"),
        ("--dataset-size", "1e9", "dataset-size"),  # not an integer literal
    ],
    ids=["z-underflow", "z-overflow", "steps-1e20", "n-float-literal"],
)
def test_cli_out_of_range_exits_2_with_one_line(capsys, flag, value, fragment):
    argv = ["epsilon", "--bound", "best", "--delta", DELTA, *_extreme_flags(1.0, "cyclic")]
    argv[argv.index(flag) + 1] = value
    code, _, err = _cli(capsys, argv)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err


@pytest.mark.parametrize(
    ("sampling", "relation"),
    [("poisson", "add_or_remove_one"), ("random_batch", "replace_one"), ("cyclic", "replace_one")],
)
def test_compare_at_a_trillion_steps_finishes_without_exhausting_memory(sampling, relation):
    from lastiter_plugins import compare

    result = compare.compare(
        1e-5, dataset_size=10**9, batch_size=1, noise_multiplier=1.0, steps=10**12, sampling=sampling, relation=relation
    )
    (best,) = (b for b in result.best if b.declared)
    assert best.epsilon is not None and math.isfinite(best.epsilon)
    for row_id in ("opacus-prv", "dp-accounting-pld-poisson"):
        row = next((r for r in result.rows if r.id == row_id), None)
        if row is not None:
            assert row.epsilon is None and any("not computed" in n for n in row.notes)
    for row_id in ("composition-pld-poisson", "composition-pld-poisson-replace-one", "composition-pld-random-batch"):
        row = result.row(row_id)
        assert row.epsilon is None and (sampling != "poisson" or "steps must be <= 1e+06" in " ".join(row.why_not))
