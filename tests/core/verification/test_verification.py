"""G3 (projected 1-D random walk) correctness, its certified grid error, the
certified privacy profiles (hockey-stick divergences) of G1/G2/G3, a fast subset
of the soundness fuzzing (the full run is marked slow), and the layering of the
verification package (public API and math modules only).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import integrate, special

import lastiter_plugins as lp
from lastiter_plugins.lower_end.exact import (
    Instance,
    g1_divergence,
    g1_params,
    g2_params,
    g3_divergence,
    g3_error_terms,
    g3_params,
    gaussian_mixture_hockey_stick,
)
from lastiter_plugins.verification import fuzz
from tests.support import imported_modules

ORDERS = np.array([2.0, 4.0, 8.0])
SMALL = {"max_nodes": 400, "fine_cells": 4000, "tolerance": 1e-3}


def _phi(x, s):
    return np.exp(-0.5 * (x / s) ** 2) / (s * math.sqrt(2 * math.pi))


def _two_step_law(x0, d1, d2, half, s):
    """Independent closed form / quad for the law after two projected steps with drifts d1, d2."""
    a_l = special.ndtr((-half - x0 - d1) / s)
    a_r = special.ndtr((x0 + d1 - half) / s)
    r = s / math.sqrt(2.0)

    def density(y):
        m = ((y - d2) + (x0 + d1)) / 2.0
        inner = _phi((y - d2) - (x0 + d1), s * math.sqrt(2.0)) * (
            special.ndtr((half - m) / r) - special.ndtr((-half - m) / r)
        )
        return a_l * _phi(y + half - d2, s) + a_r * _phi(y - half - d2, s) + inner

    def atom(sign):
        edge = sign * half  # mass beyond +half (sign=1) or below -half (sign=-1)

        def tail(x):
            return special.ndtr(sign * (x + d2 - edge) / s)

        inner, _ = integrate.quad(lambda x: tail(x) * _phi(x - x0 - d1, s), -half, half, epsabs=0, epsrel=1e-13)
        return a_l * tail(-half) + a_r * tail(half) + inner

    return density, atom(-1), atom(1)


def _renyi(alpha, laws_p, laws_q, half):
    (p, pl, pr), (q, ql, qr) = laws_p, laws_q
    inner, _ = integrate.quad(
        lambda y: p(y) ** alpha * q(y) ** (1 - alpha), -half, half, epsabs=0, epsrel=1e-12, limit=200
    )
    return math.log(inner + pl**alpha * ql ** (1 - alpha) + pr**alpha * qr ** (1 - alpha)) / (alpha - 1)


HS_EPS = np.array([0.0, 0.3, 1.0])


def _hockey(eps, laws_p, laws_q, half):
    """sup_A P(A) - e^eps Q(A) by quadrature: the density part plus the two atoms."""
    (p, pl, pr), (q, ql, qr) = laws_p, laws_q
    scale = math.exp(eps)
    inner, _ = integrate.quad(lambda y: max(p(y) - scale * q(y), 0.0), -half, half, epsabs=1e-13, limit=400)
    return inner + max(pl - scale * ql, 0.0) + max(pr - scale * qr, 0.0)


def _mix(laws, weights):
    def density(y):
        return sum(w * law[0](y) for law, w in zip(laws, weights, strict=True))

    return (
        density,
        sum(w * law[1] for law, w in zip(laws, weights, strict=True)),
        sum(w * law[2] for law, w in zip(laws, weights, strict=True)),
    )


@pytest.mark.parametrize(
    ("n", "b", "sampling", "x0"),
    [(1, 1, "cyclic", 0.0), (2, 1, "cyclic", 0.3), (4, 1, "random_batch", -0.2), (3, 1, "shuffle_once", 0.1)],
    ids=["cyclic-both-steps", "cyclic-position", "random-batch-mixture", "shuffle-once-mixture"],
)
def test_two_steps_match_an_independent_computation(n, b, sampling, x0):
    """T = 2: the certified interval contains the divergence computed by closed
    forms and scipy quadrature (no grid)."""
    d, z, diameter = 0.5, 1.0, 1.6  # drift eta C / b = 0.5, noise s = 0.5, D / s = 3.2
    params = g3_params(diameter=diameter, dataset_size=n, batch_size=b, noise_multiplier=z, steps=2,
                       learning_rate=0.5, clip_norm=1.0, sampling=sampling)  # fmt: skip
    s, half = 0.5, diameter / 2
    position = 0 if sampling == "cyclic" else None
    exact, grid = g3_divergence(ORDERS, params, x0=x0, position=position, **SMALL)

    def law(pattern, sign):
        return _two_step_law(x0, sign * d * pattern[0], sign * d * pattern[1], half, s)

    if sampling == "cyclic":
        pattern = (1, 1) if n == 1 else (1, 0)
        laws = [(law(pattern, 1), law(pattern, -1))]
        weights = [1.0]
    elif sampling == "random_batch":
        q = b / n
        patterns = [(1, 1), (1, 0), (0, 1), (0, 0)]
        laws = [(law(p, 1), law(p, -1)) for p in patterns]
        weights = [q ** sum(p) * (1 - q) ** (2 - sum(p)) for p in patterns]
    else:  # shuffle_once, n = 3, b = 1: position j in {0, 1, 2}, used at step j + 1 if j < 2
        patterns = [(1, 0), (0, 1), (0, 0)]
        laws = [(law(p, 1), law(p, -1)) for p in patterns]
        weights = [1 / 3] * 3
    p_law = _mix([pq[0] for pq in laws], weights)
    q_law = _mix([pq[1] for pq in laws], weights)
    for i, alpha in enumerate(ORDERS):
        truth = max(_renyi(alpha, p_law, q_law, half), _renyi(alpha, q_law, p_law, half))
        assert exact.lower[i] <= truth <= exact.upper[i], (alpha, exact.lower[i], truth, exact.upper[i])
    assert grid.relative_error < 1e-3
    # the certified privacy profile of the same laws contains the quadrature's hockey-stick divergence
    with_profile, _ = g3_divergence(ORDERS, params, x0=x0, position=position, hockey_stick=True, **SMALL)
    lower, upper = with_profile.hockey_stick.delta(HS_EPS)
    for i, eps in enumerate(HS_EPS):
        truth = max(_hockey(eps, p_law, q_law, half), _hockey(eps, q_law, p_law, half))
        assert lower[i] <= truth <= upper[i], (eps, lower[i], truth, upper[i])
        assert upper[i] - lower[i] <= 0.05 * truth + 1e-9  # coarse test grid: still catches a 5% optimistic profile


def test_one_step_without_reachable_boundary_is_the_gaussian_closed_form():
    """D / s = 40: the projection is never active at the orders checked; T = 1 is G1's 2 alpha / z^2."""
    params = g3_params(diameter=40.0, dataset_size=1, batch_size=1, noise_multiplier=2.0, steps=1,
                       learning_rate=1.0, sampling="cyclic")  # fmt: skip
    exact, _ = g3_divergence(np.array([2.0, 3.0]), params)
    closed = g1_divergence(np.array([2.0, 3.0]), g1_params(dataset_size=1, batch_size=1, noise_multiplier=2.0,
                                                           steps=1, sampling="cyclic"))  # fmt: skip
    assert np.all(exact.lower <= closed.lower + 1e-9) and np.all(closed.upper <= exact.upper + 1e-9)


