"""Certified linear models (lastiter_plugins.glm) and feature clipping (lastiter_plugins.feature_clip).

Each test pins one claim of docs/derivations/glm.md#glm-route ("Section N" in a docstring is part N there):
bounds are checked over random and adversarial points, and their tightness is
checked too, so a wrong constant in either direction fails.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

import lastiter_plugins as lp
from lastiter_plugins import feature_clip, glm
from lastiter_plugins.config import LossAssumptions

FAST = settings(max_examples=150, deadline=None)

# ---------------------------------------------------------------- scalar losses (float64 closed forms)


def _sigmoid(u):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(u, dtype=float)))


def _phi_prime(family: str, u, y, delta=1.0, gamma=0.5):
    u = np.asarray(u, dtype=float)
    if family == "binary_logistic":  # -y log s(u) - (1-y) log(1-s(u)), y in [0, 1]
        return _sigmoid(u) - y
    if family == "squared":  # (u - y)^2
        return 2.0 * (u - y)
    if family == "huber":
        return np.clip(u - y, -delta, delta)
    if family == "smoothed_hinge":  # y = +-1, margin m = y u
        m = y * u
        return y * np.where(m >= 1.0, 0.0, np.where(m <= 1.0 - gamma, -1.0, (m - 1.0) / gamma))
    raise AssertionError(family)


SCALAR = ["binary_logistic", "huber", "smoothed_hinge", "squared"]
SLOPE = {"binary_logistic": 1.0, "huber": 1.0, "smoothed_hinge": 1.0}  # delta = 1
CURVATURE = {"binary_logistic": 0.25, "huber": 1.0, "smoothed_hinge": 2.0, "squared": 2.0}  # gamma = 0.5


def _family_kwargs(family: str, radius=None, labels=None) -> dict:
    extra = {"huber": {"huber_delta": 1.0}, "smoothed_hinge": {"hinge_smoothing": 0.5}}.get(family, {})
    if family == "squared" and radius is not None:
        extra = {"projection_radius": radius, "label_bound": labels}
    return extra


def _label(family: str, draw_unit: float) -> float:
    if family == "smoothed_hinge":
        return 1.0 if draw_unit >= 0.5 else -1.0
    if family == "binary_logistic":
        return draw_unit  # soft labels in [0, 1]
    return 4.0 * draw_unit - 2.0  # |y| <= 2


@FAST
@given(
    family=st.sampled_from(SCALAR),
    u=st.one_of(st.floats(-1e6, 1e6), st.floats(-5.0, 5.0)),
    label=st.floats(0.0, 1.0),
)
def test_scalar_slope_and_curvature_bounds(family, u, label):
    """Section 1: |phi'| <= sup |phi'| (families with a finite one), phi'' <= sup phi'' (difference quotients)."""
    y = _label(family, label)
    if family in SLOPE:
        assert abs(float(_phi_prime(family, u, y))) <= SLOPE[family]
    h = 1e-4 * max(1.0, abs(u))
    quotient = (_phi_prime(family, u + h, y) - _phi_prime(family, u - h, y)) / (2.0 * h)
    assert -1e-12 <= float(quotient) <= CURVATURE[family] * (1.0 + 1e-6)


def test_logistic_bounds_are_tight():
    """Section 1: sup |phi'| = 1 is approached (u -> -inf, y = 1) and phi''(0) = 1/4 is attained."""
    assert abs(float(_phi_prime("binary_logistic", -40.0, 1.0))) > 1.0 - 1e-12
    assert float(_sigmoid(0.0) * (1.0 - _sigmoid(0.0))) == 0.25
    cert = glm.certify_linear_model("binary_logistic", feature_norm_bound=2.0, clip_norm=1.0, bias=True)
    assert cert.max_gradient_norm == pytest.approx(math.sqrt(5.0), rel=1e-15)
    assert cert.data_smoothness == pytest.approx(5.0 / 4.0, rel=1e-15)


