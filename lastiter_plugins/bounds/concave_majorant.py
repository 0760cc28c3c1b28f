r"""The exact per-pattern optimum of shifted interpolation for non-expansive steps, and its law.

docs/derivations/concave-majorant.md#concave-majorant. Under random memberships (random batches, Poisson
sampling) the record joins each step independently with probability q. For every step c-Lipschitz with
c <= 1, Theorem A's optimal cost for the membership pattern u is at most its value at c = 1 (Lemma 2 of
docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum), which is

.. math:: \mu_1(u)^2 = s^2\,\Phi(x),\qquad \Phi(x) = \sum_{\text{faces}} \frac{(\text{rise})^2}{\text{run}},

the faces of the least concave majorant of the walk :math:`S_j = x_1 + \dots + x_j` of the memberships
counted from the end. By Spitzer's combinatorial lemma (the Bohnenblust-Spitzer bijection: Spitzer 1956,
Trans. AMS 82; Steele 2002, J. Comput. Appl. Math. 142; Abramson & Pitman 2011, Combin. Probab. Comput. 20),
for iid memberships :math:`\Phi` has the law of :math:`\sum_\gamma B_\gamma^2/|\gamma|` over the cycles
:math:`\gamma` of a uniform random permutation of the T steps, :math:`B_\gamma \sim \mathrm{Bin}(|\gamma|, q)`
independent given the cycles. :func:`majorant_law` computes a law stochastically larger than that of
:math:`\sqrt{\Phi}` (a lattice, rounded up; docs/derivations/concave-majorant.md#cm-numerics).

The glue at the end is the three membership rows: each reports the smaller of two valid privacy profiles
of the same pair, the additive allocation's (docs/derivations/random-batch.md#random-batch-poisson) and
this one's (docs/derivations/concave-majorant.md#cm-rows).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import sparse, special, stats

from lastiter_plugins import profiles
from lastiter_plugins.bounds import dominating_mixture, membership_mixtures
from lastiter_plugins.bounds._glue import PrivacyProfile, SmallestProfile
from lastiter_plugins.bounds.shifted_interpolation import replace_one_step_mu
from lastiter_plugins.config import LossAssumptions, TrainingConfig

__all__ = ["MAX_STEPS", "majorant_law", "worth_computing"]

#: The law is computed for runs of at most this many steps (its cost grows as T^2 times the cells).
MAX_STEPS = 2048
#: Cells of the lattice of Phi (values 0, h, ..., (CELLS - 1) h).
CELLS = 2048
#: A bound on the probability that the lattice value of Phi reaches the lattice's end (Chernoff).
_TAIL = 1e-12
#: Binomial atoms below this probability are not placed (their mass ends at mu = inf).
_DROP = 1e-30
#: Relative accuracy assumed of scipy's binomial pmf (checked against mpmath in the tests).
_PMF_RELATIVE = 1e-10
#: Cells added to a quotient before its ceiling (the quotient's rounding is far below).
_ROUND_UP = 1e-6
#: Margin on the floating-point error bound of the transform's recursion.
_ERROR_MARGIN = 4.0
#: Frequencies handled at once by the recursion (memory and cache).
_CHUNK = 64
_U = 2.0**-53


def _atoms(steps: int, q: float) -> list[tuple[np.ndarray, np.ndarray]]:
    r"""For each cycle length l = 1..T: (values k^2/l, probabilities) of the placed binomial atoms: those
    at least :data:`_DROP`, each lowered by a relative :data:`_PMF_RELATIVE` (so never above the exact one)."""
    out = [(np.zeros(0), np.zeros(0))]
    for length in range(1, steps + 1):
        spread = math.sqrt(length * q * (1.0 - q))
        top = min(length, math.ceil(length * q + 16.0 * spread + 60.0))
        k = np.arange(top + 1)
        p = stats.binom.pmf(k, length, q) * (1.0 - _PMF_RELATIVE)
        keep = p >= _DROP
        out.append((k[keep] ** 2 / length, p[keep]))
    return out


def _log_mgf(atoms, thetas: np.ndarray, rounded) -> np.ndarray:
    r"""log E e^{theta R} for each theta, R the sum over the cycles of the (rounded) placed atoms: the
    recursion (R) of docs/derivations/concave-majorant.md#cm-cycles on scalars (positive terms), in log space.
    ``rounded`` maps an array of values to their lattice values."""
    steps = len(atoms) - 1
    log_k = np.full((thetas.size, steps + 1), -np.inf)
    for length in range(1, steps + 1):
        values, probs = atoms[length]
        exponents = np.log(probs)[None, :] + thetas[:, None] * rounded(values)[None, :]
        log_k[:, length] = special.logsumexp(exponents, axis=1)
    log_m = np.full((thetas.size, steps + 1), -np.inf)
    log_m[:, 0] = 0.0
    for m in range(1, steps + 1):
        terms = log_k[:, 1 : m + 1] + log_m[:, m - 1 :: -1]
        top = terms.max(axis=1)
        log_m[:, m] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1)) - math.log(m)
    # positive terms: relative rounding below 2 T 2^-53 per step of the recursion, taken with room
    return log_m[:, steps] + 1e-9


def _tail_bound(log_mgf: np.ndarray, thetas: np.ndarray, x: float) -> float:
    """Chernoff: P(R >= x) <= min over theta of E e^{theta R} e^{-theta x}."""
    return float(min(1.0, np.exp(np.min(log_mgf - thetas * x))))


def _unit(atoms, steps: int, q: float) -> tuple[float, float]:
    r"""(h, P(R >= CELLS h) bound): the lattice unit, chosen so that the lattice value R of the sum reaches
    the lattice's end with probability at most :data:`_TAIL` (docs/derivations/concave-majorant.md#cm-numerics)."""
    mean = q * (1.0 - q) * (math.log(steps) + 1.0) + q * q * steps + 1.0 / steps
    thetas = math.log(1.0 / _TAIL) / mean * np.geomspace(1.0 / 256.0, 2.0, 12)
    exact = _log_mgf(atoms, thetas, lambda v: v)
    end = float(np.min((exact + math.log(1.0 / _TAIL)) / thetas)) * 1.02 + 1e-12
    for _ in range(60):
        h = end / CELLS
        rounded = _log_mgf(atoms, thetas, lambda v, h=h: _cells(v, h) * h)
        tail = _tail_bound(rounded, thetas, CELLS * h)
        if tail <= _TAIL:
            return h, tail
        end *= 1.25
    raise RuntimeError(f"no lattice end found for steps={steps}, q={q}")  # pragma: no cover