def test_full_batch_sampling_equals_cyclic():
    """q = 1 (b = n): RANDOM_BATCH and CYCLIC are the same process; the intervals coincide."""
    common = dict(diameter=1.0, dataset_size=2, batch_size=2, noise_multiplier=1.5, steps=4, learning_rate=0.4)
    a, _ = g3_divergence(ORDERS, g3_params(sampling="cyclic", **common), x0=0.1, **SMALL)
    b, _ = g3_divergence(ORDERS, g3_params(sampling="random_batch", **common), x0=0.1, **SMALL)
    np.testing.assert_allclose(a.lower, b.lower, rtol=1e-9)


def test_certified_intervals_at_two_resolutions_overlap_and_shrink():
    params = g3_params(diameter=1.2, dataset_size=3, batch_size=1, noise_multiplier=1.0, steps=6,
                       learning_rate=0.3, sampling="random_batch")  # fmt: skip
    coarse, g_coarse = g3_divergence(ORDERS, params, max_nodes=150, fine_cells=1500, tolerance=1e-9)
    fine, g_fine = g3_divergence(ORDERS, params, max_nodes=600, fine_cells=6000, tolerance=1e-9)
    assert np.all(np.maximum(coarse.lower, fine.lower) <= np.minimum(coarse.upper, fine.upper))
    assert g_fine.relative_error < g_coarse.relative_error / 10
    assert np.all(fine.width < coarse.width)


