r"""Exact Renyi divergences (and privacy profiles) of the last iterate on instances
with computable laws: the ground truths G1, G2, G3 of docs/verification.md, and the
instances of the lower end (docs/derivations/lower-end.md#lower-end).

Every bound of the library claims ``rdp(alpha) >= D_alpha(X_T || X'_T)`` for
ALL instances meeting its assumptions. The three families below have laws we can
compute; each function returns a *certified interval* ``[lower, upper]`` for the
divergence (the maximum over both directions, since the neighbouring relations
are symmetric), so that a soundness test can assert ``bound >= lower`` and a
tightness report can quote ``bound / estimate`` with a known error.

G1, linear losses (no projection, M = 0, clipping never active):
  ``f_i(x) = <g_i, x>`` with ``g_i = 0`` for every example but the differing one,
  whose gradient is ``C u`` in one dataset and ``-C u`` in the other
  (replace-one), or absent in the other (add-or-remove). ``X_T`` given the number
  N of uses of the differing example is ``N(+-a N, V)`` (1-D, along u), with
  ``a = eta C / b`` and ``V = T (eta z C / b)^2``; fixed batches give one N
  (closed form ``2 alpha N^2 / (z^2 T)``), random schemes a mixture over N.

G2, strongly convex quadratics ``f_i(x) = lam/2 |x|^2 + <g_i, x>`` (M = lam, same
  g's; the proofs only use the contraction of the gradient step and the
  sensitivity ``|grad f - grad f'| <= 2C``, so the instance is declared with
  ``gradient_norms_within_clip=True``): per step ``x <- rho_t x - eta mean(g_B) + noise`` with
  ``rho_t = 1 - eta lam |B_t| / b``. Mean shift ``(2 eta C / b) sum_{uses t}
  prod_{s>t} rho_s``, variance ``sigma_p^2 sum_t prod_{s>t} rho_s^2``.

G3, the projected 1-D random walk (Altschuler & Talwar, arXiv 2205.13710, section 4):
  ``K = [-D/2, D/2]``, all losses 0 except the differing example, which is
  ``f(x) = C x`` in one dataset and ``-C x`` (replace-one) or absent
  (add-or-remove) in the other. The laws are propagated on a grid (Gaussian
  convolution, projection with atoms at the ends), mixing over the inclusion
  of the differing example, with a rigorous bound on the grid error.

How the intervals are certified (docs/verification.md has the derivations):

* quantisation: for any partition of the line into cells, the Renyi divergence
  of the cell masses is <= the true divergence (data processing). That is the
  lower end. For the upper end: the log likelihood ratio ``log(p/q)`` of two
  Gaussian convolutions ``p = phi_s * mu``, ``q = phi_s * nu`` with ``mu, nu``
  supported in an interval of length L is ``L / s^2``-Lipschitz, so on a cell of
  width h, ``p/q <= e^(L h / s^2) P(cell)/Q(cell)`` and
  ``D_true <= D_cells + L h / s^2`` (plus the bounded tails).
* G1/G2 cell masses are differences of the normal CDF (exact up to rounding);
  the tails beyond the grid are bounded in closed form.
* G3 cell masses come from T - 1 trapezoid quadratures of the Gaussian kernel
  against the previous law. For ``g = e^psi`` with ``|psi'| <= A`` and
  ``|psi''| <= B`` on a cell of width h the trapezoid rule errs by at most
  ``(h^2/12)(B + A^2) e^(A h)`` times the integral over the cell; A and B are
  bounded from D, s and the drifts. Positive kernels preserve relative errors,
  so after T - 1 steps every mass carries a relative error ``eps <=
  (1 + eps_q)^(T-1) (1 + eps_fp)^(T+1) - 1``, and the divergence an error
  ``(2 alpha - 1) log(1/(1-eps)) / (alpha - 1)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy import special, stats

from lastiter_plugins.bounds._common import batch_sizes
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig

_UNIT_ROUNDOFF = float(np.finfo(float).eps) / 2.0
_LARGEST_EPSILON = 1e300  # the profile's epsilon search stops doubling here
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclasses.dataclass(frozen=True)
class ExactDivergence:
    r"""Certified interval for :math:`\max(D_\alpha(P\|Q), D_\alpha(Q\|P))` at each order.

    Attributes:
      orders: the Renyi orders.
      lower: rigorous lower bounds (what soundness tests compare bounds against).
      upper: rigorous upper bounds (``inf`` where not certified).
      detail: how it was computed (grid sizes, error terms).
      hockey_stick: when asked for, the certified privacy profile of the same pair
        of laws (:class:`HockeyStick`).
    """

    orders: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    detail: str = ""
    hockey_stick: HockeyStick | None = None

    @property
    def estimate(self) -> np.ndarray:
        """Midpoint of the interval (the lower end where the upper one is not certified)."""
        return np.where(np.isfinite(self.upper), 0.5 * (self.lower + self.upper), self.lower)

    @property
    def width(self) -> np.ndarray:
        """upper - lower: how far the truth may be from either end."""
        return self.upper - self.lower


def _log_cell_mass(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    r"""log(Phi(hi) - Phi(lo)) for lo <= hi (standardised), stable in both tails."""
    flip = lo > 0
    a = np.where(flip, -hi, lo)
    b = np.where(flip, -lo, hi)
    la, lb = special.log_ndtr(a), special.log_ndtr(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = lb + np.log(-np.expm1(la - lb))
    return np.where(np.isnan(out), -np.inf, out)


def _logsumexp(x: np.ndarray, axis: int | None = None) -> np.ndarray:
    return special.logsumexp(x, axis=axis)


def _max_over_directions(lower_pq, upper_pq, lower_qp, upper_qp):
    return np.maximum(lower_pq, lower_qp), np.maximum(upper_pq, upper_qp)


# ------------------------------------------------------------------ Gaussian mixtures (G1, G2)


def _mixture_log_cells(
    weights: np.ndarray, means: np.ndarray, edges: np.ndarray, std: float | np.ndarray
) -> np.ndarray:
    """log masses of the mixture on (-inf, e0], (e0, e1], ..., (e_last, inf); ``std`` one for every component
    or one per component."""
    bounds = np.concatenate(([-np.inf], edges, [np.inf]))
    out = np.full(bounds.size - 1, -np.inf)
    log_w = np.log(weights)
    stds = np.broadcast_to(np.asarray(std, dtype=float), means.shape)
    chunk = max(1, 2_000_000 // bounds.size)
    for start in range(0, means.size, chunk):
        mu = means[start : start + chunk, None]
        u = (bounds[None, :] - mu) / stds[start : start + chunk, None]
        logm = _log_cell_mass(u[:, :-1], u[:, 1:]) + log_w[start : start + chunk, None]
        out = np.logaddexp(out, _logsumexp(logm, axis=0))
    return out


def _mixture_log_density(weights: np.ndarray, means: np.ndarray, x: np.ndarray, std: float) -> np.ndarray:
    out = np.full(x.size, -np.inf)
    log_w = np.log(weights)
    chunk = max(1, 2_000_000 // x.size)
    for start in range(0, means.size, chunk):
        z = (x[None, :] - means[start : start + chunk, None]) / std
        terms = log_w[start : start + chunk, None] - 0.5 * z**2 - _LOG_SQRT_2PI - math.log(std)
        out = np.logaddexp(out, _logsumexp(terms, axis=0))
    return out


def _log_tail(orders, log_w, means, anchor, x, std, right: bool) -> np.ndarray:
    r"""log of a bound on the integral of p^a q^(1-a) beyond ``x`` (right) or below it (left).

    With q(t) >= phi(t - anchor) there (anchor = the smallest q-mean on the right,
    the largest on the left, and x beyond every q-mean) and Jensen's inequality
    :math:`(\sum_j w_j \phi_j)^a \le \sum_j w_j \phi_j^a` for a > 1:
    :math:`p^a q^{1-a} \le \sum_j w_j \phi_V(t - c_j) e^{E_j}`,
    :math:`c_j = a\mu_j - (a-1)\,anchor`, :math:`E_j = a(a-1)(\mu_j - anchor)^2/(2V)`.
    """
    a = orders[:, None]
    c = a * means[None, :] - (a - 1.0) * anchor
    e = a * (a - 1.0) * (means[None, :] - anchor) ** 2 / (2.0 * std**2)
    u = (c - x) / std if right else (x - c) / std
    return _logsumexp(log_w[None, :] + e + special.log_ndtr(u), axis=1)


def _window_edge(orders, mixtures, start, std, right: bool, target=-45.0) -> float:
    """The first x (searching outwards from ``start``) where every tail bound is <= e^target."""

    def worst(x):
        return max(float(_log_tail(orders, lw, m, anchor, x, std, right).max()) for lw, m, anchor in mixtures)

    sign = 1.0 if right else -1.0
    step = std
    while worst(start + sign * step) > target:
        step *= 2.0
    lo, hi = 0.0, step
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if worst(start + sign * mid) > target:
            lo = mid
        else:
            hi = mid
    return start + sign * hi


def gaussian_mixture_renyi(
    orders: np.ndarray,
    p_weights: np.ndarray,
    p_means: np.ndarray,
    q_weights: np.ndarray,
    q_means: np.ndarray,
    variance: float,
    *,
    missing_mass: float = 0.0,
    cells: int = 20_000,
    max_work: float = 1e7,
    both_directions: bool = True,
    per_order: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Certified ``(lower, upper)`` for :math:`D_\alpha(P\|Q)` (and, with
    ``both_directions``, the maximum with :math:`D_\alpha(Q\|P)`) for
    :math:`P = \sum_j w_j \mathcal N(\mu_j, V)`, :math:`Q = \sum_k v_k \mathcal N(\nu_k, V)` in 1-D.

    Two single Gaussians: the closed form :math:`\alpha(\mu-\nu)^2/(2V)`.
    Otherwise the line is cut into ``cells`` equal cells on a window beyond
    which the tails carry at most ``e^-45`` of the integral (weight-aware
    closed-form bound, see :func:`_log_tail`), plus the two tail cells. The
    lower end is the divergence of the exact cell masses (data processing);
    the upper end multiplies each inner cell's term by :math:`e^{(\alpha-1) v_c}`,
    where :math:`v_c = |f(e_1) - f(e_0)| + K h^2/4` bounds the variation of
    :math:`f = \log(p/q)` over the cell (exact values at its edges, and
    :math:`|f''| \le K = (\max\mu - \min\mu)^2/(4V^2)`), since on the cell
    :math:`p/q \le e^{v_c} P_c/Q_c`; and it adds the tail bounds.
    Both ends carry a rounding allowance.

    ``missing_mass``: total weight dropped from both mixtures (truncated
    binomials); the lower end stays rigorous (Q's cells are inflated by it),
    the upper end is then not certified (inf).

    ``per_order``: one window (and grid) per order, fitted to that order's
    tails: tighter intervals at small orders, ``len(orders)`` times the work.
    """
    orders = np.asarray(orders, dtype=float)
    pw, pm = np.asarray(p_weights, float), np.asarray(p_means, float)
    qw, qm = np.asarray(q_weights, float), np.asarray(q_means, float)
    if per_order and orders.size > 1:
        pairs = [
            gaussian_mixture_renyi(
                orders[i : i + 1],
                pw,
                pm,
                qw,
                qm,
                variance,
                missing_mass=missing_mass,
                cells=cells,
                max_work=max_work,
                both_directions=both_directions,
            )
            for i in range(orders.size)
        ]
        return np.concatenate([lo for lo, _ in pairs]), np.concatenate([up for _, up in pairs])
    if pm.size == 1 and qm.size == 1 and missing_mass == 0.0:
        value = orders * (pm[0] - qm[0]) ** 2 / (2.0 * variance)
        slack = 1e-12 * value
        return value - slack, value + slack
    std = math.sqrt(variance)
    with np.errstate(divide="ignore"):
        lpw, lqw = np.log(pw), np.log(qw)
    all_means = np.concatenate((pm, qm))
    lo_mean, hi_mean = float(all_means.min()), float(all_means.max())
    # (log weights, means, anchor) of the numerator mixture, per direction and side
    right = [(lpw, pm, float(qm.min()))]
    left = [(lpw, pm, float(qm.max()))]
    if both_directions:
        right.append((lqw, qm, float(pm.min())))
        left.append((lqw, qm, float(pm.max())))
    x_right = _window_edge(orders, right, hi_mean, std, right=True)
    x_left = _window_edge(orders, left, lo_mean, std, right=False)
    n_cells = int(max(200, min(cells, max_work / max(pm.size, qm.size))))
    edges = np.linspace(x_left, x_right, n_cells + 1)
    h = (x_right - x_left) / n_cells
    log_p = _mixture_log_cells(pw, pm, edges, std)
    log_q = _mixture_log_cells(qw, qm, edges, std)
    # variation of f = log(p/q) over each inner cell: |f(e1) - f(e0)| + K h^2 / 4, with
    # |f''| = |Var_p(mu|x) - Var_q(mu|x)| / V^2 <= K = (max mu - min mu)^2 / (4 V^2)
    f_edges = _mixture_log_density(pw, pm, edges, std) - _mixture_log_density(qw, qm, edges, std)
    curvature = (hi_mean - lo_mean) ** 2 / (4.0 * variance**2)
    variation = np.abs(np.diff(f_edges)) + curvature * h**2 / 4.0
    lower = np.zeros_like(orders)
    upper = np.zeros_like(orders)
    for k in range(len(right)):
        lp, lq = (log_q, log_p) if k == 1 else (log_p, log_q)
        lq_low = np.logaddexp(lq, math.log(missing_mass)) if missing_mass > 0 else lq
        tail_r = _log_tail(orders, *right[k], x_right, std, right=True)
        tail_l = _log_tail(orders, *left[k], x_left, std, right=False)
        for i, a in enumerate(orders):
            log_i = _logsumexp(a * lp + (1.0 - a) * lq_low)
            rounding = (2.0 * a - 1.0) * 64 * _UNIT_ROUNDOFF * n_cells / (a - 1.0)
            lower[i] = max(lower[i], log_i / (a - 1.0) - rounding)
            if missing_mass > 0:
                upper[i] = np.inf
                continue
            log_inner = _logsumexp(a * lp[1:-1] + (1.0 - a) * lq[1:-1] + (a - 1.0) * variation)
            log_up = _logsumexp(np.array([log_inner, tail_r[i], tail_l[i]]))
            upper[i] = max(upper[i], log_up / (a - 1.0) + rounding)
    return lower, upper