@FAST
@given(
    family=st.sampled_from(SCALAR),
    bias=st.booleans(),
    a_norm=st.floats(1e-3, 10.0),
    direction=st.lists(st.floats(-1.0, 1.0), min_size=3, max_size=3),
    x=st.lists(st.floats(-1.0, 1.0), min_size=4, max_size=4),
    scale=st.floats(0.0, 1.0),
    label=st.floats(0.0, 1.0),
)
def test_glm_gradient_norm_within_certified_bound(family, bias, a_norm, direction, x, scale, label):
    """Section 1/6: the data-term gradient norm phi'(u) |a~| <= max_gradient_norm, features at norm exactly A."""
    d = np.array(direction)
    if np.linalg.norm(d) < 1e-6:
        d = np.array([1.0, 0.0, 0.0])
    a = a_norm * d / np.linalg.norm(d)
    a_t = np.append(a, 1.0) if bias else a
    radius = 3.0
    xv = np.array(x if bias else x[:3])
    xv = radius * scale * xv / max(np.linalg.norm(xv), 1e-12)  # inside the ball |x| <= 3
    y = _label(family, label)
    cert = glm.certify_linear_model(
        family, feature_norm_bound=a_norm, clip_norm=1.0, bias=bias, **_family_kwargs(family, radius, 2.0)
    )
    grad = _phi_prime(family, a_t @ xv, y) * a_t
    assert np.linalg.norm(grad) <= cert.max_gradient_norm * (1.0 + 1e-12)
    assert cert.data_smoothness == pytest.approx(CURVATURE[family] * float(a_t @ a_t), rel=1e-12)


def test_squared_gradient_bound_is_attained_on_the_ball():
    """Section 1: 2 A~ (A~ B + Y) is reached at x = -B a~/|a~|, y = Y; without a ball it is unbounded."""
    a = np.array([0.6, 0.8])  # |a| = 1, A~ = sqrt(2) with the bias
    a_t = np.append(a, 1.0)
    cert = glm.certify_linear_model(
        "squared", feature_norm_bound=1.0, clip_norm=1.0, bias=True, projection_radius=2.0,
        projection_center_norm=1.0, label_bound=0.5,
    )  # fmt: skip
    x = -3.0 * a_t / np.linalg.norm(a_t)
    grad = _phi_prime("squared", a_t @ x, 0.5) * a_t
    assert np.linalg.norm(grad) == pytest.approx(cert.max_gradient_norm, rel=1e-12)
    assert cert.max_gradient_norm == pytest.approx(2.0 * math.sqrt(2.0) * (3.0 * math.sqrt(2.0) + 0.5))
    free = glm.certify_linear_model("squared", feature_norm_bound=1.0, clip_norm=1.0, bias=False)
    assert free.max_gradient_norm is None and free.clipping_can_be_active


# ---------------------------------------------------------------- softmax cross-entropy


def _softmax(z):
    z = np.asarray(z, dtype=float)
    e = np.exp(z - z.max())
    return e / e.sum()


def _softmax_grad(w, a, y):
    p = _softmax(w @ a)
    p[y] -= 1.0
    return np.outer(p, a)