def _cells(values: np.ndarray, h: float) -> np.ndarray:
    """The lattice cell at or above each value (a quotient's rounding is far below _ROUND_UP cells; 0 stays 0)."""
    return np.where(values > 0.0, np.ceil(values / h + _ROUND_UP), 0.0)


#: Cycle lengths with at most this many placed atoms get their transform summed directly (a tighter error).
_DIRECT_ATOMS = 128


def _transforms(atoms, h: float) -> tuple[np.ndarray, float]:
    r"""(CELLS // 2 + 1, T + 1) array: the discrete Fourier transform of each cycle length's lattice law
    (atoms beyond the last cell not placed; column 0 unused), and a bound on the error of every entry
    (docs/derivations/concave-majorant.md#cm-numerics): a direct sum over at most :data:`_DIRECT_ATOMS` atoms
    with a table of twiddles (each within 10 u: the angle 2 pi j / N is rounded), error <= sqrt(2) (K + 16) u
    (the products and the sum, Higham Lemma 3.5); beyond, one real FFT of the lattice vector x, error
    <= sqrt(N) rho ||x||_2 (Percival's bound on the whole error vector)."""
    steps = len(atoms) - 1
    frequencies = CELLS // 2 + 1
    rho = membership_mixtures.fft_error(CELLS)
    out = np.zeros((frequencies, steps + 1), dtype=complex)
    rows, cols, weights = [], [], []
    error = 0.0
    for length in range(1, steps + 1):
        values, probs = atoms[length]
        index = _cells(values, h).astype(np.int64)
        inside = index < CELLS
        index, probs = index[inside], probs[inside]
        if index.size <= _DIRECT_ATOMS:
            rows.append(np.full(index.size, length))
            cols.append(index)
            weights.append(probs)
            error = max(error, math.sqrt(2.0) * (index.size + 16) * _U)
        else:
            dense = np.zeros(CELLS)
            np.add.at(dense, index, probs)
            out[:, length] = np.fft.rfft(dense)
            error = max(error, math.sqrt(CELLS) * rho * float(np.linalg.norm(dense)))
    if rows:  # the direct sums: (T + 1, N) sparse laws times the (N, frequencies) table of twiddles
        laws = sparse.csr_matrix(
            (np.concatenate(weights), (np.concatenate(rows), np.concatenate(cols))), shape=(steps + 1, CELLS)
        )
        used = np.unique(np.concatenate(cols))
        table = np.exp(-2j * math.pi * ((np.outer(used, np.arange(frequencies)) % CELLS) / CELLS))
        direct = (laws[:, used] @ table).T
        filled = np.unique(np.concatenate(rows))
        out[:, filled] = direct[:, filled]
    return out, error