@dataclasses.dataclass(frozen=True)
class GaussianLaws:
    r"""The two last-iterate laws of a G1/G2 instance along the direction u:
    :math:`P = \sum_j w_j \mathcal N(\mu_j, V)`, :math:`Q = \sum_k v_k \mathcal N(\nu_k, V)`.

    ``missing_mass``: total weight of the components dropped from both (truncated
    binomials); divergences and profiles computed from these laws then have a
    rigorous lower end only.
    """

    p_weights: np.ndarray
    p_means: np.ndarray
    q_weights: np.ndarray
    q_means: np.ndarray
    variance: float
    missing_mass: float = 0.0
    detail: str = ""

    def divergence(self, orders, **kw) -> ExactDivergence:
        lower, upper = gaussian_mixture_renyi(
            orders,
            self.p_weights,
            self.p_means,
            self.q_weights,
            self.q_means,
            self.variance,
            missing_mass=self.missing_mass,
            **kw,
        )
        return ExactDivergence(np.asarray(orders, float), lower, upper, self.detail)

    def hockey_stick(self, **kw) -> HockeyStick:
        return gaussian_mixture_hockey_stick(
            self.p_weights,
            self.p_means,
            self.q_weights,
            self.q_means,
            self.variance,
            missing_mass=self.missing_mass,
            **kw,
        )