@FAST
@given(
    k=st.integers(2, 6),
    seed=st.integers(0, 2**31 - 1),
    logit_scale=st.sampled_from([1e-3, 1.0, 30.0, 1e4, 1e6]),
    a_norm=st.floats(1e-2, 100.0),
    bias=st.booleans(),
)
def test_softmax_gradient_bound(k, seed, logit_scale, a_norm, bias):
    """Section 2: |grad_W f|_F = |p - e_y| |a~| <= sqrt(2) A~, including huge logits."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=5)
    a = a_norm * a / np.linalg.norm(a)
    a_t = np.append(a, 1.0) if bias else a
    w = logit_scale * rng.normal(size=(k, a_t.size))
    cert = glm.certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=a_norm, clip_norm=1.0, bias=bias, num_classes=k
    )
    for y in range(k):
        assert np.linalg.norm(_softmax_grad(w, a_t, y)) <= cert.max_gradient_norm * (1.0 + 1e-12)


@pytest.mark.parametrize("k", [2, 3, 10])
def test_softmax_gradient_sup_found_by_optimisation(k):
    """Section 2: the sup of |p - e_y| over logits, found numerically, is sqrt(2) (the bound is tight)."""
    rng = np.random.default_rng(k)
    best = 0.0
    for _ in range(20):
        res = optimize.minimize(
            lambda z: -float(np.sum((_softmax(z) - np.eye(k)[0]) ** 2)),
            rng.normal(scale=3.0, size=k),
            bounds=[(-40.0, 40.0)] * k,
            method="L-BFGS-B",
        )
        best = max(best, math.sqrt(-res.fun))
    assert math.sqrt(2.0) * (1.0 - 1e-6) <= best <= math.sqrt(2.0)
    # the same sup for the weights: W = z a^T / |a|^2 puts logits z at a feature of norm A
    a = np.array([3.0, 4.0])  # A = 5
    z = np.full(k, -40.0)
    z[1] = 40.0
    w = np.outer(z, a) / (a @ a)
    assert np.linalg.norm(_softmax_grad(w, a, 0)) >= math.sqrt(2.0) * 5.0 * (1.0 - 1e-12)


@FAST
@given(weights=st.lists(st.floats(0.0, 1.0), min_size=2, max_size=8), spike=st.integers(0, 7))
def test_softmax_covariance_eigenvalue_at_most_half(weights, spike):
    """Section 2: lambda_max(diag p - p p^T) <= 1/2 for every p in the simplex (Popoviciu)."""
    p = np.array(weights) + 1e-12
    p[spike % p.size] += 3.0 * p.sum() * (spike % 2)  # sometimes a dominant class
    p /= p.sum()
    assert np.linalg.eigvalsh(np.diag(p) - np.outer(p, p)).max() <= 0.5 + 1e-12


def _numeric_hessian(grad, w):
    """Central differences of the closed-form gradient, symmetrised."""
    flat = w.ravel()
    h = 1e-5
    cols = []
    for i in range(flat.size):
        e = np.zeros_like(flat)
        e[i] = h
        cols.append((grad((flat + e).reshape(w.shape)) - grad((flat - e).reshape(w.shape))).ravel() / (2 * h))
    hess = np.array(cols)
    return 0.5 * (hess + hess.T)


@pytest.mark.parametrize("seed", range(6))
def test_softmax_hessian_by_finite_differences(seed):
    """Section 2: the Hessian's top eigenvalue is <= A~^2/2 and equals the Kronecker closed form."""
    rng = np.random.default_rng(seed)
    k, a_norm = 3, 2.0
    a = rng.normal(size=3)
    a_t = np.append(a_norm * a / np.linalg.norm(a), 1.0)
    w = rng.normal(scale=2.0, size=(k, a_t.size))
    hess = _numeric_hessian(lambda v: _softmax_grad(v, a_t, 1), w)
    p = _softmax(w @ a_t)
    closed = np.kron(np.diag(p) - np.outer(p, p), np.outer(a_t, a_t))
    np.testing.assert_allclose(hess, closed, atol=1e-6)
    cert = glm.certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=a_norm, clip_norm=1.0, bias=True, num_classes=k
    )
    assert np.linalg.eigvalsh(hess).max() <= cert.data_smoothness * (1.0 + 1e-6)


def test_softmax_hessian_bound_is_attained():
    """Section 2: at p = (1/2, 1/2, 0) the top Hessian eigenvalue is A~^2/2 (the constant is tight)."""
    a = np.array([1.0, 2.0, 2.0])  # A = 3
    w = np.outer([0.0, 0.0, -60.0], a) / (a @ a)
    hess = _numeric_hessian(lambda v: _softmax_grad(v, a, 0), w)
    cert = glm.certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=3.0, clip_norm=1.0, bias=False, num_classes=3
    )
    assert np.linalg.eigvalsh(hess).max() == pytest.approx(cert.data_smoothness, rel=1e-6)
    assert cert.data_smoothness == 9.0 / 2.0


# ---------------------------------------------------------------- clipping a scalar GLM


def _clip(g, c, eps=0.0):
    norm = float(np.linalg.norm(g))
    return g * min(1.0, c / (norm + eps)) if norm + eps > 0 else g


@pytest.mark.parametrize("family", SCALAR)
@pytest.mark.parametrize("opacus_eps", [0.0, 1e-6, 0.3])
def test_clipped_scalar_derivative_is_monotone_and_lipschitz(family, opacus_eps):
    """Section 3: clip(phi'(u) a~) = psi'(u) a~ with psi' non-decreasing and Lip(psi') <= sup phi'' (also Opacus')."""
    u = np.linspace(-30.0, 30.0, 200_001)
    for y in [-1.0, 1.0] if family == "smoothed_hinge" else [0.0, 0.5, 1.0, -1.5]:
        for a_norm, c in [(3.0, 0.5), (1.0, 0.1), (0.2, 5.0), (5.0, 1e-7)]:
            t = _phi_prime(family, u, y)
            with np.errstate(divide="ignore"):
                psi = t * np.minimum(1.0, c / (np.abs(t) * a_norm + opacus_eps))
            steps = np.diff(psi) / np.diff(u)
            rounding = 8.0 * np.finfo(float).eps * np.abs(psi).max() / (u[1] - u[0])
            assert steps.min() >= -rounding
            assert steps.max() <= CURVATURE[family] * (1.0 + 1e-6)
            a_t = a_norm * np.array([0.6, 0.8])
            for i in (0, 50_000, 100_000, 150_000):
                np.testing.assert_allclose(_clip(t[i] * a_t, c, opacus_eps), psi[i] * a_t, rtol=1e-12, atol=1e-15)