def test_grid_error_bound_is_second_order_in_the_spacing():
    e1 = g3_error_terms(1.0, 0.3, (0.0, 0.1, -0.1), 200, 2000, 10).relative_error
    e2 = g3_error_terms(1.0, 0.3, (0.0, 0.1, -0.1), 399, 2000, 10).relative_error
    assert 3.5 < e1 / e2 < 4.5


def test_grid_error_is_far_below_the_soundness_margins():
    """On the reference G3 instances the certified width of the exact value is
    < 2% of the exact value and < 1/10 of each last-iterate bound's margin."""
    rows = []
    for sampling, relation, bid in [
        ("random_batch", "replace_one", "altschuler-talwar"),
        ("poisson", "add_or_remove_one", "liang-bounded"),
        ("cyclic", "replace_one", "kong-ribero-bounded"),
    ]:
        params = g3_params(diameter=1.0, dataset_size=4, batch_size=1, noise_multiplier=1.0, steps=8,
                           learning_rate=0.5, sampling=sampling, relation=relation)  # fmt: skip
        exact, _ = g3_divergence(ORDERS, params, max_nodes=1500, fine_cells=12000, tolerance=1e-4)
        bound = lp.rdp(bid, ORDERS, **params)
        margin = bound - exact.estimate
        rows.append((bid, exact.width.max(), margin.min()))
        assert np.all(exact.width < 0.02 * exact.estimate)
        assert np.all(exact.width < 0.1 * margin)
    print("\n".join(f"{b}: certified width {w:.2e}, smallest margin {m:.3g}" for b, w, m in rows))


def test_fuzz_targets_every_bound_of_the_table():
    assert set(fuzz.TARGETS) == set(lp.BOUNDS)


# The second CI step (scripts/test_environments.sh) runs it, not the README's test command: a minute of CPU or more,
# most of it in dp-accounting's PLD of the random-batch instances; the ground-truth sweeps of test_ground_truth.py
# check every bound on exact instances in the default run.
@pytest.mark.slow
def test_fuzz_subset_fast():
    """A fixed-seed subset of the soundness fuzzing: every bound checked >= 4 times,
    every f-DP bound's profile against the exact hockey-stick divergence too."""
    report = fuzz.fuzz(checks_per_bound=4, seed=7, orders=np.array([2.0, 4.0, 16.0]))
    print("\n" + report.summary())
    assert not report.violations, report.summary()
    assert set(report.checks) >= set(fuzz.TARGETS)
    assert all(report.checks[b] >= 4 for b in fuzz.TARGETS)
    gdp = [bid for bid, spec in lp.BOUNDS.items() if spec.kind in (lp.Kind.GDP, lp.Kind.PLD)]
    assert gdp and all(report.bounds[b].hockey_stick_checks >= 4 for b in gdp)
    record = report.to_dict()
    unproven = {bid for bid, spec in lp.BOUNDS.items() if not spec.proof.proven}
    assert set(record["unproven"]) == unproven and not unproven & set(record["proven"])