def _binomial_weights(steps: int, q: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Binomial(T, q) support and weights, dropping terms below e^-700 of the mode (their total is returned)."""
    support = np.arange(steps + 1)
    log_pmf = stats.binom.logpmf(support, steps, q)
    keep = log_pmf >= log_pmf.max() - 700.0
    dropped = float(np.exp(_logsumexp(log_pmf[~keep]))) if (~keep).any() else 0.0
    weights = np.exp(log_pmf[keep])
    return support[keep].astype(float), weights / weights.sum() * (1.0 - dropped), dropped


def _params(params: Mapping[str, Any]) -> tuple[TrainingConfig, LossAssumptions]:
    from lastiter_plugins.api import build  # the keyword parameters, validated as the API does

    return build(**dict(params))


def _batch_sizes(cfg: TrainingConfig) -> np.ndarray:
    """Sizes of the l batches of a pass (the last one may be short)."""
    per_epoch, last = batch_sizes(cfg.dataset_size, cfg.batch_size)
    sizes = np.full(per_epoch, cfg.batch_size, dtype=float)
    sizes[-1] = last
    return sizes


def g1_laws(params: Mapping[str, Any], *, position: int | None = None) -> GaussianLaws:
    r"""G1 (linear losses): the two laws of the last iterate (see :func:`g1_divergence`)."""
    cfg, _ = _params(params)
    lr = cfg.learning_rate if cfg.learning_rate is not None else 1.0
    a = lr * cfg.clip_norm / cfg.batch_size
    variance = cfg.steps * (lr * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size) ** 2
    per_epoch, e, r = cfg.steps_per_epoch, cfg.full_epochs, cfg.steps % cfg.steps_per_epoch
    missing = 0.0
    if cfg.sampling is Sampling.CYCLIC:
        j = 0 if position is None else int(position)
        if not 0 <= j < per_epoch:
            raise ValueError(f"position must be in [0, {per_epoch}). Found {position}.")
        counts, weights = np.array([e + (1 if j < r else 0)], float), np.array([1.0])
    elif cfg.sampling in (Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE, Sampling.RANDOM_ALLOCATION):
        # random allocation (one step per epoch, uniform): the partial epoch uses the record w.p. r / l
        p_more = r / per_epoch if cfg.sampling is Sampling.RANDOM_ALLOCATION else r * cfg.batch_size / cfg.dataset_size
        counts, weights = np.array([e, e + 1], float), np.array([1.0 - p_more, p_more])
        keep = weights > 0
        counts, weights = counts[keep], weights[keep]
    else:
        counts, weights, missing = _binomial_weights(cfg.steps, cfg.sampling_probability)
    detail = f"G1 {cfg.sampling.value} {cfg.relation.value}: N in [{counts.min():g}, {counts.max():g}]"
    if cfg.relation is Relation.REPLACE_ONE:
        return GaussianLaws(weights, a * counts, weights, -a * counts, variance, missing, detail)
    if cfg.sampling not in (Sampling.POISSON, Sampling.RANDOM_ALLOCATION):
        raise ValueError(
            "relation must be replace_one for G1 with sampling other than poisson and random_allocation (removing "
            f"an example changes the batches). Found {cfg.relation.value} with {cfg.sampling.value}."
        )
    return GaussianLaws(weights, a * counts, np.array([1.0]), np.array([0.0]), variance, missing, detail)


def g1_divergence(orders, params: Mapping[str, Any], *, position: int | None = None, **kw) -> ExactDivergence:
    r"""G1 (linear losses): exact divergence of the last iterate.

    Args:
      orders: Renyi orders.
      params: the public API's keyword parameters (``dataset_size``,
        ``batch_size``, ``noise_multiplier``, ``steps``/``epochs``, ``sampling``,
        ``relation``...). The losses are ``f_i = <g_i, x>`` as in the module
        docstring; ``learning_rate`` and ``clip_norm`` cancel out.
      position: for CYCLIC, the batch index of the differing example
        (default: the worst, 0).

    Fixed batches: ``2 alpha N^2 / (z^2 T)`` with N the number of uses (CYCLIC
    worst case N = E + 1 if T mod l > 0 else E). SHUFFLE_ONCE and RESHUFFLE: N is
    E + 1 with probability ``r b / n`` (r = T mod l), else E; RANDOM_ALLOCATION (one
    step per epoch): with probability ``r / l``. RANDOM_BATCH and
    POISSON: N ~ Binomial(T, b/n). Add-or-remove (POISSON, RANDOM_ALLOCATION): one law is the
    mixture with shift ``a N``, the other ``N(0, V)``.
    """
    return g1_laws(params, position=position).divergence(orders, **kw)


def _g2_learning_rate(cfg: TrainingConfig) -> float:
    """G2's step size eta (the instance is defined by its steps)."""
    if cfg.learning_rate is None:
        raise ValueError("learning_rate is required for G2 (the instance's step size). Found None.")
    return cfg.learning_rate


def _g2_contractions(cfg: TrainingConfig, lam: float) -> np.ndarray:
    """P_t = prod_{s>t} rho_s for t = 1..T (P_T = 1), rho_s = 1 - eta lam |B_s| / b."""
    if cfg.sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE):
        sizes = _batch_sizes(cfg)[np.arange(cfg.steps) % cfg.steps_per_epoch]
    else:
        sizes = np.full(cfg.steps, float(cfg.batch_size))
    rho = 1.0 - _g2_learning_rate(cfg) * lam * sizes / cfg.batch_size
    tail = np.cumprod(rho[::-1])[::-1]  # prod_{s>=t}
    return np.append(tail[1:], 1.0)


def g2_position_shifts(params: Mapping[str, Any]) -> tuple[np.ndarray, float]:
    r"""G2 with fixed batches: per batch index j, the mean displacement
    ``m_j = (eta C / b) sum_{uses t of batch j} prod_{s>t} rho_s`` (the two laws
    sit at ``+-m_j``), and the common variance."""
    cfg, assumptions = _params(params)
    prods = _g2_contractions(cfg, assumptions.strong_convexity)
    lr = _g2_learning_rate(cfg)
    a = lr * cfg.clip_norm / cfg.batch_size
    sigma_p = lr * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size
    shifts = a * np.bincount(np.arange(cfg.steps) % cfg.steps_per_epoch, weights=prods, minlength=cfg.steps_per_epoch)
    return shifts, sigma_p**2 * float(np.sum(prods**2))


def g2_poisson_laws(params: Mapping[str, Any], *, max_enumerated_steps: int = 12) -> GaussianLaws:
    r"""Poisson sampling, both relations (docs/derivations/random-batch.md#rb-ground-truth): linear losses with
    gradient ``+-C`` for the differing record and 0 for the others, plus an l2 term ``lam x`` outside
    the clip (``l2_outside_clip=True``; the step contracts by ``rho = 1 - eta lam`` whatever the batch
    size). Given the memberships u the last iterate is Gaussian with mean
    ``(eta C / b) sum_t u_t rho^(T-1-t)`` (replace-one: against its negative; add-or-remove: against
    the record's absence, mean 0), so the laws are mixtures over the ``2^T`` patterns."""
    cfg, assumptions = _params(params)
    if cfg.sampling is not Sampling.POISSON or not assumptions.l2_outside_clip:
        raise ValueError("g2_poisson_laws needs sampling=poisson and l2_outside_clip=True.")
    if cfg.steps > max_enumerated_steps:
        raise ValueError(f"steps must be <= {max_enumerated_steps} (2^T enumeration). Found {cfg.steps}.")
    rho = 1.0 - _g2_learning_rate(cfg) * assumptions.strong_convexity
    prods = rho ** np.arange(cfg.steps - 1, -1, -1, dtype=float)  # step t contracted to the end
    w, m, variance = _membership_patterns(cfg, prods)
    if cfg.relation is Relation.REPLACE_ONE:
        return GaussianLaws(w, m, w, -m, variance, detail=f"G2 poisson replace-one, {w.size} patterns")
    one = np.array([1.0])
    return GaussianLaws(w, m, one, np.zeros(1), variance, detail=f"G2 poisson add-or-remove, {w.size} patterns")