def _step(x, a_t, y, family, c, eta, w, eps=0.0):
    """One SGD step of a clipped scalar GLM with the l2 term outside the clip."""
    return x - eta * (_clip(_phi_prime(family, a_t @ x, y) * a_t, c, eps) + w * x)


def test_one_d_clipped_logistic_step_is_non_expansive():
    """Section 4, ground truth in 1-D: x -> x - eta (clip(phi'(a x) a) + w x) is c-Lipschitz on a dense grid,
    c = max(|1 - eta w|, |1 - eta (M + w)|); tight when the unclipped region holds phi'' = 1/4; expands past 2/M."""
    a, c = 3.0, 0.5  # M = a^2/4 = 2.25; clipping active wherever |phi'| > 1/6
    m = a * a / 4.0
    x = np.linspace(-20.0, 20.0, 400_001)

    def max_slope(eta, w, y):
        t = _sigmoid(a * x) - y
        with np.errstate(divide="ignore"):
            step = x - eta * (t * a * np.minimum(1.0, c / (np.abs(t) * a)) + w * x)
        return float(np.max(np.abs(np.diff(step) / np.diff(x))))

    for w in (0.0, 0.05):
        for eta in (0.1, 0.5, 1.0 / (m + w), 2.0 / (m + 2 * w), 2.0 / (m + w)):
            bound = max(abs(1.0 - eta * w), abs(1.0 - eta * (m + w)))
            for y in (0.0, 1.0, 0.5):
                assert max_slope(eta, w, y) <= bound * (1.0 + 1e-6)
            # y = 1/2: phi'(0) = 0, so the curvature peak 1/4 lies in the unclipped region: the bound is attained
            assert max_slope(eta, w, 0.5) >= bound * (1.0 - 1e-3)
    assert max_slope(2.5 / m, 0.0, 0.5) > 1.2  # a step past 2/M expands: the condition is needed


FAMILY_POINTS = st.sampled_from(SCALAR)


@FAST
@given(
    family=FAMILY_POINTS,
    seed=st.integers(0, 2**31 - 1),
    clip=st.sampled_from([1e-3, 0.1, 1.0, 10.0]),
    w=st.sampled_from([0.0, 0.01, 0.5]),
    eta_fraction=st.floats(0.05, 3.0),
    eps=st.sampled_from([0.0, 1e-6]),
)
def test_glm_step_contracts_by_c(family, seed, clip, w, eta_fraction, eps):
    """Section 4: |G(x) - G(x')| <= c |x - x'| for one example and for a batch mean, clipping active or not."""
    rng = np.random.default_rng(seed)
    a_norm = 2.0
    cert = glm.certify_linear_model(
        family, feature_norm_bound=a_norm, clip_norm=clip, bias=True, l2=w, **_family_kwargs(family)
    )
    eta = eta_fraction / cert.smoothness
    contraction = cert.contraction(eta)
    feats = rng.normal(size=(4, 3))
    feats = a_norm * rng.uniform(0.0, 1.0, size=(4, 1)) * feats / np.linalg.norm(feats, axis=1, keepdims=True)
    feats_t = np.hstack([feats, np.ones((4, 1))])
    labels = [_label(family, v) for v in rng.uniform(size=4)]
    for _ in range(20):
        x, x2 = rng.normal(scale=rng.choice([0.1, 3.0, 30.0]), size=(2, 4))
        for i in range(4):  # one example
            diff = _step(x, feats_t[i], labels[i], family, clip, eta, w, eps) - _step(
                x2, feats_t[i], labels[i], family, clip, eta, w, eps
            )
            assert np.linalg.norm(diff) <= contraction * np.linalg.norm(x - x2) * (1 + 1e-9) + 1e-12

        def batch(v):  # b = 4 examples, mean of clipped gradients, l2 term once
            grads = [_clip(_phi_prime(family, f @ v, y) * f, clip, eps) for f, y in zip(feats_t, labels, strict=True)]
            return v - eta * (np.mean(grads, axis=0) + w * v)

        diff = batch(x) - batch(x2)
        assert np.linalg.norm(diff) <= contraction * np.linalg.norm(x - x2) * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(("eta", "expected"), [(0.1, 1.0114), (0.5, 1.0622), (1.0, 1.1413), (1.5, 1.2460)])