def _recursion(transforms: np.ndarray) -> np.ndarray:
    """The transform of L_T: m L_m = sum_{l<=m} K_l L_{m-l} at every frequency, L_0 = 1."""
    frequencies, width = transforms.shape
    steps = width - 1
    out = np.zeros(frequencies, dtype=complex)
    for start in range(0, frequencies, _CHUNK):
        kernel = np.ascontiguousarray(transforms[start : start + _CHUNK].T)  # (T + 1, chunk)
        laws = np.zeros_like(kernel)
        laws[0] = 1.0
        for m in range(1, steps + 1):
            laws[m] = np.einsum("lw,lw->w", kernel[1 : m + 1], laws[m - 1 :: -1]) / m
        out[start : start + _CHUNK] = laws[steps]
    return out


def _entry_error(steps: int, input_error: float) -> float:
    r"""A bound on the error of every cell of the computed (wrapped) lattice law
    (docs/derivations/concave-majorant.md#cm-numerics): inputs within ``input_error``, step m's products
    and sum rounded by sqrt(2) (m + 2) u, so E_T <= 2 a T + b H_T; the inverse transform adds rho; times a
    margin."""
    rho = membership_mixtures.fft_error(CELLS)
    per_step = math.sqrt(2.0) * _U  # a, times m
    constant = 3.0 * math.sqrt(2.0) * _U + input_error  # b: the products, the division, the inputs
    harmonic = math.log(steps) + 1.0
    return _ERROR_MARGIN * (2.0 * per_step * steps + constant * harmonic + rho)