@pytest.mark.slow
def test_fuzz_full():
    """>= 1000 checks per bound (minutes; run with --runslow)."""
    report = fuzz.fuzz(checks_per_bound=1000, seed=2026)
    print("\n" + report.summary())
    assert not report.violations, report.summary()
    assert all(report.checks[b] >= 1000 for b in fuzz.TARGETS)
    gdp = [bid for bid, spec in lp.BOUNDS.items() if spec.kind in (lp.Kind.GDP, lp.Kind.PLD)]
    assert all(report.bounds[b].hockey_stick_checks >= 1000 for b in gdp)


def test_tightness_report_renders_and_flags_nothing_on_a_small_grid(tmp_path):
    pytest.importorskip("matplotlib")  # the report draws a PNG (the `plot` extra)
    from lastiter_plugins.verification import tightness

    panel = tightness.Panel(
        "G1 cyclic small",
        "G1",
        (2, 5),
        lambda t: g1_params(dataset_size=4, batch_size=2, noise_multiplier=1.0, steps=t, sampling="cyclic"),
    )
    rows = tightness.compute((panel,))
    assert rows and not any(r.below for r in rows)
    assert all(r.ratios.min() >= 1 - 1e-9 for r in rows)
    text = tightness.to_markdown(rows, 0.0, "cmd")
    assert "| 5 | ye-shokri-convex |" in text and "Soundness violations in this grid: 0." in text
    tightness.plot(rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 1000


# ------------------------------------------------------------------ privacy profiles (hockey-stick divergence)


def _gaussian_delta(mu, eps):
    """Closed form of mu-GDP (Dong, Roth & Su 2019, arXiv 1905.02383, Cor. 2.13), where it does not cancel."""
    return special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(-eps / mu - mu / 2)


@pytest.mark.parametrize(("mu", "eps"), [(0.3, 0.1), (1.0, 1.0), (2.0, 3.0), (5.0, 10.0), (0.5, 2.0)])
def test_gaussian_hockey_stick_contains_the_closed_form(mu, eps):
    profile = gaussian_mixture_hockey_stick([1.0], [mu / 2], [1.0], [-mu / 2], 1.0)
    (lower,), (upper,) = profile.delta([eps])
    exact = _gaussian_delta(mu, eps)
    assert lower <= exact <= upper
    assert lower >= exact * (1 - 1e-4)  # a profile 1e-4 below the truth would be caught
    assert upper <= exact * 1.02
    eps_low, eps_up = profile.epsilon(exact)
    assert eps_low <= eps <= eps_up and eps_up - eps_low < 0.01 * eps + 1e-6


def test_mixture_hockey_stick_contains_an_independent_integral():
    w, p_means, q_means, std = np.array([0.2, 0.5, 0.3]), np.array([0.0, 0.4, 1.5]), np.array([0.1, -0.6, -1.0]), 0.7
    profile = gaussian_mixture_hockey_stick(w, p_means, w, q_means, std**2)

    def density(x, means):
        return float(np.sum(w * np.exp(-0.5 * ((x - means) / std) ** 2)) / (std * math.sqrt(2 * math.pi)))

    for eps in (0.0, 0.5, 2.0):
        lower, upper = profile.delta([eps])
        truth = 0.0
        for a, b in ((p_means, q_means), (q_means, p_means)):
            value, _ = integrate.quad(
                lambda x, a=a, b=b, e=eps: max(density(x, a) - math.exp(e) * density(x, b), 0.0),
                -15, 15, epsabs=1e-14, limit=500, points=[-1.0, 0.0, 1.0],
            )  # fmt: skip
            truth = max(truth, value)
        assert lower[0] <= truth <= upper[0], (eps, lower, truth, upper)


def test_a_slightly_optimistic_profile_is_caught():
    """shifted-interpolation-full-batch is exact on G1 with b = n; a profile 0.1% below it must fail the check."""
    instance = Instance("G1", g1_params(dataset_size=4, batch_size=4, noise_multiplier=1.3, steps=9, sampling="cyclic"))
    checks = {c.bound: c for c in fuzz.check_instance(instance)}
    honest = checks["shifted-interpolation-full-batch"]
    assert not honest.failed and honest.delta_ratios.min() < 1 + 1e-4  # attained
    deflated = dataclasses.replace(honest, bound_delta=honest.bound_delta * (1 - 1e-3))
    assert deflated.failed and deflated.delta_violations.size


def test_g2_cyclic_profile_of_the_worst_position_is_below_the_bound():
    params = g2_params(strong_convexity=0.3, dataset_size=12, batch_size=4, noise_multiplier=1.0, learning_rate=2.0,
                       steps=7, sampling="cyclic")  # fmt: skip
    exact = Instance("G2", params).exact(np.array([2.0]), hockey_stick=True)
    config, assumptions = lp.build(**params)
    profile = lp.BOUNDS["shifted-interpolation-cyclic"].profile(config, assumptions)
    for eps in (0.0, 0.5, 2.0):
        lower, _ = exact.hockey_stick.delta([eps])
        assert profile.delta(eps) >= lower[0]


def test_fuzz_command_writes_a_record_per_bound(tmp_path):
    out = tmp_path / "fuzz.json"
    code = fuzz.main(["--checks-per-bound", "3", "--seed", "3", "--bound", "shifted-interpolation-shuffle",
                      "--bound", "altschuler-talwar", "--json", str(out)])  # fmt: skip
    record = json.loads(out.read_text())
    assert code == 0 and record["seed"] == 3
    assert record["proven"]["shifted-interpolation-shuffle"]["hockey_stick_checks"] >= 3
    assert record["unproven"]["altschuler-talwar"]["checks"] >= 3
    assert record["violations_of_proven_bounds"] == []


# ------------------------------------------------------------------ layering

_ALLOWED = (
    "lastiter_plugins.bounds",
    "lastiter_plugins.profiles",
    "lastiter_plugins.lower_end",
    "lastiter_plugins.verification",
)


def test_verification_imports_only_the_public_api_and_the_math_modules():
    """lastiter_plugins.verification uses `import lastiter_plugins as lp` (the public API), the math
    modules (bounds, profiles), the exact laws it shares with the product's lower end (lower_end) and
    itself: no adapters, no registry, evaluation, compare or api
    internals, and no host library (host comparisons live in benchmarks/)."""
    folder = Path(lp.__file__).parent / "verification"
    bad = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.module != "lastiter_plugins" else []
                if node.module == "lastiter_plugins":  # from lastiter_plugins import X: X must be public
                    bad += [f"{path.name}: {a.name}" for a in node.names if a.name not in lp.__all__]
            for name in names:
                if name.startswith("lastiter_plugins") and name != "lastiter_plugins" and not name.startswith(_ALLOWED):
                    bad.append(f"{path.name}: {name}")
                if name.split(".")[0] in ("opacus", "tensorflow", "tensorflow_privacy", "torch", "dp_accounting"):
                    bad.append(f"{path.name}: {name}")
    assert not bad, bad


def test_no_module_of_the_product_imports_the_verification_suite():
    """Layers point one way: the verification suite may import the product, never the reverse (the
    lower end lives in lastiter_plugins.lower_end). Every module of the package and the adapters is read,
    function-level imports included."""
    root = Path(lp.__file__).parent
    files = [p for p in root.rglob("*.py") if "verification" not in p.relative_to(root).parts]
    assert len(files) > 30 and any("adapters" in p.parts for p in files)  # the package and the adapters were found
    bad = [
        f"{path.relative_to(path.parents[1])}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.startswith("lastiter_plugins.verification")
    ]
    assert not bad, bad