def test_clipped_quadratic_counterexample_expands(eta, expected):
    """Section 5: a clipped convex quadratic (vector-valued, not a scalar GLM) expands: local Lipschitz > 1.

    The clipped field C H theta / |H theta| has Jacobian C (I - n n^T) H / |H theta|, n = H theta / |H theta|,
    largest just outside the clip boundary |H theta| = C; the step's Jacobian is checked there, on a fine grid
    of directions, and confirmed by finite differences at the worst point."""
    h = np.diag([1.0, 0.01])
    c, lam = 0.1, 0.01
    angles = np.linspace(0.0, np.pi, 200_001)
    dirs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    thetas = dirs * (c * (1.0 + 1e-4) / np.linalg.norm(dirs @ h, axis=1))[:, None]
    g = thetas @ h
    norm_g = np.linalg.norm(g, axis=1)
    n = g / norm_g[:, None]
    proj = np.eye(2)[None] - n[:, :, None] * n[:, None, :]
    jac = (1.0 - eta * lam) * np.eye(2)[None] - eta * c * (proj @ h) / norm_g[:, None, None]
    lips = np.linalg.norm(jac, ord=2, axis=(1, 2))
    worst = int(np.argmax(lips))

    def step(theta):
        return theta - eta * (_clip(h @ theta, c) + lam * theta)

    theta = thetas[worst]
    numeric = np.column_stack([(step(theta + e) - step(theta - e)) / 2e-9 for e in 1e-9 * np.eye(2)])
    np.testing.assert_allclose(numeric, jac[worst], atol=1e-5)
    assert lips[worst] > 1.0
    assert lips[worst] == pytest.approx(expected, abs=2e-3)
    assert eta <= 2.0 / (1.0 + lam)  # the unclipped step would be non-expansive


# ---------------------------------------------------------------- the certificate


def test_certificate_values_and_kwargs_logistic_with_weight_decay():
    """Sections 4/6/7: l2 outside the clip adds w to M and lam; clipping active keeps the scalar route valid."""
    cert = glm.certify_linear_model(
        "binary_logistic", feature_norm_bound=1.0, clip_norm=1.0, bias=False, l2=0.01, projection_radius=5.0
    )
    assert cert.max_gradient_norm == 1.0
    assert cert.clip_norm_never_active == pytest.approx(1.0 * 1.001 + 1e-6, rel=1e-12)
    assert cert.clipping_can_be_active and cert.scalar_glm and cert.clipped_loss_convex_smooth
    kwargs = cert.loss_assumption_kwargs()
    assert kwargs == {
        "smoothness": pytest.approx(0.26),
        "strong_convexity": 0.01,
        "weak_convexity": 0.0,
        "diameter": 10.0,
        "gradient_norms_within_clip": False,
        "clipped_loss_convex_smooth": True,
        "l2_outside_clip": True,  # torch weight_decay under Opacus: lam does not grow with a Poisson batch
    }
    assumptions = LossAssumptions(**kwargs)
    # the scalar-GLM route opens the bounds that need a gradient step, with clipping possibly active
    params = dict(dataset_size=1000, batch_size=10, noise_multiplier=2.0, learning_rate=1.0, epochs=5)
    table = lp.applicable_bounds(sampling="shuffle_once", **params, **kwargs)
    assert table["ye-shokri-shuffle"].applies and table["shifted-interpolation-shuffle"].applies
    assert assumptions.update_is_gradient_step
    softmax_like = {**kwargs, "clipped_loss_convex_smooth": False}
    assert not lp.applicable_bounds(sampling="shuffle_once", **params, **softmax_like)["ye-shokri-shuffle"].applies
    within = glm.certify_linear_model("binary_logistic", feature_norm_bound=1.0, clip_norm=1.002, bias=False, l2=0.01)
    assert within.loss_assumption_kwargs()["gradient_norms_within_clip"] is True


def test_gradient_norms_within_clip_switches_exactly_at_the_threshold():
    """Section 6: True iff clip_norm >= clip_norm_never_active."""
    base = dict(feature_norm_bound=1.5, bias=True, num_classes=4)
    threshold = glm.certify_linear_model("softmax_cross_entropy", clip_norm=1.0, **base).clip_norm_never_active
    assert threshold == pytest.approx(math.sqrt(2.0) * math.sqrt(1.5**2 + 1.0) * 1.001 + 1e-6, rel=1e-12)
    at = glm.certify_linear_model("softmax_cross_entropy", clip_norm=threshold, **base)
    assert at.loss_assumption_kwargs()["gradient_norms_within_clip"] is True
    below = glm.certify_linear_model("softmax_cross_entropy", clip_norm=math.nextafter(threshold, 0.0), **base)
    assert below.clipping_can_be_active and not below.certified


