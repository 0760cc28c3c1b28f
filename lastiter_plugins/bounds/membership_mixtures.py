r"""Schedule mixtures for independent memberships: random batches and Poisson sampling.

docs/derivations/random-batch.md#random-batch-poisson. The differing record joins step t with probability q,
independently across steps and of the data, in both neighbouring worlds (fixed-size
random batches: q = b/n; Poisson sampling: q the sampling rate). Given the memberships
``u`` the run is noisy gradient descent with a fixed schedule, so by Theorem A
(docs/derivations/shifted-interpolation.md#shifted-interpolation) the last iterates are :math:`\mu(u)`-GDP for every
feasible shift
allocation, and by joint convexity of the hockey-stick divergence
(docs/derivations/schedule-mixtures.md#sm-general-statement)

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
from scipy import optimize, special, stats

from lastiter_plugins import profiles
from lastiter_plugins.bounds._common import step_contraction
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.bounds.shifted_interpolation import replace_one_step_mu
from lastiter_plugins.config import LossAssumptions, TrainingConfig

#: Cells of the mu^2 lattice: every layout is ranked on the coarse lattice (:func:`_ranking_mixture`), the
#: best is computed on the fine one (ending where the coarse law ends).
_COARSE_CELLS = 1000
_FINE_CELLS = 8000
#: Below this contraction a prefix left unpaid pays off (candidate_layouts).
_STRONG = 0.999
#: Cells of the final window's mu lattice.
_WINDOW_CELLS = 8000
#: A lattice is extended while more than this mass falls beyond it (that mass gets mu = inf).
_LEFT_OUT = 1e-10
#: Cells per shift s of the prefix's shift lattice.
_Z_PER_SHIFT = 1000
#: The layout is chosen at this delta (every layout is a valid bound: the choice only affects tightness).
REFERENCE_DELTA = 1e-5
#: Two laws whose sizes multiply to at most _DIRECT_PRODUCT are convolved directly; otherwise the atoms
#: above _HEAVY (all atoms of a law with at most _SPARSE_ATOMS) one by one and the rest by FFT, with the
#: FFT's error bound times _FFT_MARGIN subtracted (:func:`_convolve`).
_DIRECT_PRODUCT = 1 << 20
_SPARSE_ATOMS = 64
_HEAVY = 1e-2
_FFT_MARGIN = 2.0
#: Single parts are merged into the exact law of their sum while it has at most this many atoms.
_MERGED_ATOMS = 4096
#: A layout repeats a block at most this often (every block's term is rounded up once).
_MAX_REPEAT = 64
#: A strong contraction over at most this many times 1/(1 - c) steps also gets flat layouts.
_SHORT_RUN = 20.0
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


def _ceil_index(values: np.ndarray | float, unit: float) -> np.ndarray:
    """Lattice index of each value, rounded up (a relative 1e-12 upward guard against rounding)."""
    return np.ceil(np.asarray(values, dtype=float) * (1.0 + 1e-12) / unit).astype(np.int64)


def _onto_lattice(values: np.ndarray, probs: np.ndarray, unit: float, cells: int) -> np.ndarray:
    """The law of ``values`` (with ``probs``) on the lattice ``unit * j``, j < cells, rounded up;
    mass above the lattice is left out (the caller counts it as mu = inf)."""
    idx = _ceil_index(values, unit)
    keep = idx < cells
    return np.bincount(idx[keep], weights=np.asarray(probs, dtype=float)[keep], minlength=cells)[:cells]


def _convolve(a: np.ndarray, b: np.ndarray, cells: int) -> tuple[np.ndarray, float]:
    """Law of the sum of two independent lattice variables, truncated to ``cells`` and never above
    the exact one (the caller counts the mass it lacks as mu = inf), and the mass the truncation
    cut off (only to decide whether a wider lattice is worth computing).

    Small laws are convolved directly. Otherwise the atoms above _HEAVY of either law (all atoms
    of a law with at most _SPARSE_ATOMS) are added one by one, exactly (sums of non-negative
    terms), and the rest by FFT less the FFT's error bound (:func:`fft_error`), which is
    proportional to the norms of the light parts: small."""
    mass = float(a.sum()) * float(b.sum())
    atoms_a, atoms_b = np.flatnonzero(a), np.flatnonzero(b)
    if not (atoms_a.size and atoms_b.size):
        return np.zeros(1), mass
    a, b = a[: atoms_a[-1] + 1], b[: atoms_b[-1] + 1]  # the zeros above the last atoms add nothing
    if a.size * b.size <= _DIRECT_PRODUCT:
        out = np.convolve(a, b)[:cells]
        return out, max(mass - float(out.sum()), 0.0)
    out = np.zeros(min(cells, a.size + b.size - 1))

    def add_atoms(law, atoms, other):  # out += sum over the atoms j of law[j] * (other shifted by j)
        for j in atoms[atoms < out.size]:
            width = min(other.size, out.size - j)
            out[j : j + width] += law[j] * other[:width]

    light: list[np.ndarray] = []
    for law, other, atoms in ((b, a, atoms_b), (a, None, atoms_a)):
        heavy = atoms if atoms.size <= _SPARSE_ATOMS else atoms[law[atoms] > _HEAVY]
        if other is None:  # a's heavy atoms against b's light part
            other = light[0]
        add_atoms(law, heavy, other)
        rest = law.copy()
        rest[heavy] = 0.0
        light.append(rest)
        if not rest.any():
            return out, max(mass - float(out.sum()), 0.0)
    b_light, a_light = light
    size = 1 << (a.size + b.size - 2).bit_length()  # a power of two >= a.size + b.size - 1
    fft = np.fft.irfft(np.fft.rfft(a_light, size) * np.fft.rfft(b_light, size), size)[: out.size]
    cut = max(mass - float(out.sum()) - float(fft.sum()), 0.0)
    out += np.maximum(fft - fft_error(size) * np.linalg.norm(a_light) * np.linalg.norm(b_light), 0.0)
    return out, cut


def fft_error(size: int) -> float:
    r"""A bound on :math:`\max_j |\hat z_j - z_j| / (\|a\|_2 \|b\|_2)` for the convolution
    :math:`z = a * b` computed by FFTs of length ``size`` = 2^k in double precision: Percival
    (2003, Math. Comp. 72, Theorem 5.1), :math:`(1+\epsilon)^{3k}(1+\epsilon\sqrt5)^{3k+1}
    (1+\beta)^{3k} - 1` with :math:`\epsilon = 2^{-53}` and twiddle factors within
    :math:`\beta = 2\epsilon`, times _FFT_MARGIN for an FFT that is not exactly the radix-2 one analysed
    (numpy's pocketfft; tests/core/bounds/test_membership_mixtures.py checks the bound against direct sums).
    Subtracting it from every entry leaves each entry below the exact one
    (docs/derivations/random-batch.md#random-batch-poisson)."""
    k = size.bit_length() - 1
    eps = 2.0**-53
    beta = 2.0 * eps
    exponent = 3 * k * math.log1p(eps) + (3 * k + 1) * math.log1p(eps * math.sqrt(5.0)) + 3 * k * math.log1p(beta)
    return _FFT_MARGIN * math.expm1(exponent)


def _power(law: np.ndarray, count: int, cells: int) -> tuple[np.ndarray, float]:
    """Law of the sum of ``count`` independent copies, by repeated squaring, truncated to ``cells``
    (a partial sum above the cap only grows: the mass left out is that of totals above the cap),
    and the mass cut off (see :func:`_convolve`)."""
    result = None  # the law of no copy: all mass at 0
    base = law[:cells]
    cut = 0.0
    while count:
        if count & 1:
            if result is None:
                result = base
            else:
                result, lost = _convolve(result, base, cells)
                cut += lost
        count >>= 1
        if count:
            base, lost = _convolve(base, base, cells)
            cut += lost
    if result is None:  # count = 0
        result = np.zeros(cells)
        result[0] = 1.0
    return result, cut


def _count_laws(runs: tuple[int, ...], q: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each n in ``runs``: Binomial(n, q) counts within 12 standard deviations (and 40) of the
    mean, with their probabilities; the mass below is moved up to the lowest count kept (a larger
    count only raises the cost), the mass above is left out (the caller gives it mu = inf). One
    call of scipy.stats for all of them (each call costs about 0.1 ms)."""
    if not runs:
        return []
    n = np.asarray(runs, dtype=np.int64)
    mean = n * q
    spread = 12.0 * np.sqrt(mean * (1.0 - q)) + 40.0
    lo = np.maximum(0, np.floor(mean - spread)).astype(np.int64)
    top = np.minimum(n, np.ceil(mean + spread)).astype(np.int64)
    sizes = top - lo + 1
    ends = np.cumsum(sizes)
    k = np.arange(int(ends[-1])) - np.repeat(ends - sizes - lo, sizes)  # lo_i, ..., top_i for each i
    pk = stats.binom.pmf(k, np.repeat(n, sizes), q)
    below = np.zeros(n.size)
    cut = lo > 0
    if cut.any():
        below[cut] = stats.binom.cdf(lo[cut] - 1, n[cut], q)
    out = []
    for i, (first, end) in enumerate(zip((ends - sizes).tolist(), ends.tolist(), strict=True)):
        counts, probs = k[first:end], pk[first:end]
        probs[0] += below[i]
        out.append((counts, probs))
    return out


def _prefix_shift_law(step_mu: float, c: float, q: float, steps: int) -> tuple[np.ndarray, float]:
    """See :func:`_prefix_shift_law_horizon`; prefixes longer than the horizon share one law."""
    horizon = steps
    if c < 1.0:  # older uses add at most c^H s / (1 - c) <= one lattice cell
        horizon = min(steps, math.ceil(math.log((1.0 - c) / _Z_PER_SHIFT) / math.log(c)))
    return _prefix_shift_law_horizon(step_mu, c, q, horizon, horizon < steps)


def _old_shifts(c: float, horizon: int, older: bool) -> float:
    """Worst case, in shifts, of the uses older than the horizon: every step used."""
    return (c**horizon) / (1.0 - c) if older else 0.0


#: The fractional parts are rounded up to multiples of 1 / _FRACTION_BINS for their Chernoff bound.
_FRACTION_BINS = 1024


def _fraction_bound(fractions: np.ndarray, q: float) -> float:
    r"""A value F* with :math:`P(\sum_j u_j f_j > F^*) \le` _LEFT_OUT / 10 for independent
    :math:`u_j \sim` Bernoulli(q) and the given :math:`f_j \in [0, 1)`: the smaller of the largest
    value :math:`\sum_j f_j` and Chernoff's bound for the larger sum with every :math:`f_j` rounded up to
    a multiple of 1 / _FRACTION_BINS (a few hundred distinct values instead of one per age), minimised
    over theta on a grid refined around its best point (each theta gives a valid bound)."""
    largest = float(fractions.sum())
    if q >= 1.0 or largest == 0.0:
        return largest
    bins = np.bincount(np.ceil(fractions * _FRACTION_BINS).astype(np.int64), minlength=_FRACTION_BINS + 1)
    held = np.flatnonzero(bins)
    values, counts = held / _FRACTION_BINS, bins[held].astype(float)
    log_left = math.log(_LEFT_OUT / 10.0)

    def bound(thetas):
        log_mgf = np.logaddexp(math.log1p(-q), math.log(q) + thetas[:, None] * values[None, :]) @ counts
        return (log_mgf - log_left) / thetas

    grid = np.geomspace(1e-3, 1e3, 25) / max(q * largest, 1.0)
    at_grid = bound(grid)
    best = int(np.argmin(at_grid))
    fine = np.geomspace(grid[max(best - 1, 0)], grid[min(best + 1, grid.size - 1)], 17)
    return min(largest, float(at_grid.min()), float(bound(fine).min()))


@functools.lru_cache(maxsize=64)
def _prefix_shift_law_horizon(
    step_mu: float, c: float, q: float, horizon: int, older: bool
) -> tuple[np.ndarray, float]:
    r"""Law of (an upper bound on) :math:`z_P = s \sum_{j<P} u_j c^j` (j: the age of a use) on a
    lattice of ``s / k`` (about _Z_PER_SHIFT cells per mean shift), the ages older than the horizon H
    at their worst case (every step used), :math:`c^H s / (1 - c)`, added up front. Two ways to put the
    term :math:`t_j = k c^j` (in cells) of each of the last H ages on the lattice
    (docs/derivations/random-batch.md#rb-exact-law), the one with the smaller expected excess is used:

    * rounded up: each age contributes :math:`\lceil t_j \rceil` (pathwise at most one cell more per
      use);
    * split: :math:`\lfloor t_j \rfloor` on the lattice, and the fractional parts :math:`f_j` of the
      used ages together bounded by one number F* exceeded with probability at most _LEFT_OUT / 10
      (:func:`_fraction_bound`), added up front; that probability is taken from the lowest values of
      the law (it joins the missing mass, mu = inf). The excess is F* less the actual fractional sum,
      about 7 standard deviations of that sum instead of a cell per use: far smaller when many ages
      are used (q/(1 - c) large); 0 at q = 1.

    A run of ages with the same lattice term adds that term times a Binomial count (the count's lower
    tail moved up to its lowest kept value, its upper tail left out). The lattice ends where a
    Chernoff bound leaves at most _LEFT_OUT / 10 above it (that mass, and the Binomial tails the counts
    leave out, are missing from the law: mu = inf). Returns (law, unit)."""
    mean = q / (1.0 - c) if c < 1.0 else q * horizon  # in shifts s
    per_shift = max(1, round(_Z_PER_SHIFT / max(1.0, mean)))  # cells per shift: about _Z_PER_SHIFT per mean
    unit = step_mu / per_shift
    exact = c ** np.arange(horizon, dtype=float) * per_shift  # s c^j in cells
    up = _ceil_index(exact, 1.0)
    down = np.floor(exact).astype(np.int64)
    fractions = exact - down
    split_bound = _fraction_bound(fractions, q)
    split = split_bound - q * float(fractions.sum()) < q * float((up - exact).sum())
    terms, front = (down, split_bound) if split else (up, 0.0)
    values, runs = np.unique(terms, return_counts=True)  # runs of equal terms (terms decrease with the age)
    if values[0] == 0:  # a term of 0 cells adds nothing
        values, runs = values[1:], runs[1:]
    if split:  # the terms are floating-point values of k c^j: a relative 1e-12 of their sum covers their rounding
        front += 1e-12 * float(exact.sum())
    start = int(_ceil_index(_old_shifts(c, horizon, older) * per_shift + front, 1.0))
    cap = _chernoff_cap(values.astype(float), runs.astype(float), q) if values.size else 0
    law = np.zeros(start + cap + 1)
    law[start] = 1.0
    end = start + 1  # law is 0 from end on (the small terms come first: the sum's range grows slowly)
    for value, (k, pk) in zip(values.tolist(), _count_laws(tuple(runs.tolist()), q), strict=True):
        law, end = _plus_multiples(law, end, value, k, pk)
    if split and q < 1.0:  # P(fractional sum > F*) joins the missing mass, taken from the lowest values
        law = without_lowest(law, _LEFT_OUT / 10.0)
    return law, unit


def without_lowest(law: np.ndarray, mass: float) -> np.ndarray:
    """The law with ``mass`` removed from its lowest values (that mass then counts as mu = inf): for
    any event A of probability at most ``mass``, P(X > x) <= min(1, P(Y > x) + mass) is the survival
    function of this law when X <= Y outside A."""
    below = np.cumsum(law)
    out = law.copy()
    full = int(np.searchsorted(below, mass, side="right"))  # atoms 0..full-1 hold at most ``mass`` together
    out[:full] = 0.0
    if full < out.size:
        out[full] = below[full] - mass
    return out


def _plus_multiples(
    law: np.ndarray, end: int, value: int, counts: np.ndarray, probs: np.ndarray
) -> tuple[np.ndarray, int]:
    """The law of X + value * K on the lattice of ``law`` (X's law, 0 from ``end`` on), K independent
    with P(K = counts[i]) = probs[i], truncated to ``law.size`` cells (what is pushed beyond: mu = inf),
    and the index from which it is 0. Only the range where X's law can be positive is added (adding
    zeros would change no entry)."""
    cells = law.size
    shifts = counts * value
    inside = shifts < cells
    shifts, probs = shifts[inside].tolist(), probs[inside].tolist()
    top = min(cells, end + (shifts[-1] if shifts else 0))
    if shifts[:1] == [0]:  # the unshifted copy starts the sum (0 + x = x: the same numbers as adding it to zeros)
        out = probs[0] * law
        shifts, probs = shifts[1:], probs[1:]
    else:
        out = np.zeros(cells)
    for shift, p in zip(shifts, probs, strict=True):
        width = min(end, cells - shift)
        out[shift : shift + width] += p * law[:width]
    return out, top


def _chernoff_cap(values: np.ndarray, runs: np.ndarray, q: float) -> int:
    """An integer V with P(sum over groups of value * Binomial(run, q) > V) <= _LEFT_OUT / 10,
    by Chernoff's bound on a grid of theta."""
    mean = float(values @ runs) * q
    thetas = np.geomspace(1e-3, 1e3, 60) / max(mean, float(values.max()), 1.0)
    log_mgf = (
        np.logaddexp(math.log1p(-q), math.log(q) + thetas[:, None] * values[None, :]) @ runs
        if q < 1.0
        else (thetas * float(values @ runs))
    )
    cap = float(np.min((log_mgf - math.log(_LEFT_OUT / 10.0)) / thetas))
    return int(min(math.ceil(cap), float(values @ runs))) + 1


def layout_mixture(
    layout: Layout,
    *,
    step_mu: float,
    contraction: float,
    use_probability: float,
    cells: int = _FINE_CELLS,
    reach2: float | None = None,
):
    """(weights, mus) of the mixture for one layout (module docstring), on lattices of ``cells``
    cells; weights sum to 1, the mass the lattices leave out as a component with mu = inf.

    ``reach2``: where the mu^2 lattice ends, for s = 1 (None: a rough guess, widened while it cuts
    off more than _LEFT_OUT). Every term of (2) is s times a term that does not depend on s, so the
    law is computed once for s = 1 (cached on every argument) and its mus are multiplied by s."""
    weights, nus = _unit_mixture(layout, float(contraction), float(use_probability), int(cells), reach2)
    with np.errstate(over="ignore"):
        return weights, nus * float(step_mu)


@functools.lru_cache(maxsize=512)
def _unit_mixture(
    layout: Layout, c: float, q: float, cells: int, reach2: float | None
) -> tuple[np.ndarray, np.ndarray]:
    if reach2 is None:
        reach2 = _reach_guess(_parts(layout, c, q), cells)
    for _ in range(4):  # four times further while more than _LEFT_OUT of the mass falls beyond
        weights, mus, beyond = _layout_mixture(layout, c, q, cells, reach2)
        if beyond <= _LEFT_OUT:
            break
        reach2 *= 4.0
    weights.setflags(write=False)
    mus.setflags(write=False)
    return weights, mus


@functools.lru_cache(maxsize=64)
def _ranking_mixture(layout: Layout, c: float, q: float) -> tuple[np.ndarray, np.ndarray]:
    """An estimate of :func:`_unit_mixture` on the coarse lattice, to rank layouts and place the fine
    lattice's end only (it is not a bound: every layout is valid, and the fine lattice is widened while it
    cuts off more than _LEFT_OUT). The parts' laws are multiplied in the Fourier domain: one transform per
    part, a power for a repeated block, one inverse; totals beyond twice the lattice (probability far below
    _LEFT_OUT) wrap around, and rounding leaves errors of order 1e-16."""
    parts = _parts(layout, c, q)
    cells, size = _COARSE_CELLS, 1 << (2 * _COARSE_CELLS - 1).bit_length()  # a power of two >= 2 cells
    held = math.prod(float(probs.sum()) ** count for _, probs, count in parts)  # the parts' own missing mass aside
    reach2 = _reach_guess(parts, cells)
    for _ in range(4):  # four times further while more than _LEFT_OUT of the mass falls beyond
        unit2 = reach2 / cells
        spectrum = np.ones(size // 2 + 1, dtype=complex)
        for values, probs, count in parts:
            spectrum *= np.fft.rfft(_onto_lattice(values, probs, unit2, size), size) ** count
        total = np.maximum(np.fft.irfft(spectrum, size)[:cells], 0.0)
        if held - float(total.sum()) <= _LEFT_OUT:
            break
        reach2 *= 4.0
    keep = total > 0
    weights = np.append(total[keep], max(1.0 - float(total.sum()), 0.0))
    return weights, np.append(np.sqrt(np.flatnonzero(keep) * unit2), math.inf)


def _rough_delta(weights: np.ndarray, nus: np.ndarray, s: float, eps: float) -> float:
    r"""The delta at ``eps`` of the mixture with mus ``s * nus``, by the profile's formula
    :math:`\Phi(-\varepsilon/\mu + \mu/2) - e^\varepsilon\Phi(-\varepsilon/\mu - \mu/2)` summed directly: rounding
    errors of about 1e-16 per component, far below the deltas compared. To rank layouts only (the reported
    numbers come from :mod:`lastiter_plugins.profiles`)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        mus = nus * s
        live = (mus > 0) & np.isfinite(mus)
        mu = mus[live]
        a = -eps / mu + mu / 2.0
        if eps < 700.0:  # e^eps Phi(a - mu) without overflow
            terms = special.ndtr(a) - math.exp(eps) * special.ndtr(a - mu)
        else:
            terms = special.ndtr(a) - np.exp(eps + special.log_ndtr(a - mu))
    return float(weights[live] @ np.maximum(terms, 0.0)) + float(weights[np.isinf(mus)].sum())


def _rough_epsilon(weights: np.ndarray, nus: np.ndarray, s: float, delta: float) -> float:
    """An epsilon where :func:`_rough_delta` is about ``delta`` (to a relative 1e-4): where the layouts are
    compared. Any epsilon would give valid bounds; this one makes the comparison about the deltas that matter."""
    target = math.log(delta)

    def excess(eps: float) -> float:  # decreasing in eps
        return math.log(max(_rough_delta(weights, nus, s, eps), 1e-300)) - target

    if excess(0.0) <= 0.0:
        return 0.0
    lo, hi = 0.0, 1.0
    while excess(hi) > 0.0:  # the root lies in (lo, hi] once this stops
        if hi >= 1e6:
            return hi
        lo, hi = hi, 4.0 * hi
    return float(optimize.brentq(excess, lo, hi, rtol=1e-4))


def _reach_of(weights: np.ndarray, mus: np.ndarray) -> float:
    """The smallest finite mu^2 of a mixture above which at most _LEFT_OUT / 2 of its finite mass
    lies, widened by 2% (where a finer lattice of the same layout can end: it rounds up less)."""
    finite = np.isfinite(mus)
    above = np.cumsum(weights[finite][::-1])[::-1]  # mass at or above each mu
    index = int(np.searchsorted(-above, -_LEFT_OUT / 2.0))  # first mu with at most that much at or above
    top = mus[finite][min(index, int(finite.sum()) - 1)]
    return 1.02 * float(top) ** 2


def _layout_mixture(layout: Layout, c: float, q: float, cells: int, reach2: float):
    """The law of (2) on the mu^2 lattice ``reach2 / cells * j`` for s = 1: (weights, mus, mass
    beyond the lattice), the mass left out (by the parts or beyond the lattice) as mu = inf."""
    parts = _parts(layout, c, q)
    unit2 = reach2 / cells
    total: np.ndarray | None = None  # the law of the empty sum: all mass at 0
    beyond = 0.0  # (about) the mass the mu^2 lattice cut: decides a wider one
    for values, probs, count in parts:
        law = _onto_lattice(values, probs, unit2, cells)
        beyond += float(probs.sum()) - float(law.sum())
        law, cut = _power(law, count, cells)
        beyond += cut
        if total is None:
            total = law
        else:
            total, cut = _convolve(total, law, cells)
            beyond += cut
    if total is None:  # a defect of ours: every layout has a part
        raise RuntimeError("internal error: a layout without parts")
    total = np.maximum(total, 0.0)
    finite = float(total.sum())
    keep = total > 0
    weights = total[keep]
    mus = np.sqrt(np.flatnonzero(keep) * unit2)
    if finite > 1.0:  # rounding in the sums only: the law's total mass is 1
        weights = weights / finite
        finite = 1.0
    return np.append(weights, 1.0 - finite), np.append(mus, math.inf), beyond


@functools.lru_cache(maxsize=512)
def _parts(layout: Layout, c: float, q: float) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """The independent terms of (2) for s = 1, each as (values, probabilities, how many iid copies;
    the mass a part's law leaves out is mu = inf): the prefix's drained shift, one term per
    (block, next block) pair, and the final window's mu^2 (its law on a mu lattice of
    _WINDOW_CELLS cells, rounded up)."""
    if layout.window < 1:  # the last block's (or the prefix's) shift is paid in the window
        raise ValueError(f"a layout ends with a window of at least one step. Found {layout}.")
    first, last = layout.first_block, layout.last_block
    parts = []
    residual_values, residual_probs = np.zeros(1), np.ones(1)  # the window's residual shift
    if layout.prefix > 0:
        z_law, z_unit = _prefix_shift_law(1.0, c, q, layout.prefix)
        z_values = np.arange(z_law.size) * z_unit
        if first is not None:
            parts.append((_drain_factor(c, first) * z_values**2, z_law, 1))
        else:
            residual_values, residual_probs = z_values, z_law
    pairs = layout.pairs()
    lengths = sorted({m for m, _ in pairs} | ({last} if last is not None else set()))
    counts = dict(zip(lengths, _count_laws(tuple(lengths), q), strict=True))
    for (m, nxt), count in pairs.items():
        k, pk = counts[m]
        parts.append((_drain_factor(c, nxt) * k.astype(float) ** 2, pk, count))
    if last is not None:
        k, pk = counts[last]
        residual_values, residual_probs = k.astype(float), pk
    # the window, on a mu lattice: the residual drained over the window, plus one term per step
    window = layout.window
    drained = c**window / math.sqrt(_capacity(c, window))
    terms = [_use_mu(c, r) for r in range(window)]
    unit = max(float(np.max(residual_values)) * drained + sum(terms), 1.0) * 1.5 / _WINDOW_CELLS
    law = _onto_lattice(residual_values * drained, residual_probs, unit, _WINDOW_CELLS)
    for term in terms:  # law <- (1 - q) law + q (law shifted by the term), pushed beyond the lattice: mu = inf
        j = int(_ceil_index(term, unit))
        moved = (1.0 - q) * law
        moved[j:] += q * law[: _WINDOW_CELLS - j]
        law = moved
    atoms = np.flatnonzero(law)
    parts.append(((atoms * unit) ** 2, law[atoms], 1))
    return _merge_small(parts)


def _merge_small(parts):
    """Single parts (one copy each) with few atoms replaced by the exact law of their sum, as long
    as it has at most _MERGED_ATOMS atoms: fewer convolutions, and one rounding up instead of one
    per part."""
    single = sorted((p for p in parts if p[2] == 1), key=lambda p: p[0].size)
    out = [p for p in parts if p[2] != 1]
    values, probs = np.zeros(1), np.ones(1)
    for v, p, _ in single:
        keep = p > 0
        v, p = v[keep], p[keep]
        if values.size * v.size > _MERGED_ATOMS:
            out.append((v, p, 1))
            continue
        values = (values[:, None] + v[None, :]).ravel()
        probs = (probs[:, None] * p[None, :]).ravel()
    out.append((values, probs, 1))
    return out


#: The thetas of :func:`_reach_guess` (times 1 / scale), and those it tries first: every 4th, and the last.
_THETAS = np.geomspace(1e-2, 1e4, 40)
_COARSE_THETAS = np.append(np.arange(0, _THETAS.size, 4), _THETAS.size - 1)


def _reach_guess(parts, cells: int) -> float:
    """Where the mu^2 lattice should end: a Chernoff bound on the sum of the parts, exceeded with
    probability at most _LEFT_OUT / 4 (P(X > x) <= E e^(theta X) / e^(theta x), minimised over a
    grid of theta), widened by one cell per part for the rounding up. Only speed and tightness
    depend on it: mass beyond the lattice becomes mu = inf, and the caller widens a lattice that
    cuts off more than _LEFT_OUT."""
    mean = sum(count * float(values @ probs) for values, probs, count in parts)
    scale = max(mean, max(float(values.max()) for values, _, _ in parts), 1e-300)
    value_parts: list[np.ndarray] = []
    log_parts: list[np.ndarray] = []
    count_parts: list[float] = []
    for v, p, count in parts:
        keep = p > 0
        v, p = v[keep], p[keep]
        if v.size > 256 and v.max() > 0:  # each value rounded up onto 256 bins: only raises the bound
            top = float(v.max())
            bins = np.minimum(np.ceil(v / top * 256.0), 256.0)
            p = np.bincount(bins.astype(np.int64), weights=p, minlength=257)
            v = np.arange(257) * (top / 256.0)
            v, p = v[p > 0], p[p > 0]
        value_parts.append(v)
        log_parts.append(np.log(p))
        count_parts.append(count)
    sizes = [v.size for v in value_parts]
    starts = np.cumsum([0, *sizes[:-1]])
    values, logs = np.concatenate(value_parts), np.concatenate(log_parts)
    counts = np.asarray(count_parts, dtype=float)

    def bound(thetas):  # (log E e^(theta X) - log(_LEFT_OUT / 4)) / theta, each part's log-sum-exp by reduceat
        terms = thetas[:, None] * values[None, :] + logs[None, :]
        top = np.maximum.reduceat(terms, starts, axis=1)
        sums = np.add.reduceat(np.exp(terms - np.repeat(top, sizes, axis=1)), starts, axis=1)
        return ((top + np.log(sums)) @ counts - math.log(_LEFT_OUT / 4.0)) / thetas

    # the bound is unimodal in theta (its derivative has the sign of theta L'(theta) - L(theta) - log(4 /
    # _LEFT_OUT), nondecreasing as L = log E e^(theta X) is convex): its minimum over the 40 thetas of the
    # grid lies within 3 of the best of every 4th
    grid = _THETAS / scale
    at_coarse = bound(grid[_COARSE_THETAS])
    best = int(_COARSE_THETAS[np.argmin(at_coarse)])
    near = [i for i in range(max(0, best - 3), min(grid.size, best + 4)) if i % 4 and i != grid.size - 1]
    reach = min(float(at_coarse.min()), float(bound(grid[near]).min()) if near else math.inf)
    return reach * (1.0 + len(parts) / cells) + 1e-300


def candidate_layouts(
    *, steps: int, use_probability: float, contraction: float, window_sizes=(2, 4, 8)
) -> list[Layout]:
    """A few layouts worth trying (module docstring). Every layout gives a valid bound; these are
    chosen for tightness only: flat blocks of about sqrt(T/q) steps (the variance of a block's count
    against the delay of its payment), blocks shrinking by _SHRINK towards the window, and for
    a strong contraction a prefix left unpaid with one block of about 1/(1 - c) steps. A run much
    longer than 1/(1 - c) under a strong contraction gets only the latter (flat blocks were 15-75%
    looser on every such setting tried, and cost the most)."""
    q, c = use_probability, contraction
    strong = c < _STRONG
    flat = not strong or steps * (1.0 - c) < _SHORT_RUN
    out = []
    # at most _MAX_REPEAT equal blocks: each block's term is rounded up on the lattice once
    sizes = set()
    if flat:
        sizes |= {max(1, round(math.sqrt(steps / q) * f), -(-steps // _MAX_REPEAT)) for f in (0.5, 1.0, 2.0)}
    if strong:
        sizes |= {max(1, round(0.6 / (1.0 - c) * f)) for f in (0.5, 1.0)}
    for f in window_sizes:
        f = min(f, steps)
        if f == steps:
            out.append(Layout.of(0, (), steps))
            continue
        for m in sorted(sizes):
            shrinking, length = [], f
            while length < m:
                shrinking.append(length)
                length = math.ceil(length / _SHRINK)
            while shrinking and sum(shrinking) > steps - f:  # a short run: drop the largest tail blocks
                shrinking.pop()
            tail = tuple(shrinking[::-1])
            room = steps - f - sum(tail)
            full, first = divmod(room, m)
            if flat and full <= _MAX_REPEAT:
                out.append(Layout(0, (first,) if first else (), m, full, tail, f))
            if strong and full > 1:
                out.append(Layout(room - m, (), m, 1, tail, f))
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
        outside which ``contraction`` may fail (docs/derivations/random-batch.md#rb-poisson-batch-sizes); it gets mu =
        inf.

    Returns:
      A mixture profile: the best of :func:`candidate_layouts` at :data:`REFERENCE_DELTA`
      (every layout is valid; ranked on the coarse lattice, the best recomputed on the fine one),
      or the single component of :func:`every_step_claimed_mu` where that ranks better.
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
        return _scaled(np.ones(1), np.zeros(1), 1.0, extra_mass)
    if s < _TINY_SHIFT:  # every use paid over its own remaining steps, norm <= s each: mu <= s T (Minkowski)
        return _scaled(np.ones(1), np.array([s * steps]), 1.0, extra_mass)
    if s > _HUGE_SHIFT:  # any use: mu = inf; none (probability (1-q)^T): mu = 0
        none = math.exp(steps * math.log1p(-q)) if q < 1.0 else 0.0
        return _scaled(np.array([none, 1.0 - none]), np.array([0.0, math.inf]), 1.0, extra_mass)

    # rank the layouts on the coarse lattice by their delta at one epsilon (the first layout's at
    # REFERENCE_DELTA, then the winner's where it is smaller: far above the winner's epsilon the
    # better layouts' deltas underflow to 0 and tie; without the extra mass, which adds the same to
    # every layout): every block size with a window of 4 steps, then the best with windows of 2 and
    # 8; compute the best on the fine lattice, ending where its coarse law ends
    first = candidate_layouts(steps=steps, use_probability=q, contraction=c, window_sizes=(4,))
    assert first, (steps, q, c)  # test_every_run_gets_layouts_covering_its_steps

    def rough_epsilon(lay):
        return _rough_epsilon(*_ranking_mixture(lay, c, q), s, REFERENCE_DELTA)

    @functools.cache
    def coarse_delta(lay, eps):
        return _rough_delta(*_ranking_mixture(lay, c, q), s, eps)

    eps = rough_epsilon(first[0])
    best = min(first, key=lambda lay: coarse_delta(lay, eps))
    if best != first[0] and (winner := rough_epsilon(best)) < eps:
        eps = winner
        best = min(first, key=lambda lay: coarse_delta(lay, eps))
    others = candidate_layouts(steps=steps, use_probability=q, contraction=c, window_sizes=(2, 8))
    same = [lay for lay in others if (lay.repeat, lay.prefix > 0) == (best.repeat, best.prefix > 0)]
    best = min([best, *same], key=lambda lay: coarse_delta(lay, eps))
    every = every_step_claimed_mu(c, steps)
    if _rough_delta(np.ones(1), np.array([every]), s, eps) <= coarse_delta(best, eps):
        return _scaled(np.ones(1), np.array([every]), s, extra_mass)
    w, m = _unit_mixture(best, c, q, _FINE_CELLS, _reach_of(*_ranking_mixture(best, c, q)))
    return _scaled(w, m, s, extra_mass)


def every_step_claimed_mu(contraction: float, steps: int) -> float:
    r"""The s-free mu of the allocation that claims a use at every step (an over-claim, valid for
    every membership pattern: docs/derivations/random-batch.md#rb-additive-allocation): the full-batch optimum of
    docs/derivations/shifted-interpolation.md#si-full-batch, :math:`\sqrt{(1+c)/(1-c)\,(1-c^T)/(1+c^T)}` (:math:`\sqrt
    T` at c = 1).
    Exact for q = 1, where every step uses the record."""
    c = contraction
    if c >= 1.0:
        return math.sqrt(steps)
    power = math.exp(steps * math.log(c)) if c > 0.0 else 0.0
    return math.sqrt((1.0 + c) / (1.0 - c) * (1.0 - power) / (1.0 + power))


def _scaled(weights: np.ndarray, nus: np.ndarray, s: float, extra_mass: float) -> profiles.GaussianMixtureProfile:
    """The mixture of an s-free law with its mus times s, and an extra component with mu = inf and
    weight ``extra_mass`` (the other weights times 1 - extra_mass)."""
    with np.errstate(over="ignore"):
        mus = nus * s
    if extra_mass > 0.0:
        weights, mus = np.append(weights * (1.0 - extra_mass), extra_mass), np.append(mus, math.inf)
    return profiles.GaussianMixtureProfile.mixture(weights, mus)


#: Shifts outside [_TINY_SHIFT, _HUGE_SHIFT] (noise std of 1e100 or 1e-100 clip norms) get the crude forms
#: of :func:`membership_profile` (the lattices' units would underflow or overflow).
_TINY_SHIFT = 1e-100
_HUGE_SHIFT = 1e100


def lattice_shift(step_mu: float) -> bool:
    """Whether a per-use shift is within the range where lattices of mu are computed (outside it the
    crude forms of :func:`membership_profile` are used)."""
    return _TINY_SHIFT <= step_mu <= _HUGE_SHIFT


#: Probability budget of the batch-size event of Poisson sampling
#: (docs/derivations/random-batch.md#rb-poisson-batch-sizes) when it is set
#: by the tails alone: each tail gets half.
SIZE_EVENT_BUDGET = 1e-12


def batch_step_contraction(
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
    return step_contraction(eta * lo, eta * hi)


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


def batch_size_events(
    *,
    dataset_size: int,
    batch_size: int,
    low_rate: float,
    high_rate: float,
    steps: int,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    l2_outside_clip: bool,
) -> list[tuple[float, float]]:
    r"""Candidate (contraction, event probability) pairs for a scheme whose batches hold a random number of
    the other records, each joining a given step with some probability
    (docs/derivations/random-batch.md#rb-poisson-batch-sizes; random allocation:
    docs/derivations/random-allocation-last-iterate.md#ra-sizes).

    The event ``G``: at every step the number O_t of OTHER records in the batch lies in
    [r_lo, r_hi]. Then every batch either world runs has between r_lo and r_hi + 1 examples, and
    every step is c-Lipschitz with c the larger of the step's constants at r_lo and r_hi + 1 (each
    is a maximum of |1 - eta x| over a range of x linear in r: convex in r). ``G`` depends on the
    other records' memberships only, hence is independent of the differing record's, and
    ``P(not G) <= T (P(O < r_lo) + P(O > r_hi))`` (union bound over the steps: only each step's marginal
    count enters) with O ~ Binomial(n - 1, ``low_rate``) for the lower tail and Binomial(n, ``high_rate``)
    for the upper (either world's count of the others is stochastically between these).

    r_lo: the lower tail quantile at SIZE_EVENT_BUDGET / (2T). r_hi: the upper quantile, or smaller
    values that keep the contraction at its value for the expected batch (a larger event
    probability against a stronger contraction; every pair is valid), never below b. Pairs with
    c > 1 are left out (none left: the step expands at b + 1 examples).
    """
    n, t = dataset_size, steps
    half = SIZE_EVENT_BUDGET / (2.0 * t)
    # r_lo: the largest r with P(O < r) <= half; r_q: the smallest r with P(O > r) <= half
    # (the fast ufuncs only choose the range; its probability below is computed by scipy.stats)
    r_lo = _bisect(lambda r: r == 0 or special.bdtr(r - 1, n - 1, low_rate) <= half, 0, n, last_true=True)
    r_q = _bisect(lambda r: special.bdtrc(r, n, high_rate) <= half, 0, n, last_true=False)
    step = functools.partial(
        batch_step_contraction,
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
    low_tail = float(stats.binom.cdf(r_lo - 1, n - 1, low_rate)) if r_lo > 0 else 0.0
    for r_hi in sorted(candidates):
        c = max(step(r_lo), step(r_hi + 1))
        if c > 1.0 or r_hi < r_lo:
            continue
        mass = min(1.0, t * (low_tail + float(stats.binom.sf(r_hi, n, high_rate))) * (1.0 + 1e-6))
        out.append((c, mass))
    return out


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
    r""":func:`batch_size_events` for Poisson sampling (docs/derivations/random-batch.md#rb-poisson-batch-sizes):
    the upper tail at the rate q, the lower tail at q - 1/n, so that it holds for any true rate in
    (q - 1/n, q] (the adapters round the rate up to b/n, and a higher rate only raises the rest of the bound)."""
    q = sampling_probability
    return batch_size_events(
        dataset_size=dataset_size,
        batch_size=batch_size,
        low_rate=max(q - 1.0 / dataset_size, 0.0),
        high_rate=q,
        steps=steps,
        learning_rate=learning_rate,
        strong_convexity=strong_convexity,
        smoothness=smoothness,
        l2_outside_clip=l2_outside_clip,
    )


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def random_batch_contraction(cfg: TrainingConfig, a: LossAssumptions) -> float:
    """The Lipschitz constant of every step of a random-batch run (every batch holds b examples)."""
    return batch_step_contraction(
        cfg.batch_size,
        learning_rate=given(cfg.learning_rate, "learning_rate"),
        strong_convexity=a.strong_convexity,
        smoothness=given(a.smoothness, "smoothness"),
        batch_size=cfg.batch_size,
        l2_outside_clip=a.l2_outside_clip,
    )


def random_batch_allocation(cfg: TrainingConfig, a: LossAssumptions) -> profiles.GaussianMixtureProfile:
    """Random batches (replace-one): the additive allocation's law mixed by joint convexity (the row
    ``shifted-interpolation-random-batch`` takes the smaller of this and
    :func:`lastiter_plugins.bounds.concave_majorant.shifted_interpolation_random_batch`'s other profile)."""
    return membership_profile(
        step_mu=replace_one_step_mu(cfg.noise_multiplier),
        contraction=random_batch_contraction(cfg, a),
        use_probability=cfg.sampling_probability,
        steps=cfg.steps,
    )


def poisson_events(cfg: TrainingConfig, a: LossAssumptions) -> tuple[tuple[float, float], ...]:
    """:func:`poisson_size_events` for this pipeline (empty: no batch-size range keeps the step non-expansive)."""
    return _poisson_events(
        dataset_size=cfg.dataset_size,
        batch_size=cfg.batch_size,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        learning_rate=given(cfg.learning_rate, "learning_rate"),
        strong_convexity=a.strong_convexity,
        smoothness=given(a.smoothness, "smoothness"),
        l2_outside_clip=a.l2_outside_clip,
    )


@functools.lru_cache(maxsize=256)
def _poisson_events(
    *,
    dataset_size: int,
    batch_size: int,
    sampling_probability: float,
    steps: int,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    l2_outside_clip: bool,
) -> tuple[tuple[float, float], ...]:
    # keyed on every input of poisson_size_events; its binomial-tail bisections cost ~35 ms, asked by the
    # applicability of both Poisson rows at every evaluation (a calibration evaluates dozens)
    return tuple(
        poisson_size_events(
            dataset_size=dataset_size,
            batch_size=batch_size,
            sampling_probability=sampling_probability,
            steps=steps,
            learning_rate=learning_rate,
            strong_convexity=strong_convexity,
            smoothness=smoothness,
            l2_outside_clip=l2_outside_clip,
        )
    )