def _membership_patterns(cfg: TrainingConfig, prods: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Every inclusion pattern of the differing record over T steps (each step independently with
    probability q): its probability (patterns of probability 0 left out), the mean displacement
    ``(eta C / b) sum_t u_t prods_t``, and the common variance of the last iterate."""
    lr = _g2_learning_rate(cfg)
    a = lr * cfg.clip_norm / cfg.batch_size
    sigma_p = lr * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size
    variance = sigma_p**2 * float(np.sum(prods**2))
    patterns = (np.arange(2**cfg.steps)[:, None] >> np.arange(cfg.steps)[None, :]) & 1
    q = cfg.sampling_probability
    k = patterns.sum(axis=1)
    weights = np.exp(k * math.log(q) + (cfg.steps - k) * math.log1p(-q)) if q < 1 else (k == cfg.steps) * 1.0
    means = a * patterns @ prods
    keep = weights > 0
    return weights[keep], means[keep], variance


def g2_laws(params: Mapping[str, Any], *, position: int | None = None, max_enumerated_steps: int = 12) -> GaussianLaws:
    r"""G2 (strongly convex quadratics): the two laws of the last iterate (see :func:`g2_divergence`;
    Poisson sampling: :func:`g2_poisson_laws`)."""
    cfg, assumptions = _params(params)
    if cfg.sampling is Sampling.POISSON:
        return g2_poisson_laws(params, max_enumerated_steps=max_enumerated_steps)
    if cfg.sampling is Sampling.RANDOM_ALLOCATION:
        return g2_random_allocation_mixtures(params).common_variance()
    if cfg.relation is not Relation.REPLACE_ONE:
        raise ValueError(f"relation must be replace_one for G2. Found {cfg.relation.value}.")
    if cfg.learning_rate is None or assumptions.strong_convexity <= 0:
        raise ValueError("G2 needs learning_rate and strong_convexity > 0.")
    if cfg.sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE):
        shifts, variance = g2_position_shifts(params)
        if cfg.sampling is Sampling.CYCLIC:
            j = int(np.argmax(np.abs(shifts))) if position is None else int(position)
            m = shifts[j]
            one = np.array([1.0])
            return GaussianLaws(one, np.array([m]), one, np.array([-m]), variance, detail=f"G2 cyclic, position {j}")
        weights: np.ndarray = _batch_sizes(cfg) / cfg.dataset_size  # (reshuffle: float masses from bincount)
        return GaussianLaws(weights, shifts, weights, -shifts, variance, detail="G2 shuffle_once mixture")
    if cfg.sampling is Sampling.RESHUFFLE:
        # one independent position per pass: the mean is a sum of independent per-pass terms
        prods = _g2_contractions(cfg, assumptions.strong_convexity)
        a = cfg.learning_rate * cfg.clip_norm / cfg.batch_size
        sigma_p = cfg.learning_rate * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size
        sizes = _batch_sizes(cfg) / cfg.dataset_size
        means, weights = np.zeros(1), np.ones(1)
        for start in range(0, cfg.steps, cfg.steps_per_epoch):
            used = np.arange(start, start + cfg.steps_per_epoch)
            term = np.where(used < cfg.steps, a * prods[np.minimum(used, cfg.steps - 1)], 0.0)
            means = (means[:, None] + term[None, :]).ravel()
            weights = (weights[:, None] * sizes[None, :]).ravel()
            means, inverse = np.unique(means, return_inverse=True)
            weights = np.bincount(inverse.ravel(), weights=weights)
            if means.size > max_enumerated_steps * 2000:
                raise ValueError(
                    f"G2 reshuffle has more than {max_enumerated_steps * 2000} distinct means; use fewer passes."
                )
        variance = sigma_p**2 * float(np.sum(prods**2))
        detail = f"G2 reshuffle, {means.size} distinct means over the per-pass positions"
        return GaussianLaws(weights, means, weights, -means, variance, detail=detail)
    if cfg.sampling is Sampling.RANDOM_BATCH:
        if cfg.steps > max_enumerated_steps:
            raise ValueError(
                f"steps must be <= max_enumerated_steps = {max_enumerated_steps} for G2 random_batch "
                f"(2^T enumeration). Found {cfg.steps}."
            )
        w, m, variance = _membership_patterns(cfg, _g2_contractions(cfg, assumptions.strong_convexity))
        return GaussianLaws(w, m, w, -m, variance, detail=f"G2 random_batch, {w.size} inclusion patterns")
    raise ValueError(
        f"sampling must be cyclic, shuffle_once, reshuffle or random_batch for G2. Found {cfg.sampling.value}."
    )


def g2_divergence(
    orders, params: Mapping[str, Any], *, position: int | None = None, max_enumerated_steps: int = 12, **kw
) -> ExactDivergence:
    r"""G2 (strongly convex quadratics, lam = ``strong_convexity``, M = lam): exact divergence.

    CYCLIC: ``alpha (2 m_j)^2 / (2 V)`` at batch index ``position`` (default:
    the worst j). SHUFFLE_ONCE: the uniform mixture over the position of the
    differing example (batch j with probability ``|B_j| / n``), by certified
    quadrature. RESHUFFLE: the mixture over one independent position per pass
    (exact; at most ``2000 * max_enumerated_steps`` distinct means). RANDOM_BATCH:
    exact enumeration of the ``2^T`` inclusion patterns (only for
    ``T <= max_enumerated_steps``). Replace-one only, except POISSON and
    RANDOM_ALLOCATION (:func:`g2_random_allocation_mixtures`, the l2 term outside the clip).
    """
    laws = g2_laws(params, position=position, max_enumerated_steps=max_enumerated_steps)
    return laws.divergence(orders, **kw)


@dataclasses.dataclass(frozen=True)
class GaussianScaleMixtures:
    r"""Two one-dimensional Gaussian mixtures whose components may have different variances:
    :math:`P = \sum_j w_j \mathcal N(\mu_j, V_j)`, :math:`Q = \sum_k v_k \mathcal N(\nu_k, U_k)`."""

    p_weights: np.ndarray
    p_means: np.ndarray
    p_variances: np.ndarray
    q_weights: np.ndarray
    q_means: np.ndarray
    q_variances: np.ndarray
    detail: str = ""

    @property
    def equal_variances(self) -> bool:
        variances = np.concatenate((self.p_variances, self.q_variances))
        return bool(np.all(variances == variances[0]))

    def common_variance(self) -> GaussianLaws:
        """The same laws as :class:`GaussianLaws` (every component with the same variance)."""
        if not self.equal_variances:
            raise ValueError("the components' variances differ: use hockey_stick() (lower end only).")
        variance = float(self.p_variances[0])
        return GaussianLaws(self.p_weights, self.p_means, self.q_weights, self.q_means, variance, detail=self.detail)

    def hockey_stick(self, *, cells: int = 20_000, reach: float = 40.0) -> HockeyStick:
        r"""The certified privacy profile: both ends (:func:`gaussian_mixture_hockey_stick`) when every variance
        is the same; otherwise its lower end only, from the cell masses (data processing: for any union A of
        cells, :math:`P(A) - e^\varepsilon Q(A)` is at most the divergence), each mass a sum of normal CDF
        differences with the relative error of :func:`gaussian_mixture_hockey_stick`, on a window ``reach``
        largest standard deviations beyond the extreme means (the two tails are cells of their own)."""
        if self.equal_variances:
            return self.common_variance().hockey_stick(cells=cells, reach=reach)
        p_std, q_std = np.sqrt(self.p_variances), np.sqrt(self.q_variances)
        widest = float(max(p_std.max(), q_std.max()))
        means = np.concatenate((self.p_means, self.q_means))
        x_left, x_right = float(means.min()) - reach * widest, float(means.max()) + reach * widest
        edges = np.linspace(x_left, x_right, cells + 1)
        h = (x_right - x_left) / cells
        log_rel = math.log1p(1e-12 + 8.0 * _UNIT_ROUNDOFF * (x_right - x_left) / h)
        log_p = _mixture_log_cells(self.p_weights, self.p_means, edges, p_std)
        log_q = _mixture_log_cells(self.q_weights, self.q_means, edges, q_std)
        no_ratio = np.full(log_p.size, np.inf)
        directions = (
            (log_p - log_rel, log_p + log_rel, log_q - log_rel, log_q + log_rel, no_ratio),
            (log_q - log_rel, log_q + log_rel, log_p - log_rel, log_p + log_rel, no_ratio),
        )
        detail = f"{self.detail}; {cells} cells, lower end only (unequal variances)"
        return HockeyStick(directions, certified_upper=False, detail=detail)


def _unique_components(weights: np.ndarray, means: np.ndarray, variances: np.ndarray):
    """Equal (mean, variance) components merged, their weights summed."""
    pairs, inverse = np.unique(np.stack((means, variances), axis=1), axis=0, return_inverse=True)
    return np.bincount(inverse.ravel(), weights=weights), pairs[:, 0], pairs[:, 1]


def g2_random_allocation_mixtures(
    params: Mapping[str, Any], *, allocations_per_epoch: int = 1, others: int | None = None, max_patterns: int = 1 << 16
) -> GaussianScaleMixtures:
    r"""Random allocation (docs/derivations/random-allocation-last-iterate.md#ra-ground-truth): 1-D noisy gradient
    descent with gradient ``a_i + lam x``, ``a_i = +C`` for the differing record (``-C`` in the other world,
    replace-one; absent, add-or-remove) and 0 for the others. Every epoch each example is in
    ``allocations_per_epoch`` = k of the ``ceil(n/b)`` = t steps (a uniform k-subset, independent across examples
    and epochs); the sum is divided by b. Given the allocation the last iterate is Gaussian: step factors
    ``rho_t = 1 - eta lam`` when the l2 term is outside the clip (``l2_outside_clip``; only the record's
    allocation is enumerated), else ``1 - eta lam |B_t| / b`` (every example's allocation is enumerated: the
    variance then depends on the realised batch sizes); mean ``(eta C / b) sum_{uses t} prod_{s > t} rho_s``,
    variance ``sigma_p^2 sum_t prod_{s > t} rho_s^2``.

    Args:
      params: the public API's keyword parameters (``sampling="random_allocation"``, ``learning_rate``,
        ``strong_convexity`` = lam, ``l2_outside_clip``, ``relation``).
      allocations_per_epoch: k.
      others: the number of other records (default n - 1; add-or-remove with a record added to n: n).
      max_patterns: the largest number of allocations enumerated.
    """
    cfg, assumptions = _params(params)
    if cfg.sampling is not Sampling.RANDOM_ALLOCATION:
        raise ValueError(f"sampling must be random_allocation. Found {cfg.sampling.value}.")
    lr = _g2_learning_rate(cfg)
    t, k, steps, lam = cfg.steps_per_epoch, int(allocations_per_epoch), cfg.steps, assumptions.strong_convexity
    if not 1 <= k <= t:
        raise ValueError(f"allocations_per_epoch must be in [1, {t}]. Found {allocations_per_epoch}.")
    n_others = cfg.dataset_size - 1 if others is None else int(others)
    per_example = lam > 0 and not assumptions.l2_outside_clip
    epochs = -(-steps // t)
    subsets = np.zeros((math.comb(t, k), t))
    for row, chosen in enumerate(itertools.combinations(range(t), k)):
        subsets[row, list(chosen)] = 1.0
    units = 1 + n_others if per_example else 1  # the record first
    patterns = subsets.shape[0] ** (units * epochs)
    if patterns > max_patterns:
        raise ValueError(f"{patterns} allocations to enumerate; at most max_patterns = {max_patterns}.")
    index = np.array(list(itertools.product(range(subsets.shape[0]), repeat=units * epochs)), dtype=np.int64)
    index = index.reshape(patterns, units, epochs)
    member = subsets[index].reshape(patterns, units, epochs * t)[:, :, :steps]  # (pattern, example, step)
    record, counts = member[:, 0, :], member[:, 1:, :].sum(axis=1)
    a, sigma_p = lr * cfg.clip_norm / cfg.batch_size, lr * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size

    def factors(sizes: np.ndarray) -> np.ndarray:
        """prod_{s > t} rho_s per pattern and step."""
        rho = 1.0 - lr * lam * sizes / cfg.batch_size if per_example else np.full(sizes.shape, 1.0 - lr * lam)
        tail = np.cumprod(rho[:, ::-1], axis=1)[:, ::-1]
        return np.concatenate((tail[:, 1:], np.ones((rho.shape[0], 1))), axis=1)

    with_record = factors(counts + record)
    means = a * np.sum(record * with_record, axis=1)
    variances = sigma_p**2 * np.sum(with_record**2, axis=1)
    weights = np.full(patterns, 1.0 / patterns)
    detail = f"G2 random_allocation {cfg.relation.value}, k={k}, {patterns} allocations"
    pw, pm, pv = _unique_components(weights, means, variances)
    if cfg.relation is Relation.REPLACE_ONE:
        return GaussianScaleMixtures(pw, pm, pv, pw, -pm, pv, detail)
    without = factors(counts)
    qw, qm, qv = _unique_components(weights, np.zeros(patterns), sigma_p**2 * np.sum(without**2, axis=1))
    return GaussianScaleMixtures(pw, pm, pv, qw, qm, qv, detail)


# ------------------------------------------------------------------ hockey-stick divergence (privacy profile)


@dataclasses.dataclass(frozen=True)
class HockeyStick:
    r"""Certified bounds on the exact privacy profile of a pair of laws,
    :math:`\delta(\varepsilon) = \max(H_\varepsilon(P\|Q), H_\varepsilon(Q\|P))`,
    :math:`H_\varepsilon(P\|Q) = \sup_A P(A) - e^\varepsilon Q(A) = \int (p - e^\varepsilon q)_+`,
    from cell masses that do not depend on epsilon (so any number of epsilons is cheap).

    ``directions``: per direction (P||Q, and Q||P), the logs of a lower and an upper
    bound on each cell's mass under the numerator law, the same under the
    denominator law, and a bound on :math:`\sup_c \log(p/q)` (``inf``: none). Everything
    is kept in log space, so that no cell mass underflows to 0 (a zero Q-mass would
    make the lower end optimistic at large epsilon).

    * lower end: :math:`\sum_c (P_c - e^\varepsilon Q_c)_+`, the value at the best union of
      cells (a set A), with P at its lower and Q at its upper bound (data processing);
    * upper end: :math:`\int_c (p - e^\varepsilon q)_+ \le \min(P_c, Q_c(\sup_c p/q - e^\varepsilon)_+)`,
      summed over the cells (the cells cover the line; a cell without a ratio bound
      contributes its P-mass).
    """

    directions: tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], ...]
    certified_upper: bool = True
    missing_mass: float = 0.0
    detail: str = ""

    def _one(self, eps: float, k: int) -> tuple[float, float]:
        lp_low, lp_up, _, lq_up, log_ratio_up = self.directions[k]
        n = lp_low.size
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # P_c - e^eps Q_c = P_c (1 - e^(eps + log Q_c - log P_c)) where positive
            gap = eps + lq_up - lp_low
            positive = gap < 0
            terms = np.exp(lp_low[positive]) * -np.expm1(gap[positive])
            lower = float(np.sum(terms)) * (1.0 - 4.0 * _UNIT_ROUNDOFF * math.log2(max(n, 2)))
            if self.missing_mass > 0:  # the dropped components add at most e^eps * missing to e^eps Q(A)
                lower -= math.exp(min(eps + math.log(self.missing_mass), 700.0))
            # Q_c (R_c - e^eps)_+ = exp(log Q_c + L_c + log(1 - e^(eps - L_c))) for L_c > eps
            over = np.minimum(eps - log_ratio_up, 0.0)
            log_excess = np.where(log_ratio_up > eps, lq_up + log_ratio_up + np.log(-np.expm1(over)), -np.inf)
            per_cell = np.where(np.isfinite(log_ratio_up), np.minimum(lp_up, log_excess), lp_up)
            upper = float(np.sum(np.exp(per_cell))) * (1.0 + 4.0 * _UNIT_ROUNDOFF * math.log2(max(n, 2)))
        upper += n * 5e-324  # cells whose bound underflowed to 0
        upper += self.missing_mass  # (p + p_m - e^eps (q + q_m))_+ <= (p - e^eps q)_+ + p_m
        return max(lower, 0.0), min(upper, 1.0)

    def delta(self, eps) -> tuple[np.ndarray, np.ndarray]:
        """(lower, upper) bounds on delta(eps) at each epsilon (upper is inf where not certified)."""
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        lower, upper = np.zeros(eps.shape), np.zeros(eps.shape)
        for i, e in enumerate(eps):
            for k in range(len(self.directions)):
                lo, up = self._one(float(e), k)
                lower[i], upper[i] = max(lower[i], lo), max(upper[i], up)
        if not self.certified_upper:
            upper[:] = np.inf
        return lower, upper

    def epsilon(self, delta: float) -> tuple[float, float]:
        r"""Certified interval for the exact :math:`\varepsilon(\delta) = \inf\{\varepsilon \ge 0:
        \delta(\varepsilon) \le \delta\}`: both profile bounds decrease in epsilon, so the
        epsilon where the lower (upper) bound crosses delta is below (above) the truth.
        Bisection to 1e-9 relative; beyond 1e300 the lower end is 1e300 (still below the truth)
        and the upper end inf."""

        def crossing(side: int) -> float:
            def above(e: float) -> bool:
                return self.delta(e)[side][0] > delta

            if not above(0.0):
                return 0.0
            hi = 1.0
            while above(hi):
                if hi > _LARGEST_EPSILON:  # the crossing lies beyond: hi is still a valid lower end
                    return hi if side == 0 else math.inf
                hi *= 2.0
            lo = 0.0
            while hi - lo > 1e-9 * hi:
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if above(mid) else (lo, mid)
            return lo if side == 0 else hi

        upper = crossing(1) if self.certified_upper else math.inf
        return crossing(0), upper


def gaussian_mixture_hockey_stick(
    p_weights,
    p_means,
    q_weights,
    q_means,
    variance: float,
    *,
    missing_mass: float = 0.0,
    cells: int = 20_000,
    reach: float = 40.0,
    both_directions: bool = True,
) -> HockeyStick:
    r"""Certified privacy profile of :math:`P = \sum_j w_j \mathcal N(\mu_j, V)` vs
    :math:`Q = \sum_k v_k \mathcal N(\nu_k, V)` in 1-D (see :class:`HockeyStick`).

    The window reaches ``reach`` standard deviations beyond the extreme means (the
    mass outside it, below :math:`\Phi(-40) < 10^{-340}`, forms two cells of its own);
    inside, ``cells`` equal cells with exact normal-CDF masses in log space (stable
    differences; relative error at most :math:`r = 10^{-12} + 8u\,z_{\max}\sigma/h`, u the
    unit roundoff, :math:`z_{\max}` the window's width in standard deviations). The
    supremum of :math:`f = \log(p/q)` on a cell is at most the larger edge value plus
    :math:`K h^2/8`, :math:`|f''| \le K = (\max\mu - \min\mu)^2/(4V^2)` (as in
    :func:`gaussian_mixture_renyi`). ``missing_mass`` (weight dropped from both
    mixtures): the lower end subtracts :math:`e^\varepsilon` times it, the upper end adds it.
    """
    pw, pm = np.asarray(p_weights, float), np.asarray(p_means, float)
    qw, qm = np.asarray(q_weights, float), np.asarray(q_means, float)
    std = math.sqrt(variance)
    all_means = np.concatenate((pm, qm))
    lo_mean, hi_mean = float(all_means.min()), float(all_means.max())
    x_left, x_right = lo_mean - reach * std, hi_mean + reach * std
    edges = np.linspace(x_left, x_right, cells + 1)
    h = (x_right - x_left) / cells
    log_rel = math.log1p(1e-12 + 8.0 * _UNIT_ROUNDOFF * (x_right - x_left) / h)
    log_p = _mixture_log_cells(pw, pm, edges, std)
    log_q = _mixture_log_cells(qw, qm, edges, std)
    f_edges = _mixture_log_density(pw, pm, edges, std) - _mixture_log_density(qw, qm, edges, std)
    curvature = (hi_mean - lo_mean) ** 2 / (4.0 * variance**2)
    slack = curvature * h**2 / 8.0  # f <= the larger edge value + K h^2 / 8 on a cell (|f''| <= K)
    sup_pq = np.maximum(f_edges[:-1], f_edges[1:]) + slack
    sup_qp = -np.minimum(f_edges[:-1], f_edges[1:]) + slack
    no_bound = np.array([np.inf])  # the two tail cells: no ratio bound (they contribute their mass)
    log_ratio_pq = np.concatenate((no_bound, sup_pq + 1e-9 * (1.0 + np.abs(sup_pq)), no_bound))
    log_ratio_qp = np.concatenate((no_bound, sup_qp + 1e-9 * (1.0 + np.abs(sup_qp)), no_bound))
    directions = [(log_p - log_rel, log_p + log_rel, log_q - log_rel, log_q + log_rel, log_ratio_pq)]
    if both_directions:
        directions.append((log_q - log_rel, log_q + log_rel, log_p - log_rel, log_p + log_rel, log_ratio_qp))
    detail = f"{cells} cells of {h / std:.2g} std, window +-{reach:g} std beyond the means"
    return HockeyStick(tuple(directions), missing_mass=missing_mass, detail=detail)


def hockey_stick_of_cells(
    p_cells: np.ndarray, q_cells: np.ndarray, *, relative_error: float, log_ratio_variation: np.ndarray
) -> HockeyStick:
    r"""Certified privacy profile from computed cell masses of two laws (G3): every
    computed mass is within ``relative_error`` e of the true one (so
    :math:`P_c \in [\tilde P_c(1-e), \tilde P_c/(1-e)]`), and ``log_ratio_variation[c]``
    bounds the variation of :math:`\log(p/q)` over cell c (0 for an atom), so that
    :math:`\sup_c p/q \le e^{v_c} P_c/Q_c` (:math:`P_c/Q_c` is a q-average of p/q)."""
    e = float(relative_error)
    if not 0.0 <= e < 0.5:
        raise ValueError(f"relative_error must be in [0, 0.5). Found {relative_error}.")
    v = np.asarray(log_ratio_variation, dtype=float)
    shrink, grow = math.log1p(-e), -math.log1p(-e)
    with np.errstate(divide="ignore"):
        lp, lq = np.log(np.asarray(p_cells, float)), np.log(np.asarray(q_cells, float))
    directions = []
    for la, lb in ((lp, lq), (lq, lp)):
        log_ratio_up = np.where(np.isfinite(lb), v + (la + grow) - (lb + shrink), np.inf)
        directions.append((la + shrink, la + grow, lb + shrink, lb + grow, log_ratio_up))
    return HockeyStick(tuple(directions))


# ------------------------------------------------------------------ G3: projected random walk


@dataclasses.dataclass(frozen=True)
class G3Grid:
    """Grid sizes and the certified error terms of one G3 computation."""

    nodes: int
    fine_cells: int
    relative_error: float  # eps: relative error of every computed cell mass
    quantisation: float  # Lambda * h_f, the upper-end allowance of the quantisation


class _Walk:
    r"""Transition operators of the projected walk on ``[-D/2, D/2]`` with atoms at the ends.

    State vector: ``[a_L, f(x_0), ..., f(x_{G-1}), a_R]`` (atom masses and the
    density at the G equispaced nodes). One step with drift d maps it by
    ``K_d``: trapezoid quadrature of the Gaussian kernel against the density,
    exact Gaussian kernels for the atoms, mass beyond an end onto its atom.
    """

    def __init__(self, diameter: float, std: float, drifts: tuple[float, ...], nodes: int, fine_cells: int):
        # the fine cells subdivide the node spacing, so every source sits on the fine lattice
        self.refine = max(1, -(-fine_cells // (nodes - 1)))
        fine_cells = self.refine * (nodes - 1)
        self.diameter, self.std, self.nodes, self.fine_cells = diameter, std, nodes, fine_cells
        self._offset_cache: dict[float, np.ndarray] = {}
        half = diameter / 2.0
        self.x = np.linspace(-half, half, nodes)
        h = diameter / (nodes - 1)
        w = np.full(nodes, h)
        w[0] = w[-1] = h / 2.0
        self.src = np.concatenate(([-half], self.x, [half]))
        self.src_w = np.concatenate(([1.0], w, [1.0]))
        self.edges = np.linspace(-half, half, fine_cells + 1)
        self.kernels = {d: self._kernel(d) for d in drifts}

    def _columns(self, src: np.ndarray, d: float) -> np.ndarray:
        """Rows [atom L, nodes..., atom R] of the image of unit masses at ``src`` shifted by ``d``."""
        half, s = self.diameter / 2.0, self.std
        diff = (self.x[:, None] - src[None, :] - d) / s
        out = np.empty((self.nodes + 2, src.size))
        out[1:-1] = np.exp(-0.5 * diff**2 - _LOG_SQRT_2PI) / s
        out[0] = special.ndtr((-half - src - d) / s)
        out[-1] = special.ndtr((src + d - half) / s)
        return out

    def _kernel(self, d: float) -> np.ndarray:
        return self._columns(self.src, d) * self.src_w[None, :]

    def start(self, x0: float, d: float) -> np.ndarray:
        return self._columns(np.array([x0]), d)[:, 0]

    def step(self, state: np.ndarray, d: float) -> np.ndarray:
        return self.kernels[d] @ state

    def _offset_masses(self, d: float) -> np.ndarray:
        """Mass of fine cell k from a unit mass at lattice point i depends on k - m i only."""
        if d not in self._offset_cache:
            s, h_f, n_f = self.std, self.diameter / self.fine_cells, self.fine_cells
            j = np.arange(-n_f, n_f + 1)  # edge offsets, in units of h_f
            u = (j * h_f - d) / s
            left, right = special.ndtr(u), special.ndtr(-u)
            # Phi(hi) - Phi(lo), or Phi_c(lo) - Phi_c(hi) right of the mean: both tails keep relative precision
            self._offset_cache[d] = np.where(u[:-1] > 0, right[:-1] - right[1:], left[1:] - left[:-1])
        return self._offset_cache[d]

    def final_cells(self, state: np.ndarray | None, d: float, x0: float) -> np.ndarray:
        """Masses of [atom L, fine cells..., atom R] after one more step with drift d."""
        half, s = self.diameter / 2.0, self.std
        if state is None:
            src, weight = np.array([x0]), np.array([1.0])
        else:
            src, weight = self.src, self.src_w * state
        out = np.empty(self.fine_cells + 2)
        out[0] = special.ndtr((-half - src - d) / s) @ weight
        out[-1] = special.ndtr((src + d - half) / s) @ weight
        if state is None:
            e = self.edges
            u = (e[:, None] - src[None, :] - d) / s
            left, right = special.ndtr(u), special.ndtr(-u)
            masses = np.where(u[:-1] > 0, right[:-1] - right[1:], left[1:] - left[:-1])
            out[1:-1] = masses @ weight
            return out
        g = self._offset_masses(d)
        lattice = np.concatenate(([0], np.arange(self.nodes), [self.nodes - 1])) * self.refine
        chunk = max(1, 4_000_000 // src.size)
        for start in range(0, self.fine_cells, chunk):
            k = np.arange(start, min(start + chunk, self.fine_cells))
            out[1 + k] = g[k[:, None] - lattice[None, :] + self.fine_cells] @ weight
        return out


def g3_error_terms(
    diameter: float, std: float, drifts: tuple[float, ...], nodes: int, fine_cells: int, steps: int
) -> G3Grid:
    r"""Certified relative error of the G3 cell masses and the quantisation allowance.

    With W = D + max|d| and L = D + max d - min d (d over the drifts and 0), the
    true density before a step is ``phi_s * nu`` with nu supported on an interval
    of length L, so ``|(log f)'| <= W/s^2`` and ``|(log f)''| <= max(1/s^2,
    L^2/(4 s^4))`` on K; the kernels (Gaussian density, Gaussian CDF of the ends,
    Gaussian cell mass) have ``|(log k)'| <= (W/s + 1)/s`` (normal hazard bound
    ``phi/Phi_c(u) <= u_+ + 1``) and ``|(log k)''| <= 1/s^2``. The trapezoid
    rule on ``g = f k`` then errs by at most ``eps_q = (h^2/12)(B + A^2) e^(A h)``
    relative to the integral, A, B the sums of those bounds. Rounding: positive
    sums of G + 2 terms, ``eps_fp = 4 (G + 4) u`` per step.
    """
    ds = (0.0, *drifts)
    width = diameter + max(abs(d) for d in ds)
    span = diameter + max(ds) - min(ds)
    s2 = std**2
    a_coef = width / s2 + (width / std + 1.0) / std
    b_coef = max(1.0 / s2, span**2 / (4.0 * s2**2)) + 1.0 / s2
    h = diameter / (nodes - 1)
    # beyond e^700 the bound is no longer a float: infinite (the caller refuses the grid)
    eps_q = h**2 / 12.0 * (b_coef + a_coef**2) * math.exp(a_coef * h) if a_coef * h < 700.0 else math.inf
    # cancellation in a CDF difference over a fine cell: relative error <= 4u Phi/(phi h_f/s) <= 4u (1.3 + W/s) s/h_f
    h_f = diameter / fine_cells
    eps_fp = 4.0 * (nodes + 4) * _UNIT_ROUNDOFF + 4.0 * _UNIT_ROUNDOFF * (1.3 + width / std) * std / h_f
    exponent = (steps - 1) * math.log1p(eps_q) + (steps + 1) * math.log1p(eps_fp)
    eps = math.expm1(exponent) if exponent < 700.0 else math.inf
    return G3Grid(nodes, fine_cells, eps, span / s2 * diameter / fine_cells)


def _choose_nodes(diameter, std, drifts, steps, tolerance, max_nodes, fine_cells) -> int:
    lo, hi = 50, max_nodes
    if g3_error_terms(diameter, std, drifts, hi, fine_cells, steps).relative_error > tolerance:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if g3_error_terms(diameter, std, drifts, mid, fine_cells, steps).relative_error <= tolerance:
            hi = mid
        else:
            lo = mid
    return hi


def _renyi_of_cells(orders: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        lp, lq = np.log(p), np.log(q)
    out = np.empty_like(orders)
    for i, a in enumerate(orders):
        out[i] = _logsumexp(np.where(p > 0, a * lp + (1.0 - a) * lq, -np.inf)) / (a - 1.0)
    return out


def g3_divergence(
    orders,
    params: Mapping[str, Any],
    *,
    x0: float = 0.0,
    position: int | None = None,
    tolerance: float = 2e-4,
    max_nodes: int = 2500,
    fine_cells: int = 20_000,
    max_positions: int = 16,
    hockey_stick: bool = False,
) -> tuple[ExactDivergence, G3Grid]:
    r"""G3 (projected 1-D random walk, arXiv 2205.13710 section 4): certified divergence.

    Args:
      orders: Renyi orders.
      params: public API keyword parameters; ``diameter`` is D (the walk lives on
        ``[-D/2, D/2]``), ``noise_multiplier``, ``learning_rate``, ``clip_norm``,
        ``batch_size`` give the per-step noise ``s = eta z C / b`` and the drift
        ``eta C / b`` of a use of the differing example.
      x0: starting point, in K.
      position: CYCLIC/SHUFFLE_ONCE... for CYCLIC, the batch index of the
        differing example (default: the worst over all positions when
        ``l <= max_positions``, else over a subset, reported in ``detail``).
      tolerance: target relative error of the cell masses (chooses the number of
        nodes, at most ``max_nodes``; the achieved error is returned).
      fine_cells: cells of the final quantisation (upper-end allowance
        ``L h_f / s^2``).
      hockey_stick: also return the certified privacy profile of the pair
        (``ExactDivergence.hockey_stick``; CYCLIC: the worst position at each epsilon).

    Per step the differing example is in the batch deterministically (CYCLIC,
    SHUFFLE_ONCE, RESHUFFLE: mixtures over its position, the permutation being
    independent of the data) or with probability q = b/n (RANDOM_BATCH,
    POISSON; RANDOM_ALLOCATION: one uniform step per pass, as a reshuffle of equal batches: the other
    losses are 0, so the batch sizes do not matter). Replace-one: drifts ``+-eta C/b``; add-or-remove
    (POISSON, RANDOM_ALLOCATION): drift ``eta C/b`` against no drift.

    Returns:
      (ExactDivergence, G3Grid with the grid sizes and error terms).
    """
    cfg, assumptions = _params(params)
    orders = np.asarray(orders, dtype=float)
    if assumptions.diameter is None or cfg.learning_rate is None:
        raise ValueError("G3 needs diameter and learning_rate.")
    diameter = assumptions.diameter
    if not -diameter / 2.0 <= x0 <= diameter / 2.0:
        raise ValueError(f"x0 must be in [-D/2, D/2] = [{-diameter / 2:g}, {diameter / 2:g}]. Found {x0}.")
    std = cfg.learning_rate * cfg.noise_multiplier * cfg.clip_norm / cfg.batch_size
    step = cfg.learning_rate * cfg.clip_norm / cfg.batch_size
    if cfg.relation is Relation.REPLACE_ONE:
        d_p, d_q = step, -step
    else:
        if cfg.sampling not in (Sampling.POISSON, Sampling.RANDOM_ALLOCATION):
            raise ValueError(
                "relation add_or_remove_one is implemented for poisson and random_allocation only. Found "
                f"{cfg.sampling.value}."
            )
        d_p, d_q = step, 0.0
    drifts = tuple(sorted({0.0, d_p, d_q}))
    steps, per_epoch = cfg.steps, cfg.steps_per_epoch
    nodes = _choose_nodes(diameter, std, drifts, steps, tolerance, max_nodes, fine_cells)
    walk = _Walk(diameter, std, drifts, nodes, fine_cells)
    fine_cells = walk.fine_cells
    grid = g3_error_terms(diameter, std, drifts, nodes, fine_cells, steps)
    if grid.relative_error >= 0.5:
        raise ValueError(f"G3 grid error {grid.relative_error:.3g} too large; reduce steps or D/s.")

    def advance(state, d_in, prob):
        """One step: with probability ``prob`` the differing example is used (drift d_in)."""
        if state is None:
            parts = [(prob, walk.start(x0, d_in)), (1.0 - prob, walk.start(x0, 0.0))]
        else:
            parts = [
                (prob, None if prob == 0 else walk.step(state, d_in)),
                (1.0 - prob, None if prob == 1 else walk.step(state, 0.0)),
            ]
        return sum(p * v for p, v in parts if p > 0)

    def finish(state, d_in, prob):
        parts = []
        if prob > 0:
            parts.append(prob * walk.final_cells(state, d_in, x0))
        if prob < 1:
            parts.append((1.0 - prob) * walk.final_cells(state, 0.0, x0))
        return sum(parts)

    def fixed_position_law(d_in, j):
        state = None
        for t in range(steps - 1):
            state = advance(state, d_in, 1.0 if t % per_epoch == j else 0.0)
        return finish(state, d_in, 1.0 if (steps - 1) % per_epoch == j else 0.0)

    def sampled_law(d_in, q):
        state = None
        for _ in range(steps - 1):
            state = advance(state, d_in, q)
        return finish(state, d_in, q)

    def reshuffle_law(d_in, weights):
        # the position is redrawn every pass: mix over it pass by pass (linearity)
        state, t = None, 0
        while True:
            length = min(per_epoch, steps - t)
            last = t + length == steps
            mixed = 0.0
            for j, w in enumerate(weights):
                s_j = state
                for k in range(length - (1 if last else 0)):
                    s_j = advance(s_j, d_in, 1.0 if k == j else 0.0)
                mixed = mixed + w * (finish(s_j, d_in, 1.0 if length - 1 == j else 0.0) if last else s_j)
            if last:
                return mixed
            state, t = mixed, t + length

    def divergence(p_cells, q_cells):
        return np.maximum(_renyi_of_cells(orders, p_cells, q_cells), _renyi_of_cells(orders, q_cells, p_cells))

    weights = _batch_sizes(cfg) / cfg.dataset_size
    detail = f"G3 {cfg.sampling.value} {cfg.relation.value}, x0={x0:g}"
    certified_upper = True
    if cfg.sampling is Sampling.CYCLIC:
        if position is not None:
            positions = [int(position)]
        elif per_epoch <= max_positions:
            positions = list(range(per_epoch))
        else:
            r = (steps - 1) % per_epoch
            positions = sorted({0, 1, r, (r - 1) % per_epoch, per_epoch - 1})
            certified_upper = False
        pairs = [(fixed_position_law(d_p, j), fixed_position_law(d_q, j)) for j in positions]
        detail += f", worst of positions {positions}"
    elif cfg.sampling is Sampling.SHUFFLE_ONCE:
        if per_epoch > max_positions:
            raise ValueError(
                f"steps per epoch must be <= max_positions = {max_positions} for G3 shuffle_once. Found {per_epoch}."
            )
        p_cells = sum(w * fixed_position_law(d_p, j) for j, w in enumerate(weights))
        q_cells = sum(w * fixed_position_law(d_q, j) for j, w in enumerate(weights))
        pairs = [(p_cells, q_cells)]
    elif cfg.sampling in (Sampling.RESHUFFLE, Sampling.RANDOM_ALLOCATION):
        if per_epoch > max_positions:
            raise ValueError(
                f"steps per epoch must be <= max_positions = {max_positions} for G3 {cfg.sampling.value}. Found "
                f"{per_epoch}."
            )
        if cfg.sampling is Sampling.RANDOM_ALLOCATION:  # one step per epoch, uniform (the others' losses are 0)
            weights = np.full(per_epoch, 1.0 / per_epoch)
        pairs = [(reshuffle_law(d_p, weights), reshuffle_law(d_q, weights))]
    else:
        q = cfg.sampling_probability
        pairs = [(sampled_law(d_p, q), sampled_law(d_q, q))]
    computed = np.max([divergence(p_cells, q_cells) for p_cells, q_cells in pairs], axis=0)
    ell = -math.log1p(-grid.relative_error)
    err = (2.0 * orders - 1.0) * ell / (orders - 1.0) + 64 * _UNIT_ROUNDOFF * fine_cells
    lower = np.maximum(computed - err, 0.0)
    upper = computed + err + grid.quantisation if certified_upper else np.full_like(computed, np.inf)
    detail += f", nodes={nodes}, fine cells={fine_cells}, rel. mass error={grid.relative_error:.2e}"
    profile = None
    if hockey_stick:
        # atoms are cells of their own (no variation); on a fine cell log(p/q) varies by <= L h_f / s^2
        variation = np.full(fine_cells + 2, grid.quantisation)
        variation[0] = variation[-1] = 0.0
        e = grid.relative_error + 64 * _UNIT_ROUNDOFF * fine_cells
        parts = [hockey_stick_of_cells(pc, qc, relative_error=e, log_ratio_variation=variation) for pc, qc in pairs]
        profile = HockeyStick(
            tuple(d for part in parts for d in part.directions), certified_upper=certified_upper, detail=detail
        )
    return ExactDivergence(orders, lower, upper, detail, profile), grid


# ------------------------------------------------------------------ instances


@dataclasses.dataclass(frozen=True)
class Instance:
    """One ground-truth instance: a family, the public API parameters describing
    the run (and the loss assumptions it satisfies), and G3's starting point."""

    family: str  # "G1", "G2" or "G3"
    params: Mapping[str, Any]
    x0: float = 0.0

    def laws(self) -> GaussianLaws:
        """The two Gaussian-mixture laws of a G1 or G2 instance (worst position for CYCLIC)."""
        if self.family == "G1":
            return g1_laws(self.params)
        if self.family == "G2":
            return g2_laws(self.params)
        raise ValueError(f"family must be G1 or G2 for Gaussian laws. Found {self.family!r}.")

    def exact(self, orders, *, hockey_stick: bool = False, **kw) -> ExactDivergence:
        """Certified Renyi divergence at ``orders`` (``kw``: the family's quadrature options)
        and, with ``hockey_stick``, the certified privacy profile of the same pair of laws."""
        if self.family == "G3":
            return g3_divergence(orders, self.params, x0=self.x0, hockey_stick=hockey_stick, **kw)[0]
        laws = self.laws()
        exact = laws.divergence(orders, **kw)
        return dataclasses.replace(exact, hockey_stick=laws.hockey_stick()) if hockey_stick else exact

    def describe(self) -> str:
        keys = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        extra = f", x0={self.x0!r}" if self.family == "G3" else ""
        return f"{self.family}({keys}{extra})"


def g1_params(**kw: Any) -> dict[str, Any]:
    """API parameters of a G1 instance: linear losses (M = 0), no projection,
    gradient norms exactly C everywhere (gradient_norms_within_clip=True is true)."""
    return {"smoothness": 0.0, "gradient_norms_within_clip": True, "learning_rate": 0.1, **kw}


def g2_params(*, strong_convexity: float, **kw: Any) -> dict[str, Any]:
    """API parameters of a G2 instance: lam-strongly convex quadratics, M = lam."""
    return {
        "smoothness": strong_convexity,
        "strong_convexity": strong_convexity,
        "gradient_norms_within_clip": True,
        **kw,
    }


def g3_params(*, diameter: float, **kw: Any) -> dict[str, Any]:
    """API parameters of a G3 instance: linear losses on [-D/2, D/2] (M = 0,
    gradient norms <= C everywhere)."""
    return {"smoothness": 0.0, "gradient_norms_within_clip": True, "diameter": diameter, **kw}