def test_softmax_with_active_clipping_is_refused_with_the_fix():
    """Section 7: vector outputs with clipping possibly active cannot be certified; the message names the threshold."""
    cert = glm.certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=1.0, clip_norm=1.0, bias=False, num_classes=10, l2=1e-3
    )
    assert cert.max_gradient_norm == pytest.approx(math.sqrt(2.0))
    assert cert.data_smoothness == pytest.approx(0.5)
    assert not cert.scalar_glm and not cert.clipped_loss_convex_smooth
    with pytest.raises(ValueError, match=r"clip_norm must be >= 1\.41\d+.*Found clip_norm=1"):
        cert.loss_assumption_kwargs()
    ok = glm.certify_linear_model(
        "softmax_cross_entropy", feature_norm_bound=1.0, clip_norm=1.5, bias=False, num_classes=10, l2=1e-3
    )
    assert ok.loss_assumption_kwargs() == {
        "smoothness": pytest.approx(0.501),
        "strong_convexity": 1e-3,
        "weak_convexity": 0.0,
        "diameter": None,
        "gradient_norms_within_clip": True,
        "clipped_loss_convex_smooth": True,
        "l2_outside_clip": True,
    }


def test_l2_inside_the_clip_needs_a_projection():
    """Section 4: the l2 term inside the clip makes the clipped vector phi' a~ + w x, bounded by G + w B on a ball."""
    args = dict(feature_norm_bound=1.0, bias=False, l2=0.1, l2_placement="inside_clip")
    assert not glm.certify_linear_model("binary_logistic", clip_norm=100.0, **args).l2_outside_clip
    free = glm.certify_linear_model("binary_logistic", clip_norm=100.0, **args)
    assert free.max_gradient_norm is None and free.scalar_glm and not free.clipped_loss_convex_smooth
    with pytest.raises(ValueError, match="projection"):
        free.loss_assumption_kwargs()
    ball = glm.certify_linear_model("binary_logistic", clip_norm=2.01, projection_radius=10.0, **args)
    assert ball.max_gradient_norm == pytest.approx(2.0)
    assert ball.loss_assumption_kwargs()["gradient_norms_within_clip"] is True
    assert ball.smoothness == pytest.approx(0.35) and ball.strong_convexity == pytest.approx(0.1)
    small = glm.certify_linear_model("binary_logistic", clip_norm=1.5, projection_radius=10.0, **args)
    with pytest.raises(ValueError, match="inside the clip"):
        small.loss_assumption_kwargs()
    # the bound is attained: x = -10 a/|a| (on the ball), y = 1 gives |phi'(u) a + w x| close to 1 + 0.1 * 10
    a = np.array([1.0, 0.0])
    x = -10.0 * a
    assert np.linalg.norm(_phi_prime("binary_logistic", a @ x, 1.0) * a + 0.1 * x) > 2.0 - 1e-4


def test_l2_that_skips_a_parameter_gives_no_strong_convexity():
    """Section 4: weight decay not on every trained parameter (e.g. the bias) leaves lam = 0, M still + w."""
    cert = glm.certify_linear_model(
        "huber", feature_norm_bound=1.0, clip_norm=0.1, bias=True, l2=0.2, l2_covers_all_parameters=False,
        huber_delta=0.5,
    )  # fmt: skip
    assert cert.strong_convexity == 0.0
    assert cert.smoothness == pytest.approx(2.0 + 0.2)
    assert cert.max_gradient_norm == pytest.approx(0.5 * math.sqrt(2.0))