@functools.lru_cache(maxsize=64)
def majorant_law(steps: int, use_probability: float) -> tuple[np.ndarray, np.ndarray]:
    r"""A law stochastically larger than that of :math:`\mu_1(u)/s = \sqrt{\Phi}` over iid Bernoulli(q)
    memberships of T steps (docs/derivations/concave-majorant.md#cm-cycles, Theorem D; #cm-numerics).

    Args:
      steps: T, 1 <= T <= :data:`MAX_STEPS`.
      use_probability: q in [0, 1].

    Returns:
      (weights, nus): weights summing to 1 on the values nu (the last one ``inf``, holding the mass the
      lattice does not). Cached on its arguments (the noise multiplier only scales nu).

    Raises:
      ValueError: steps outside [1, MAX_STEPS] or q outside [0, 1].
    """
    q = float(use_probability)
    if not (1 <= steps <= MAX_STEPS and 0.0 <= q <= 1.0):
        raise ValueError(f"need 1 <= steps <= {MAX_STEPS} and use_probability in [0, 1]. Found {steps}, {q}.")
    if q == 0.0:
        return np.ones(1), np.zeros(1)
    if q == 1.0:  # every step used: the walk is the line of slope 1, one face, Phi = T
        return np.ones(1), np.array([math.sqrt(steps)])
    atoms = _atoms(steps, q)
    h, wrapped = _unit(atoms, steps, q)
    transforms, input_error = _transforms(atoms, h)
    law = np.fft.irfft(_recursion(transforms), CELLS)
    law = np.maximum(law - _entry_error(steps, input_error), 0.0)  # each cell at most the wrapped law's
    law = membership_mixtures.without_lowest(law, wrapped)  # the mass folded down from beyond the end
    placed = np.flatnonzero(law > 0.0)
    weights = law[placed]
    missing = max(0.0, 1.0 - float(weights.sum()))
    return np.append(weights, missing), np.append(np.sqrt(placed * h), math.inf)


def worth_computing(steps: int, contraction: float) -> bool:
    """Whether the rows compute :func:`majorant_law` beside their allocation: at most :data:`MAX_STEPS` steps
    and a run close to non-expansive, T (1 - c) <= 1 (elsewhere the contraction the law gives up is worth
    more); the glue also leaves out shifts outside the lattices' range (there the allocation's crude forms
    are exact or vacuous). A choice of which valid bounds to compute; no bound depends on it."""
    return steps <= MAX_STEPS and steps * (1.0 - contraction) <= 1.0


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def shifted_interpolation_random_batch(cfg: TrainingConfig, a: LossAssumptions) -> PrivacyProfile:
    """Random batches (replace-one): the allocation's profile, and where worth it the smaller one of the
    majorant's law mixed by joint convexity (docs/derivations/concave-majorant.md#cm-rows)."""
    allocation = membership_mixtures.random_batch_allocation(cfg, a)
    s = replace_one_step_mu(cfg.noise_multiplier)
    c = membership_mixtures.random_batch_contraction(cfg, a)
    if not (worth_computing(cfg.steps, c) and membership_mixtures.lattice_shift(s)):
        return allocation
    weights, nus = majorant_law(cfg.steps, cfg.sampling_probability)
    return SmallestProfile((allocation, profiles.GaussianMixtureProfile.mixture(weights, nus * s)))


def _poisson(cfg: TrainingConfig, a: LossAssumptions, *, reflected: bool) -> PrivacyProfile:
    allocation = dominating_mixture.poisson_allocation(cfg, a, reflected=reflected)
    events = membership_mixtures.poisson_events(cfg, a)  # non-empty: the allocation refuses otherwise
    s = replace_one_step_mu(cfg.noise_multiplier) / 2.0  # each pattern against the run without the record
    if not (worth_computing(cfg.steps, min(c for c, _ in events)) and membership_mixtures.lattice_shift(s)):
        return allocation
    weights, nus = majorant_law(cfg.steps, cfg.sampling_probability)
    # the event only has to keep every step non-expansive: the least probable one
    mass = min(p for _, p in events)
    majorant = dominating_mixture.DominatingMixtureProfile.of(weights, nus * s, reflected=reflected, event_mass=mass)
    return SmallestProfile((allocation, majorant))


def shifted_interpolation_poisson(cfg: TrainingConfig, a: LossAssumptions) -> PrivacyProfile:
    """Poisson, add-or-remove: the patterns mixed against the run without the record (Lemma M), the smaller
    of the allocation's and the majorant's law."""
    return _poisson(cfg, a, reflected=False)


def shifted_interpolation_poisson_replace_one(cfg: TrainingConfig, a: LossAssumptions) -> PrivacyProfile:
    """Poisson, replace-one: both worlds through the run without the record (Lemma P), the smaller of the
    allocation's and the majorant's law."""
    return _poisson(cfg, a, reflected=True)
