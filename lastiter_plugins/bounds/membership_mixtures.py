r"""Schedule mixtures for independent memberships: random batches and Poisson sampling.

docs/decisions.md, section 19. The differing record joins step t with probability q,
independently across steps and of the data, in both neighbouring worlds (fixed-size
random batches: q = b/n; Poisson sampling: q the sampling rate). Given the memberships
``u`` the run is noisy gradient descent with a fixed schedule, so by Theorem A
(section 14) the last iterates are :math:`\mu(u)`-GDP for every feasible shift
allocation, and by joint convexity of the hockey-stick divergence (section 17, part 1)

.. math:: \delta(\varepsilon) \le \mathbb E_u\,\delta_{\mu(u)}(\varepsilon).

This module bounds :math:`\mu(u)^2` by the cost of ONE explicit allocation whose cost
is a sum of independent terms, and computes the exact law of that sum on a lattice
(every value rounded up, so the law is stochastically larger). The allocation, for a
layout ``prefix | blocks m_1..m_K | window f`` of the T steps:

* prefix: pay nothing; its shift decays, ``z_P = s sum_t u_t c^(P-1-t)``, and is paid
  during block 1 (cost ``c^(2 m_1) z_P^2 / G(m_1)``);
* block i: the uses of block i (at most ``s k_i``, k_i its number of uses) are paid during
  block i + 1 (cost ``c^(2 m_{i+1}) s^2 k_i^2 / G(m_{i+1})``);
* window: the last block's ``s k_K`` (or ``z_P`` without blocks) and each use r steps
  before the end are paid by their own optimal allocations, which add up (Minkowski):
  ``mu_w <= s k_K c^f / sqrt(G(f)) + sum_r u_r s c^r / sqrt(G(r+1))``.

The payments of the parts have disjoint supports, so
:math:`\mu(u)^2 \le \text{prefix} + \sum_i \text{block}_i + \mu_w^2`, a sum of independent
terms, each s times a term free of s (the law is computed once for s = 1 and scaled).
Units as in :mod:`lastiter_plugins.bounds.shifted_interpolation` (per-step noise
std; per-use shift ``step_mu``); ``contraction`` c is the weakest over the steps (Lemma 2:
a larger c_t never lowers mu). Mass the lattices cannot hold (values above their caps)
becomes a component with mu = inf (delta = 1): never dropped.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import stats

from lastiter_plugins import profiles

#: Lattice sizes (cells of the mu^2 lattice, of the final window's mu lattice): every layout is
#: ranked on the coarse lattices, the best _FINE_LAYOUTS are computed on the fine ones.
_COARSE_CELLS = 1000
_FINE_CELLS = 8000
_FINE_LAYOUTS = 2
#: A strong contraction (c below _STRONG) leaves a few short blocks with sparse laws: there the fine
#: lattice has _STRONG_FINE_CELLS cells at about the same cost.
_STRONG = 0.999
_STRONG_FINE_CELLS = 16000
#: A lattice is extended while more than this mass falls beyond it (that mass gets mu = inf).
_LEFT_OUT = 1e-10
#: Cells per shift s of the prefix's shift lattice.
_Z_PER_SHIFT = 1000
#: The layout is chosen at this delta (every layout is a valid bound: the choice only affects tightness).
REFERENCE_DELTA = 1e-5
#: A law with at most this many atoms is convolved atom by atom.
_SPARSE_ATOMS = 64
#: A layout repeats a block at most this often (every block's term is rounded up once).
_MAX_REPEAT = 64
#: Tail blocks before the window shrink by this factor (block i + 1 is at least this times block i).
_SHRINK = 0.7


@dataclasses.dataclass(frozen=True)
class Layout:
    """A partition of the T steps: ``prefix`` steps, then the blocks ``head``, ``count`` blocks of
    ``repeat`` steps and ``tail`` (lengths, in order), then ``window`` steps."""

    prefix: int
    head: tuple[int, ...]
    repeat: int
    count: int
    tail: tuple[int, ...]
    window: int

    @classmethod
    def of(cls, prefix: int, blocks: tuple[int, ...], window: int) -> Layout:
        """A layout from its list of blocks."""
        return cls(prefix, tuple(blocks), 1, 0, (), window)

    @property
    def steps(self) -> int:
        return self.prefix + sum(self.head) + self.repeat * self.count + sum(self.tail) + self.window

    def _runs(self) -> list[tuple[int, int]]:
        """The blocks as (length, how many in a row)."""
        runs = [(m, 1) for m in self.head] + ([(self.repeat, self.count)] if self.count else [])
        return runs + [(m, 1) for m in self.tail]

    @property
    def first_block(self) -> int | None:
        runs = self._runs()
        return runs[0][0] if runs else None

    @property
    def last_block(self) -> int | None:
        runs = self._runs()
        return runs[-1][0] if runs else None

    def pairs(self) -> dict[tuple[int, int], int]:
        """How often each (block length, next block length) occurs."""
        out: dict[tuple[int, int], int] = {}
        runs = self._runs()
        for i, (m, k) in enumerate(runs):
            if k > 1:
                out[m, m] = out.get((m, m), 0) + k - 1
            if i + 1 < len(runs):
                key = (m, runs[i + 1][0])
                out[key] = out.get(key, 0) + 1
        return out


def _capacity(c: float, m: int) -> float:
    r""":math:`G(m) = \sum_{j<m} c^{2j}` (m at c = 1)."""
    if c == 1.0:
        return float(m)
    return -math.expm1(2.0 * m * math.log(c)) / -math.expm1(2.0 * math.log(c))


def _use_mu(c: float, r: int) -> float:
    r""":math:`s`-free cost norm of one use r steps before the end: :math:`c^r / \sqrt{G(r+1)}`."""
    return c**r / math.sqrt(_capacity(c, r + 1))


def _drain_factor(c: float, m: int) -> float:
    r"""Cost of paying a shift x held at the start of m steps: :math:`x^2 c^{2m} / G(m)`; returns
    :math:`c^{2m}/G(m)`."""
    return c ** (2 * m) / _capacity(c, m)


def _ceil_index(values: np.ndarray, unit: float) -> np.ndarray:
    """Lattice index of each value, rounded up (a relative 1e-12 upward guard against rounding)."""
    return np.ceil(np.asarray(values, dtype=float) * (1.0 + 1e-12) / unit).astype(np.int64)


def _onto_lattice(values: np.ndarray, probs: np.ndarray, unit: float, cells: int) -> np.ndarray:
    """The law of ``values`` (with ``probs``) on the lattice ``unit * j``, j < cells, rounded up;
    mass above the lattice is left out (the caller counts it as mu = inf)."""
    idx = _ceil_index(values, unit)
    keep = idx < cells
    return np.bincount(idx[keep], weights=np.asarray(probs, dtype=float)[keep], minlength=cells)[:cells]


def _convolve(a: np.ndarray, b: np.ndarray, cells: int) -> np.ndarray:
    """Law of the sum of two independent lattice variables, truncated to ``cells`` (exact sums of
    non-negative terms: no cancellation). A law with few atoms (a block of few expected uses) is
    added atom by atom."""
    atoms_a, atoms_b = np.flatnonzero(a), np.flatnonzero(b)
    if min(atoms_a.size, atoms_b.size) > _SPARSE_ATOMS:
        return np.convolve(a, b)[:cells]
    if atoms_b.size > atoms_a.size:  # b: the law with fewer atoms
        a, b, atoms_b = b, a, atoms_a
    out = np.zeros(min(cells, a.size + b.size - 1))
    for j in atoms_b:
        if j < out.size:
            width = min(a.size, out.size - j)
            out[j : j + width] += b[j] * a[:width]
    return out


def _power(law: np.ndarray, count: int, cells: int) -> np.ndarray:
    """Law of the sum of ``count`` independent copies, by repeated squaring, truncated to ``cells``
    (a partial sum above the cap only grows: the mass left out is that of totals above the cap)."""
    result = np.zeros(cells)
    result[0] = 1.0
    base = law[:cells]
    while count:
        if count & 1:
            result = _convolve(result, base, cells)
        count >>= 1
        if count:
            base = _convolve(base, base, cells)
    return result


@functools.lru_cache(maxsize=1024)
def _count_law(steps: int, q: float) -> tuple[np.ndarray, np.ndarray]:
    """Binomial(steps, q) counts within 12 standard deviations (and 40) of the mean, with their
    probabilities; the mass below is moved up to the lowest count kept (a larger count only raises
    the cost), the mass above is left out (the caller gives it mu = inf)."""
    mean = steps * q
    spread = 12.0 * math.sqrt(mean * (1.0 - q)) + 40.0
    lo, top = max(0, math.floor(mean - spread)), min(steps, math.ceil(mean + spread))
    k = np.arange(lo, top + 1)
    pk = stats.binom.pmf(k, steps, q)
    if lo > 0:
        pk[0] += float(stats.binom.cdf(lo - 1, steps, q))
    return k, pk


def _prefix_shift_law(step_mu: float, c: float, q: float, steps: int) -> tuple[np.ndarray, float]:
    """See :func:`_prefix_shift_law_horizon`; prefixes longer than the horizon share one law."""
    horizon = steps
    if c < 1.0:  # older uses add at most c^H s / (1 - c) <= one lattice cell
        horizon = min(steps, math.ceil(math.log((1.0 - c) / _Z_PER_SHIFT) / math.log(c)))
    return _prefix_shift_law_horizon(step_mu, c, q, horizon, horizon < steps)


@functools.lru_cache(maxsize=64)
def _prefix_shift_law_horizon(
    step_mu: float, c: float, q: float, horizon: int, older: bool
) -> tuple[np.ndarray, float]:
    r"""Law of (an upper bound on) :math:`z_P = s \sum_{t<P} u_t c^{P-1-t}` on a lattice of
    ``s / k`` (about _Z_PER_SHIFT cells per mean shift): the last H steps by a recursion rounding
    ``c z`` up, the older ones bounded by their worst case (every step used),
    :math:`c^H s / (1 - c)`, added up front.
    Returns (law, unit)."""
    mean = q / (1.0 - c) if c < 1.0 else q * horizon  # in shifts s
    spread = math.sqrt(q / (1.0 - c * c)) if c < 1.0 else math.sqrt(q * horizon)
    per_shift = max(1, round(_Z_PER_SHIFT / max(1.0, mean)))  # cells per shift: about _Z_PER_SHIFT per mean
    unit = step_mu / per_shift
    cells = int(per_shift * (mean + 40.0 * spread + 40.0)) + 1
    old = (c**horizon) * step_mu / (1.0 - c) if older else 0.0
    law = np.zeros(cells)
    start = int(_ceil_index(old, unit))
    if start >= cells:
        return law, unit  # all mass above the lattice: mu = inf
    law[start] = 1.0
    contracted = np.ceil(c * np.arange(cells) * (1.0 + 1e-12)).astype(np.int64)  # c z rounded up, in cells
    for _ in range(horizon):
        moved = np.bincount(contracted, weights=law, minlength=cells)[:cells]
        used = np.zeros(cells)
        used[per_shift:] = moved[: cells - per_shift]
        law = (1.0 - q) * moved + q * used
    return law, unit


def layout_mixture(
    layout: Layout, *, step_mu: float, contraction: float, use_probability: float, cells: int = _FINE_CELLS
):
    """(weights, mus) of the mixture for one layout (module docstring), on lattices of ``cells``
    cells; weights sum to 1, the mass the lattices leave out as a component with mu = inf.

    Every term of (2) is s times a term that does not depend on s, so the law is computed once
    for s = 1 (cached on the layout, c, q and the lattice) and its mus are multiplied by s."""
    weights, nus = _unit_mixture(layout, float(contraction), float(use_probability), int(cells))
    with np.errstate(over="ignore"):
        return weights, nus * float(step_mu)


@functools.lru_cache(maxsize=512)
def _unit_mixture(layout: Layout, c: float, q: float, cells: int) -> tuple[np.ndarray, np.ndarray]:
    s = 1.0
    # the mu^2 lattice reaches 8x the uniform-density cost (over the steps a shift survives) plus a
    # few uses at the end; four times further while more than _LEFT_OUT of the mass falls beyond
    horizon = layout.steps if c == 1.0 else min(layout.steps, 1.0 / (1.0 - c))
    reach = 8.0 * s * s * (q * q * horizon + 4.0 * q + 1.0)
    for _ in range(4):
        weights, mus, beyond = _layout_mixture(layout, s, c, q, cells, reach)
        if beyond <= _LEFT_OUT:
            break
        reach *= 4.0
    weights.setflags(write=False)
    mus.setflags(write=False)
    return weights, mus


def _layout_mixture(layout: Layout, s: float, c: float, q: float, cells: int, reach2: float):
    window = layout.window
    first, last = layout.first_block, layout.last_block
    unit2 = reach2 / cells
    total = np.zeros(cells)
    total[0] = 1.0
    # window residual: the last block's uses, or the prefix's shift without blocks
    residual_values, residual_probs = np.zeros(1), np.ones(1)
    lost = 0.0  # mass the laws of the parts leave out themselves (not the mu^2 lattice's cut)
    if layout.prefix > 0:
        z_law, z_unit = _prefix_shift_law(s, c, q, layout.prefix)
        lost += 1.0 - float(z_law.sum())
        z_values = np.arange(z_law.size) * z_unit
        if first is not None:
            cost = _drain_factor(c, first) * z_values**2
            total = _convolve(total, _onto_lattice(cost, z_law, unit2, cells), cells)
        else:
            residual_values, residual_probs = z_values, z_law
    for (m, nxt), count in layout.pairs().items():
        k, pk = _count_law(m, q)
        lost += count * (1.0 - float(pk.sum()))
        one = _onto_lattice(_drain_factor(c, nxt) * (s * k) ** 2, pk, unit2, cells)
        total = _convolve(total, _power(one, count, cells), cells)
    if last is not None:
        k, pk = _count_law(last, q)
        residual_values, residual_probs = s * k, pk
        lost += 1.0 - float(pk.sum())
    # the window, on a mu lattice: residual drained over the window, plus one term per step
    terms = [s * _use_mu(c, r) for r in range(window)]
    if window > 0:
        reach = float(np.max(residual_values)) * c**window / math.sqrt(_capacity(c, window)) + sum(terms)
    else:
        reach = 0.0
    unit = max(reach, s) * 1.5 / cells
    if window > 0:
        law = _onto_lattice(
            residual_values * (c**window / math.sqrt(_capacity(c, window))), residual_probs, unit, cells
        )
    else:
        law = _onto_lattice(np.zeros(1), np.ones(1), unit, cells)  # T = prefix + blocks: nothing left
    for term in terms:
        j = int(_ceil_index(term, unit))
        moved = np.zeros(cells)
        moved[j:] = law[: cells - j]
        law = (1.0 - q) * law + q * moved
    mu2 = (np.arange(cells) * unit) ** 2
    total = _convolve(total, _onto_lattice(mu2, law, unit2, cells), cells)
    total = np.maximum(total, 0.0)
    beyond = 1.0 - float(total.sum()) - lost  # (about) the mass the mu^2 lattice cut: decides a wider one
    finite = float(total.sum())
    keep = total > 0
    weights = total[keep]
    mus = np.sqrt(np.flatnonzero(keep) * unit2)
    if finite > 1.0:  # rounding in the sums only: the law's total mass is 1
        weights = weights / finite
        finite = 1.0
    return np.append(weights, 1.0 - finite), np.append(mus, math.inf), beyond


def candidate_layouts(
    *, steps: int, use_probability: float, contraction: float, window_sizes=(2, 4, 8)
) -> list[Layout]:
    """A few layouts worth trying (module docstring). Every layout gives a valid bound; these are
    chosen for tightness only: flat blocks of about sqrt(T/q) steps (the variance of a block's count
    against the delay of its payment), blocks shrinking by _SHRINK towards the window, and for
    a strong contraction a prefix left unpaid with a few blocks of about 1/(1 - c) steps."""
    q, c = use_probability, contraction
    out = []
    # at most _MAX_REPEAT equal blocks: each block's term is rounded up on the lattice once
    sizes = {max(1, round(math.sqrt(steps / q) * f), -(-steps // _MAX_REPEAT)) for f in (0.5, 1.0, 2.0)}
    if c < _STRONG:
        sizes |= {max(1, round(0.6 / (1.0 - c) * f)) for f in (0.5, 1.0)}
    for f in window_sizes:
        f = min(f, steps)
        if f == steps:
            out.append(Layout.of(0, (), steps))
            continue
        for m in sorted(sizes):
            tail, length = [], f
            while length < m:
                tail.append(length)
                length = math.ceil(length / _SHRINK)
            while tail and sum(tail) > steps - f:  # a short run: drop the largest tail blocks
                tail.pop()
            tail = tuple(tail[::-1])
            room = steps - f - sum(tail)
            full, first = divmod(room, m)
            if full <= _MAX_REPEAT:
                out.append(Layout(0, (first,) if first else (), m, full, tail, f))
            if c < _STRONG:
                out.extend(Layout(room - keep * m, (), m, keep, tail, f) for keep in (1, 3) if keep < full)
    return [lay for lay in dict.fromkeys(out) if lay.steps == steps]


@functools.lru_cache(maxsize=256)
def membership_profile(
    *, step_mu: float, contraction: float, use_probability: float, steps: int, extra_mass: float = 0.0
) -> profiles.GaussianMixtureProfile:
    r"""The privacy profile of the last iterate under independent per-step memberships.

    Args:
      step_mu: s, the shift of one use in per-step noise stds (2/z replace-one, 1/z add-or-remove).
      contraction: c in [0, 1], valid at every step (on the event the caller conditions on).
      use_probability: q, the probability that the differing record joins a step.
      steps: T.
      extra_mass: the probability of an event of the schedule, independent of the memberships,
        outside which ``contraction`` may fail (section 19, part 4); it gets mu = inf.

    Returns:
      A mixture profile: the best of :func:`candidate_layouts` at :data:`REFERENCE_DELTA`
      (every layout is valid; ranked on coarse lattices, the best few recomputed on fine ones).
      Cached on every argument.
    """
    s, c, q = float(step_mu), float(contraction), float(use_probability)
    if not (s >= 0 and 0.0 <= c <= 1.0 and 0.0 <= q <= 1.0 and steps >= 1 and 0.0 <= extra_mass <= 1.0):
        raise ValueError(
            f"need step_mu >= 0, contraction in [0, 1], use_probability in [0, 1], steps >= 1, extra_mass in "
            f"[0, 1]. Found {step_mu}, {contraction}, {use_probability}, {steps}, {extra_mass}."
        )
    c = max(c, 1e-12)
    if s == 0.0 or q == 0.0:
        return _with_extra(profiles.GaussianMixtureProfile.gaussian(0.0), extra_mass)
    if s < _TINY_SHIFT:  # every use paid over its own remaining steps, norm <= s each: mu <= s T (Minkowski)
        return _with_extra(profiles.GaussianMixtureProfile.gaussian(s * steps), extra_mass)
    if s > _HUGE_SHIFT:  # any use: mu = inf; none (probability (1-q)^T): mu = 0
        none = math.exp(steps * math.log1p(-q)) if q < 1.0 else 0.0
        return _with_extra(profiles.GaussianMixtureProfile.mixture([none, 1.0 - none], [0.0, math.inf]), extra_mass)

    def ranked(layouts, cells):
        out = []
        for lay in layouts:
            w, m = layout_mixture(lay, step_mu=s, contraction=c, use_probability=q, cells=cells)
            profile = _with_extra(profiles.GaussianMixtureProfile.mixture(w, m), extra_mass)
            out.append((profile.epsilon(REFERENCE_DELTA), len(out), lay, profile))
        return sorted(out, key=lambda x: x[:2])

    coarse = ranked(candidate_layouts(steps=steps, use_probability=q, contraction=c), _COARSE_CELLS)
    fine = _STRONG_FINE_CELLS if c < _STRONG else _FINE_CELLS
    return ranked([x[2] for x in coarse[:_FINE_LAYOUTS]], fine)[0][3]


def _with_extra(profile: profiles.GaussianMixtureProfile, extra_mass: float) -> profiles.GaussianMixtureProfile:
    r"""``(1 - p) profile + p`` (an event of probability p, independent of the memberships, with delta 1)."""
    if extra_mass == 0.0:
        return profile
    w = np.append(np.asarray(profile.weights) * (1.0 - extra_mass), extra_mass)
    return profiles.GaussianMixtureProfile.mixture(w, np.append(profile.mus, math.inf))


#: Shifts outside [_TINY_SHIFT, _HUGE_SHIFT] (noise std of 1e100 or 1e-100 clip norms) get the crude forms
#: of :func:`membership_profile` (the lattices' units would underflow or overflow).
_TINY_SHIFT = 1e-100
_HUGE_SHIFT = 1e100

#: Probability budget of the batch-size event of Poisson sampling (section 19, part 4) when it is set
#: by the tails alone: each tail gets half.
SIZE_EVENT_BUDGET = 1e-12


def step_contraction(
    r: float,
    *,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    batch_size: int,
    l2_outside_clip: bool,
) -> float:
    r"""Lipschitz constant of one step on a batch of r examples whose sum is divided by b: the step's
    objective has curvature in [lo, hi] and the step is max(|1 - eta lo|, |1 - eta hi|)-Lipschitz
    (Hardt, Recht & Singer 2016, Lemma 3.7). With the l2 term outside the clip (lam of it, the rest
    of M per example): lo = lam, hi = lam + (r/b)(M - lam). Otherwise any split of lam and M into
    per-example and per-step parts: lo = lam min(r/b, 1), hi = M max(r/b, 1) (a per-example part
    scales by r/b, a per-step part does not)."""
    eta, lam, m, ratio = learning_rate, strong_convexity, smoothness, r / batch_size
    if l2_outside_clip:
        lo, hi = lam, lam + ratio * (m - lam)
    else:
        lo, hi = lam * min(ratio, 1.0), m * max(ratio, 1.0)
    return max(abs(1.0 - eta * lo), abs(1.0 - eta * hi))


def _bisect(predicate, lo: int, hi: int, *, last_true: bool) -> int:
    """For a predicate monotone on [lo, hi] (true then false if ``last_true``, else false then
    true): the last integer where it is true, or the first (lo, hi when none)."""
    if last_true:
        if not predicate(lo):
            return lo
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if predicate(mid) else (lo, mid - 1)
        return lo
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if predicate(mid) else (mid + 1, hi)
    return lo


def poisson_size_events(
    *,
    dataset_size: int,
    batch_size: int,
    sampling_probability: float,
    steps: int,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    l2_outside_clip: bool,
) -> list[tuple[float, float]]:
    r"""Candidate (contraction, event probability) pairs for Poisson sampling (section 19, part 4).

    The event ``G``: at every step the number O_t of OTHER records in the batch lies in
    [r_lo, r_hi]. Then every batch either world runs has between r_lo and r_hi + 1 examples, and
    every step is c-Lipschitz with c the larger of the step's constants at r_lo and r_hi + 1 (each
    is a maximum of |1 - eta x| over a range of x linear in r: convex in r). ``G`` depends on the
    other records' memberships only, hence is independent of the differing record's, and
    ``P(not G) <= T (P(O < r_lo) + P(O > r_hi))`` with O ~ Binomial(n - 1, q - 1/n) for the lower
    tail and Binomial(n, q) for the upper (either world's count of the others is one of these, for
    any true rate in (q - 1/n, q]: the adapters round the rate up to b/n, and a higher rate only
    raises the rest of the bound).

    r_lo: the lower tail quantile at SIZE_EVENT_BUDGET / (2T). r_hi: the upper quantile, or smaller
    values that keep the contraction at its value for the expected batch (a larger event
    probability against a stronger contraction; every pair is valid), never below b. Pairs with
    c > 1 are left out (none left: the step expands at b + 1 examples).
    """
    n, q, t = dataset_size, sampling_probability, steps
    q_low = max(q - 1.0 / n, 0.0)  # the lower tail also for a true rate up to 1/n below q (adapters round q up)
    half = SIZE_EVENT_BUDGET / (2.0 * t)
    # r_lo: the largest r with P(O < r) <= half; r_q: the smallest r with P(O > r) <= half
    r_lo = _bisect(lambda r: stats.binom.cdf(r - 1, n - 1, q_low) <= half, 0, n, last_true=True)
    r_q = _bisect(lambda r: stats.binom.sf(r, n, q) <= half, 0, n, last_true=False)
    step = functools.partial(
        step_contraction,
        learning_rate=learning_rate,
        strong_convexity=strong_convexity,
        smoothness=smoothness,
        batch_size=batch_size,
        l2_outside_clip=l2_outside_clip,
    )
    central = max(step(r_lo), step(batch_size + 1))
    candidates = {r_q}
    for target in (central, 1.0):  # the largest r_hi <= r_q keeping c at most the target
        r = r_q
        while r > batch_size and step(r + 1) > target:  # never below b: the range must hold b + 1
            r -= 1
        candidates.add(r)
    out = []
    low_tail = float(stats.binom.cdf(r_lo - 1, n - 1, q_low)) if r_lo > 0 else 0.0
    for r_hi in sorted(candidates):
        c = max(step(r_lo), step(r_hi + 1))
        if c > 1.0 or r_hi < r_lo:
            continue
        mass = min(1.0, t * (low_tail + float(stats.binom.sf(r_hi, n, q))) * (1.0 + 1e-6))
        out.append((c, mass))
    return out


def poisson_profile(
    *,
    step_mu: float,
    dataset_size: int,
    batch_size: int,
    sampling_probability: float,
    steps: int,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    l2_outside_clip: bool,
) -> profiles.GaussianMixtureProfile:
    """The Poisson profile: :func:`membership_profile` under each event of
    :func:`poisson_size_events`, the best at REFERENCE_DELTA (each is valid).

    Raises:
      ValueError: no batch-size range keeps the step non-expansive (c <= 1).
    """
    events = poisson_size_events(
        dataset_size=dataset_size,
        batch_size=batch_size,
        sampling_probability=sampling_probability,
        steps=steps,
        learning_rate=learning_rate,
        strong_convexity=strong_convexity,
        smoothness=smoothness,
        l2_outside_clip=l2_outside_clip,
    )
    if not events:
        raise ValueError("no range of batch sizes around the expected one keeps the step non-expansive (c <= 1).")
    candidates = [
        membership_profile(
            step_mu=step_mu, contraction=c, use_probability=sampling_probability, steps=steps, extra_mass=mass
        )
        for c, mass in events
    ]
    return min(candidates, key=lambda p: p.epsilon(REFERENCE_DELTA))