def test_squared_without_bounds_uses_the_scalar_route():
    """Section 7: unbounded squared-loss gradients: clipping can be active, the clipped loss stays convex, 2A~^2-smooth."""
    cert = glm.certify_linear_model("squared", feature_norm_bound=2.0, clip_norm=1.0, bias=False, l2=0.1)
    kwargs = cert.loss_assumption_kwargs()
    assert kwargs["gradient_norms_within_clip"] is False
    assert kwargs["smoothness"] == pytest.approx(8.1) and kwargs["strong_convexity"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("loss", "kwargs", "message"),
    [
        ("binary_logistic", {"feature_norm_bound": -1.0}, "feature_norm_bound must be a finite number > 0"),
        ("binary_logistic", {"clip_norm": 0.0}, "clip_norm must be a finite number > 0"),
        ("binary_logistic", {"l2": float("nan")}, "l2 must be a finite number >= 0"),
        ("huber", {}, "huber_delta must be given"),
        ("smoothed_hinge", {}, "hinge_smoothing must be given"),
        ("softmax_cross_entropy", {}, "num_classes must be an integer >= 2"),
        ("softmax_cross_entropy", {"num_classes": 1}, "num_classes must be an integer >= 2"),
        ("binary_logistic", {"num_classes": 2}, "num_classes is only for softmax_cross_entropy"),
        ("binary_logistic", {"huber_delta": 1.0}, "huber_delta is only for the huber loss"),
        ("binary_logistic", {"l2_placement": "before"}, "l2_placement must be one of"),
        ("binary_logistic", {"projection_center_norm": 1.0}, "projection_center_norm needs projection_radius"),
        ("binary_logistic", {"bias": 1}, "bias must be True or False"),
        ("logistic", {}, "loss must be one of"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 25 else None,
)
def test_invalid_arguments_are_refused(loss, kwargs, message):
    args = {"feature_norm_bound": 1.0, "clip_norm": 1.0, "bias": False, **kwargs}
    with pytest.raises(ValueError, match=message):
        glm.certify_linear_model(loss, **args)


def test_certificate_is_frozen():
    cert = glm.certify_linear_model("binary_logistic", feature_norm_bound=1.0, clip_norm=1.0, bias=False)
    with pytest.raises(AttributeError):
        cert.smoothness = 0.0  # type: ignore[misc]


# ---------------------------------------------------------------- feature clipping


def _exact_norm_at_most(row: np.ndarray, bound: float) -> bool:
    return sum(Fraction(float(v)) ** 2 for v in row) <= Fraction(bound) ** 2


def _adversarial_rows(rng, d: int, bound: float, dtype) -> np.ndarray:
    rows = [
        rng.normal(size=d),
        np.full(d, 1.0),  # all equal: the largest rounding of the sum
        np.concatenate([[1.0], np.full(d - 1, 1e-25)]) if d > 1 else np.array([1.0]),  # tiny squares underflow
        rng.normal(size=d) * rng.choice([1e-3, 1e3], size=d),
        np.zeros(d),
    ]
    out = []
    for r in rows:
        n = np.linalg.norm(r)
        for target in (bound * (1 + 1e-7), bound * (1 - 1e-7), bound, 10 * bound, 0.5 * bound):
            out.append(r * (target / n) if n > 0 else r)
    return np.array(out).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 2, 7, 128, 700])
def test_feature_clip_output_norms_are_exactly_within_the_bound(dtype, d):
    """Section 8: every clipped row has exact (rational) norm <= A, adversarial rows included."""
    rng = np.random.default_rng(d)
    for bound in (1.0, 0.37, 123.456):
        rows = np.vstack([_adversarial_rows(rng, d, bound, dtype), (rng.normal(size=(20, d)) * 3).astype(dtype)])
        clipped = feature_clip.clip_features(rows, bound)
        assert clipped.dtype == np.dtype(dtype) and clipped.shape == rows.shape
        for row in clipped:
            assert _exact_norm_at_most(row, bound)
        assert feature_clip.feature_norms_within(clipped, bound).all()
        small = np.linalg.norm(rows.astype(np.float64), axis=1) <= 0.5 * bound * (1 + 1e-6)
        np.testing.assert_array_equal(clipped[small], rows[small])  # rows well inside are unchanged


def test_naive_float32_clipping_violates_the_bound():
    """Section 8: clipping to A itself (no margin) in float32 leaves norms above A: the margin is needed."""
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(300, 300)).astype(np.float32)
    norms = np.sqrt(np.sum(np.square(rows), axis=1, dtype=np.float32), dtype=np.float32)
    naive = rows * np.minimum(np.float32(1.0), np.float32(1.0) / norms)[:, None]
    assert not all(_exact_norm_at_most(r, 1.0) for r in naive)


