r"""The optimal shift allocation of shifted interpolation for a fixed batch schedule.

Bok, Su & Altschuler 2024 (arXiv 2403.00278), section 4, in the form of Theorem A
of docs/derivations/shifted-interpolation.md#shifted-interpolation: for a fixed schedule (the steps at which the
differing example is used, the per-step contractions :math:`c_t`), every shift
allocation :math:`a_t \ge 0` with :math:`z_{t+1} = c_t z_t + s_t - a_t \ge 0`,
:math:`z_T = 0` gives :math:`\mu^2 = \sum_t a_t^2`. This module computes the
optimum over allocations exactly (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma 1: the
least concave majorant of the schedule's corners), for any use times
(:func:`schedule_mu`, a reference in O(uses^2)) and, vectorised, for the family
every epoch scheme reduces to: equally spaced uses followed by one last use
(:func:`spaced_uses_mu2`).

Units as in :mod:`lastiter_plugins.bounds.shifted_interpolation`: distances in
per-step noise stds, per-use shift ``step_mu``, projection diameter
``diameter_ratio``.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

#: When every restart count K (chain uses kept after a restart) is too many to try on every
#: schedule, K is chosen on probe schedules from 1..EXACT_RESTARTS and a geometric grid of
#: _GRID_RESTARTS values. Any subset of restarts is valid (each is a schedule of Theorem A).
EXACT_RESTARTS = 64
_GRID_RESTARTS = 64


def _log_capacity(log_c: float, steps: np.ndarray) -> np.ndarray:
    r""":math:`\log G(m)`, :math:`G(m) = \sum_{j<m} c^{2j}` (the noise capacity of m steps,
    measured at their end); -inf at m = 0."""
    steps = np.asarray(steps, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        if log_c == 0.0:
            return np.log(steps)
        return np.log(np.expm1(2.0 * steps * log_c) / math.expm1(2.0 * log_c))


class _Corner:
    """A point of the majorant problem: ``steps`` m to the end (capacity G(m)) and the remaining
    injection as a tuple of log-terms. Along every path the terms of a later corner extend
    those of an earlier one, so a rise is the sum of the extra terms (no cancellation)."""

    __slots__ = ("log_terms", "steps")

    def __init__(self, steps, log_terms: tuple[np.ndarray, ...]):
        self.steps = np.asarray(steps, dtype=float)
        self.log_terms = log_terms


def _log_rise(u: _Corner, v: _Corner) -> np.ndarray:
    extra = v.log_terms[len(u.log_terms) :]
    if not extra:
        return np.full(np.broadcast(u.steps, v.steps).shape, -np.inf)
    return functools.reduce(np.logaddexp, extra)


def _log_run(log_c: float, u: _Corner, v: _Corner) -> np.ndarray:
    # G(m_v) - G(m_u) = c^(2 m_u) G(m_v - m_u): no cancellation
    return 2.0 * u.steps * log_c + _log_capacity(log_c, v.steps - u.steps)


def _majorant_cost(log_c: float, corners: list[_Corner]) -> np.ndarray:
    r"""Cost of the least concave majorant of ``corners`` (sorted outwards, the first the
    origin, the last the endpoint): the cheapest path through a subset of them that passes
    on or above every corner left out (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma 1)."""
    pairs: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    for i, j in itertools.combinations(range(len(corners)), 2):
        start, end = corners[i], corners[j]
        rise, run = _log_rise(start, end), _log_run(log_c, start, end)
        with np.errstate(over="ignore", invalid="ignore"):
            cost = np.where(rise == -np.inf, 0.0, np.exp(2.0 * rise - run))  # nothing to remove costs nothing
            slope = np.where(rise == -np.inf, -np.inf, rise - run)
        pairs[i, j] = cost, slope
    last = len(corners) - 1
    costs = []
    for keep in itertools.product((True, False), repeat=last - 1):
        path = [0] + [i + 1 for i, k in enumerate(keep) if k] + [last]
        cost = np.asarray(sum(pairs[u, v][0] for u, v in itertools.pairwise(path)))
        for u, v in itertools.pairwise(path):
            for p in range(u + 1, v):  # a corner left out must lie on or below the segment u -> v
                cost = np.where(pairs[u, p][1] <= pairs[u, v][1], cost, np.inf)
        costs.append(cost)
    return functools.reduce(np.minimum, costs)


def _restart_grid(max_count: int, diameter_ratio: float, step_mu: float) -> np.ndarray:
    """Restart counts K in 1..max_count to try first: all up to EXACT_RESTARTS, a geometric grid
    beyond, and the integers around D~/s (the optimum of the convex case)."""
    exact = np.arange(1, min(max_count, EXACT_RESTARTS) + 1)
    grid = np.round(np.geomspace(1, max_count, _GRID_RESTARTS)).astype(np.int64)
    ratio = diameter_ratio / step_mu
    around = np.array([math.floor(ratio), math.ceil(ratio)]) if ratio < max_count else np.array([max_count])
    out = np.unique(np.concatenate((exact, grid, around)))
    return out[(out >= 1) & (out <= max_count)]


class _SpacedUses:
    """The corners of 'N - 1 uses spaced by l, then a last use g steps later, r steps before the
    end' for a 1-D array of schedules (docs/derivations/schedule-mixtures.md#sm-spaced-uses)."""

    def __init__(self, log_c, log_s, spacing, uses, gap, after):
        self.log_c, self.log_s, self.spacing = log_c, log_s, spacing
        self.n = uses
        self.r, self.g = after.astype(float), np.where(uses >= 2, gap, 1).astype(float)
        self.a = log_s + self.r * log_c  # log-injection of the last use
        self.b = log_s + (self.r + self.g) * log_c  # of the chain's last use

    def _chain_term(self, r, g, count):
        """log of the injections of the chain's uses 2..count from its end (count >= 2)."""
        log_sum = np.log(_geometric_sum(self.spacing * self.log_c, count - 1.0))
        return self.log_s + (r + g + self.spacing) * self.log_c + log_sum

    def base(self) -> np.ndarray:
        """mu^2 without a restart: the majorant of the origin, the last use and the chain's ends."""
        n, r, g = self.n, self.r, self.g
        origin, last = _Corner(np.zeros(r.shape), ()), _Corner(r + 1.0, (self.a,))
        chain_end = _Corner(r + g + 1.0, (self.a, self.b))
        count = np.maximum(n - 1.0, 2.0)
        chain_start = _Corner(
            r + g + 1.0 + (count - 1.0) * self.spacing, (self.a, self.b, self._chain_term(r, g, count))
        )
        mu2 = np.where(n == 1, _majorant_cost(self.log_c, [origin, last]), np.inf)
        mu2 = np.where(n == 2, _majorant_cost(self.log_c, [origin, last, chain_end]), mu2)
        return np.where(n >= 3, _majorant_cost(self.log_c, [origin, last, chain_end, chain_start]), mu2)

    def short_restarts(self, log_d: float) -> np.ndarray:
        """mu^2 of the restarts after the last use (r >= 1) and after the chain's last use (N >= 2)."""
        r, g, log_c = self.r, self.g, self.log_c
        with np.errstate(over="ignore"):
            tail = np.exp(2.0 * (r * log_c + log_d) - _log_capacity(log_c, r))  # (c^r D~)^2 / G(r)
        origin, last = _Corner(np.zeros(r.shape), ()), _Corner(r + 1.0, (self.a,))
        after_chain = _Corner(r + g, (self.a, (r + g) * log_c + log_d))
        chain = np.where(self.n >= 2, _majorant_cost(log_c, [origin, last, after_chain]), np.inf)
        return np.minimum(np.where(r >= 1, tail, np.inf), chain)

    def restart(self, log_d: float, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """mu^2, shape (rows, counts), of the restart that keeps K = counts chain uses (inf where the
        chain has no use before them)."""
        r, g, n = self.r[rows, None], self.g[rows, None], self.n[rows, None]
        a, b, k = self.a[rows, None], self.b[rows, None], np.asarray(counts, dtype=float)[None, :]
        origin, last = _Corner(np.zeros(r.shape), ()), _Corner(r + 1.0, (a,))
        chain_end = _Corner(r + g + 1.0, (a, b))
        m = r + g + k * self.spacing
        start = m * self.log_c + log_d  # log of the restart's initial shift, measured at the end
        cost = np.empty(np.broadcast(r, k).shape)
        one = k[0] == 1.0  # K = 1 keeps only the chain's last use
        if one.any():
            point = _Corner(m[:, one], (a, b, start[:, one]))
            cost[:, one] = _majorant_cost(self.log_c, [origin, last, chain_end, point])
        if (~one).any():
            k, m, start = k[:, ~one], m[:, ~one], start[:, ~one]
            term = self._chain_term(r, g, k)
            corner_k = _Corner(r + g + 1.0 + (k - 1.0) * self.spacing, (a, b, term))
            point = _Corner(m, (a, b, term, start))
            cost[:, ~one] = _majorant_cost(self.log_c, [origin, last, chain_end, corner_k, point])
        return np.where(n >= np.asarray(counts)[None, :] + 2, cost, np.inf)


def _probe_counts(schedules: _SpacedUses, log_d: float, max_count: int, d: float, s: float) -> np.ndarray:
    """Restart counts worth trying for every schedule, found on a few probe schedules (the extreme
    and middle rows): the grid, then every integer (or 64 of them) between the grid neighbours of
    each probe's best, and the two best of each probe with their neighbours. Any choice is
    valid (each restart is a schedule of Theorem A); this one keeps the work O(rows * 18)."""
    rows = np.unique(np.array([0, schedules.n.size // 2, schedules.n.size - 1]))
    grid = _restart_grid(max_count, d, s)
    best = np.argmin(schedules.restart(log_d, rows, grid), axis=1)
    lo, hi = grid[np.maximum(best - 1, 0)], grid[np.minimum(best + 1, grid.size - 1)]
    dense = np.unique(np.concatenate([np.unique(np.round(np.linspace(a, b, 64))) for a, b in zip(lo, hi, strict=True)]))
    tried = np.unique(np.concatenate((grid, dense.astype(np.int64))))
    costs = schedules.restart(log_d, rows, tried)
    top = np.argsort(costs, axis=1)[:, :2].ravel()
    picks = np.concatenate((tried[top], tried[top] - 1, tried[top] + 1))
    return np.unique(picks[(picks >= 1) & (picks <= max_count)])


#: Above this many (schedule, restart) pairs the restarts are chosen on probe schedules.
_FULL_SEARCH = 4096


def spaced_uses_mu2(
    *,
    step_mu: float,
    log_contraction: float,
    spacing: int,
    uses: np.ndarray,
    gap: np.ndarray,
    after: np.ndarray,
    diameter_ratio: float | None = None,
) -> np.ndarray:
    r""":math:`\mu^2` of the optimal shift allocation when the differing example is used
    ``uses`` = N times: N - 1 uses equally spaced by ``spacing`` (l), then a last use
    ``gap`` (g >= 1) steps after the last of them and ``after`` (r) steps before the end;
    one contraction c <= 1 at every step (docs/derivations/schedule-mixtures.md#sm-spaced-uses).

    The chain of equally spaced corners is convex, so the majorant is that of four
    corners (origin, last use, the chain's two ends), minimised with a projection over
    the restarts after the last use, after the chain and after the chain's K-th use
    from its end. Exact without a projection; with one, exact while (schedules x
    restarts) <= 4096, beyond that a minimum over restarts chosen on probe schedules
    (each a valid schedule: never below the true minimum). Vectorised (broadcast).

    Args:
      step_mu: s > 0, the shift of one use in noise stds (finite).
      log_contraction: log c <= 0.
      spacing: l >= 1.
      uses: N >= 1.
      gap: g >= 1 (ignored where N = 1).
      after: r >= 0.
      diameter_ratio: D / sigma_p (finite, > 0), or None.

    Returns:
      mu^2 with the broadcast shape.
    """
    n, g, r = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (uses, gap, after)))
    schedules = _SpacedUses(float(log_contraction), math.log(step_mu), spacing, n.ravel(), g.ravel(), r.ravel())
    with np.errstate(invalid="ignore", divide="ignore"):
        mu2 = schedules.base()
        if diameter_ratio is not None:
            log_d = math.log(diameter_ratio)
            mu2 = np.minimum(mu2, schedules.short_restarts(log_d))
            max_count = int(n.max()) - 2
            if max_count >= 1:
                if n.size * max_count <= _FULL_SEARCH:
                    counts = np.arange(1, max_count + 1)
                else:
                    counts = _probe_counts(schedules, log_d, max_count, diameter_ratio, step_mu)
                every = np.arange(n.size)
                mu2 = np.minimum(mu2, np.min(schedules.restart(log_d, every, counts), axis=1))
    return mu2.reshape(n.shape)


def _geometric_sum(log_ratio: float, count: np.ndarray) -> np.ndarray:
    r""":math:`\sum_{k<K} \rho^k` from :math:`\log\rho` (K at rho = 1)."""
    count = np.asarray(count, dtype=float)
    if log_ratio == 0.0:
        return count
    return np.expm1(count * log_ratio) / math.expm1(log_ratio)


def schedule_mu(
    *,
    use_times,
    steps: int,
    contraction,
    step_mu: float,
    diameter_ratio: float | None = None,
) -> float:
    r"""mu-GDP of the last iterate for ONE fixed schedule: the exact optimum of the shift
    allocation (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma 1), with a projection also
    minimised
    over every restart after a use (L4).

    A reference implementation (O(uses^2) with a projection, O(uses) without) for any use
    times and per-step contractions; the registry's bounds use the vectorised
    :func:`spaced_uses_mu2`.

    Args:
      use_times: the steps t in [0, T) at which the differing example is used (distinct).
      steps: T.
      contraction: one c in [0, 1], or T values c_t (the Lipschitz constant of step t).
      step_mu: s, the shift of one use in noise stds.
      diameter_ratio: D / sigma_p, or None.

    Returns:
      mu >= 0.
    """
    times = np.unique(np.asarray(use_times, dtype=np.int64))
    if times.size and (times[0] < 0 or times[-1] >= steps):
        raise ValueError(f"use_times must lie in [0, {steps}). Found {times.min()}..{times.max()}.")
    c = np.broadcast_to(np.asarray(contraction, dtype=float), (steps,))
    if np.any(c < 0) or np.any(c > 1):
        raise ValueError("contraction must lie in [0, 1] at every step.")
    if times.size == 0:
        return 0.0
    with np.errstate(divide="ignore"):
        log_c = np.log(c)
    # log P_t = sum_{u > t} log c_u; capacity X(t) = sum_{v >= t} P_v^2
    log_p = np.append(np.cumsum(log_c[::-1])[::-1][1:], 0.0)
    capacity = np.append(np.cumsum(np.exp(2.0 * log_p)[::-1])[::-1], 0.0)  # X(0..T)
    injection = step_mu * np.exp(log_p[times])
    remaining = np.cumsum(injection[::-1])[::-1]  # Y at each use (from that use on)
    points = [(capacity[t], y) for t, y in zip(times[::-1], remaining[::-1], strict=True)]  # outwards

    def hull_cost(pts):
        hull = [(0.0, 0.0)]
        for p in pts:
            while len(hull) >= 2 and _not_concave(hull[-2], hull[-1], p):
                hull.pop()
            hull.append(p)
        return sum((y1 - y0) ** 2 / (x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull) if y1 > y0)

    best = hull_cost(points)
    if diameter_ratio is not None:
        for i, t in enumerate(times):  # restart after use i: drop it and every earlier use
            start = t + 1
            if start >= steps:
                continue
            later = points[: len(times) - 1 - i]
            initial = diameter_ratio * math.exp(log_p[start - 1])  # P_{tau-1} D~
            level = later[-1][1] if later else 0.0
            best = min(best, hull_cost([*later, (capacity[start], level + initial)]))
    return math.sqrt(best)


def _not_concave(a, b, p) -> bool:
    """b lies on or below the segment a -> p (so it is no vertex of the upper hull)."""
    return (b[1] - a[1]) * (p[0] - a[0]) <= (p[1] - a[1]) * (b[0] - a[0])