@FAST
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(1, 64), log_bound=st.floats(-10.0, 10.0))
def test_feature_check_never_accepts_a_violation(seed, d, log_bound):
    """Section 8: feature_norms_within is True only when the exact norm is <= A; it accepts rows clearly inside."""
    rng = np.random.default_rng(seed)
    bound = float(np.exp(log_bound))
    rows = (rng.normal(size=(12, d)) * rng.choice([1e-3, 1.0, 1e3])).astype(np.float32)
    for i, row in enumerate(rows):  # put half the rows right at the bound, from either side
        if i % 2:
            rows[i] = (row.astype(np.float64) * bound / np.linalg.norm(row.astype(np.float64))).astype(np.float32)
    ok = feature_clip.feature_norms_within(rows, bound)
    for row, accepted in zip(rows, ok, strict=True):
        if accepted:
            assert _exact_norm_at_most(row, bound)
        if np.linalg.norm(row.astype(np.float64)) <= bound * (1 - 1e-12):
            assert accepted


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_feature_check_rejects_rows_just_above_a_bound_equal_to_their_float_norm(dtype):
    """Section 8: with A = the float64-computed norm, rows whose exact norm exceeds A exist and are rejected."""
    rng = np.random.default_rng(1)
    rows = rng.normal(size=(200, 50)).astype(dtype)
    above = 0
    for row in rows:
        computed = float(np.sqrt(np.sum(row.astype(np.float64) ** 2)))
        if not _exact_norm_at_most(row, computed):
            above += 1
            assert not feature_clip.feature_norms_within(row[None], computed)[0]
    assert above > 0  # the float64 norm does round below the exact one: the margin is needed


def test_check_feature_norms_names_the_violation():
    rows = np.array([[0.5, 0.5], [0.6, 0.80001]], dtype=np.float32)
    feature_clip.check_feature_norms(rows[:1], 1.0)
    with pytest.raises(ValueError, match=r"feature_norm_bound = 1.*at index \(1,\)"):
        feature_clip.check_feature_norms(rows, 1.0)
    assert not feature_clip.feature_norms_within(np.array([[np.nan, 0.0]]), 1.0).any()


def test_safe_clip_radius_values_and_validation():
    """Section 8: A' = A / K rounded down into the dtype; float32, d = 1000: about A (1 - 6.0e-5)."""
    r = feature_clip.safe_clip_radius(1.0, 1000)
    assert np.float32(r) == r and 1.0 - 6.1e-5 < r < 1.0 - 5.9e-5
    assert 0.0 < 1.0 - feature_clip.safe_clip_radius(1.0, 1000, np.float64) < 1e-12
    with pytest.raises(ValueError, match="dtype must be float32 or float64"):
        feature_clip.safe_clip_radius(1.0, 3, np.float16)
    with pytest.raises(ValueError, match="feature_norm_bound must be"):
        feature_clip.safe_clip_radius(0.0, 3)
    with pytest.raises(ValueError, match="dim must be"):
        feature_clip.safe_clip_radius(1.0, 2**23)
    with pytest.raises(ValueError, match="features must be finite"):
        feature_clip.clip_features(np.array([[np.inf, 0.0]], dtype=np.float32), 1.0)
    huge = np.array([[3e30, 3e30]], dtype=np.float32)  # the float32 sum of squares overflows: the row becomes 0
    assert not feature_clip.clip_features(huge, 1.0).any()


def test_certificate_kwargs_plug_into_the_accountant():
    """Section 7: the kwargs are accepted as declared assumptions; the contraction bounds need the never-active route."""
    import lastiter_plugins as lp

    pipeline = dict(dataset_size=1000, batch_size=100, epochs=5, learning_rate=0.5, sampling="shuffle_once")
    args = dict(feature_norm_bound=1.0, bias=True, l2=0.05, projection_radius=5.0)
    never = glm.certify_linear_model("binary_logistic", clip_norm=2.0, **args).loss_assumption_kwargs()
    active = glm.certify_linear_model("binary_logistic", clip_norm=0.5, **args).loss_assumption_kwargs()
    assert never["gradient_norms_within_clip"] and not active["gradient_norms_within_clip"]
    with_never = lp.applicable_bounds(clip_norm=2.0, **pipeline, **never)
    with_active = lp.applicable_bounds(clip_norm=0.5, **pipeline, **active)
    assert with_never["ye-shokri-shuffle"].applies
    assert with_active["ye-shokri-shuffle"].applies  # the registry accepts the scalar-GLM route
    assert with_active["kong-ribero-cyclic"].applies
    # without the route (a vector output, say) clipping possibly active closes the contraction bounds
    vector = {**active, "clipped_loss_convex_smooth": False}
    assert not lp.applicable_bounds(clip_norm=0.5, **pipeline, **vector)["ye-shokri-shuffle"].applies
