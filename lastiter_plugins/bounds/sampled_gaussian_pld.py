r"""Privacy loss distributions of the Poisson-sampled Gaussian mechanism, composed T times.

One step of DP-SGD with Poisson sampling at rate :math:`q`, clipping to C and noise
:math:`\mathcal N(0, (zC)^2 I)` on the sum is dominated (Zhu, Dong & Wang 2022, arXiv
2106.08567, Def. 7) by a pair of one-dimensional laws; dp-accounting's conventions
(sensitivity 1, noise standard deviation :math:`z`, privacy loss decreasing in x) are
used throughout, so that every number can be compared with its ``PLDAccountant``:

* ``remove`` (add-or-remove): :math:`\mu_{up} = (1-q)\mathcal N(0,z^2) + q\mathcal N(-1,z^2)`,
  :math:`\mu_{low} = \mathcal N(0, z^2)`; ``add``: :math:`\mu_{up} = \mathcal N(0,z^2)`,
  :math:`\mu_{low} = (1-q)\mathcal N(0,z^2) + q\mathcal N(1,z^2)`. The add-or-remove
  accountant composes both and keeps the larger epsilon (Zhu, Dong & Wang 2022, Prop. 30).
* ``replace`` (replace-one): :math:`\mu_{up} = (1-q)\mathcal N(0,z^2) + q\mathcal N(-1,z^2)`,
  :math:`\mu_{low} = (1-q)\mathcal N(0,z^2) + q\mathcal N(1,z^2)`. That this pair dominates
  the step for every epsilon at once, hence composes, is proven in
  docs/derivations/baselines.md#poisson-replace-one-pair (dp-accounting 0.4.3 refuses this relation; 0.5 and later use
  the
  same pair).
* ``substitute`` (fixed-size random batches, replace-one, called with noise multiplier
  :math:`z/2`): one pair whose hockey-stick divergence is, at every :math:`e^\varepsilon`, the
  larger of the ``remove`` and ``add`` pairs' (the tradeoff function
  :math:`\mathrm{conv}(\min(f, f^{-1}))`, Dong, Roth & Su 2019, arXiv 1905.02383, Thm 4.2).
  That it dominates one step of sampling without replacement, and why composing ``remove``
  and ``add`` separately would not be enough, is in docs/derivations/baselines.md#random-batch-pair.

The single-step distribution is dp-accounting's pessimistic connect-the-dots
discretisation (Doroshenko, Ghazi, Kamath, Kumar & Manurangsi 2022, arXiv 2207.04380) on
the host's own grid (noise truncated at :math:`\tfrac12 e^{-50}`, lower end shifted by the
sensitivity, interval ``1e-4``), built from the closed-form hockey-stick divergence
:math:`\delta(\varepsilon) = \mu_{up}(X \le x_\varepsilon) - e^\varepsilon \mu_{low}(X \le x_\varepsilon)`
evaluated vectorised in log space; dp-accounting's ``pld_pmf`` builds the distribution
and composes it (docs/derivations/baselines.md#poisson-add-or-remove).

:func:`binarised_lower_epsilon` is a proven lower bound on the exact epsilon of the T-fold
composition (data processing: each step's output thresholded to one bit), used to skip
the composition when it cannot change a minimum (docs/derivations/baselines.md#skip-pld-rows).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as _pld
from scipy import special

REMOVE, ADD, REPLACE, SUBSTITUTE = "remove", "add", "replace", "substitute"
ADJACENCIES = (REMOVE, ADD, REPLACE, SUBSTITUTE)

#: The pinned discretisation: dp-accounting's defaults (``PLDAccountant`` and
#: ``from_gaussian_mechanism``), so that the numbers are the host's.
DISCRETIZATION = 1e-4
LOG_MASS_TRUNCATION = -50.0
TAIL_MASS_TRUNCATION = 1e-15
#: Extreme noise. At most this many grid points per step: a wider privacy-loss range (noise
#: multipliers below about 0.25) coarsens the interval to fit, still pessimistic; a range
#: wider than MAX_GRID_POINTS * 0.01 (or one that overflows) uses the limiting pair of
#: :func:`_limit_pmf`, which dominates the pair at every noise level. Noise above
#: MAX_NOISE is accounted as MAX_NOISE: the pair with more noise is a post-processing of
#: the one with less (add independent Gaussian noise), so this can only round epsilon up.
MAX_GRID_POINTS = 500_000
MAX_NOISE = 1e6


def _log_ratio(eps: np.ndarray, q: float) -> np.ndarray:
    r""":math:`\log((e^\varepsilon - 1 + q)/q)` for :math:`\varepsilon > \log(1-q)`, stably."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        big = eps + np.log1p(-(1.0 - q) * np.exp(-np.maximum(eps, 0.0)))
        small = np.log(q + np.expm1(np.minimum(eps, 0.0)))
        return np.where(eps > 0.0, big, small) - math.log(q)


def _asinh_neg_scaled(log_alpha: float, eps: np.ndarray) -> np.ndarray:
    r""":math:`\operatorname{asinh}(-\alpha \sinh(\varepsilon/2))` for any size of the argument."""
    a = np.abs(eps) / 2.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_y = log_alpha + a + np.log1p(-np.exp(-2.0 * a)) - math.log(2.0)  # log |alpha sinh(eps/2)|
        large = log_y + np.log1p(np.sqrt(1.0 + np.exp(-2.0 * np.maximum(log_y, 0.0))))
        small = np.arcsinh(np.exp(np.minimum(log_y, 0.0)))
        value = np.where(log_y > 0.0, large, small)
    value = np.where(a == 0.0, 0.0, value)
    return -np.sign(eps) * value


def _log_cdf_mixture(x: np.ndarray, q: float, z: float, shift: float) -> np.ndarray:
    r""":math:`\log((1-q)\Phi(x/z) + q\Phi((x + \text{shift})/z))`."""
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf
    return np.logaddexp(log_keep + special.log_ndtr(x / z), math.log(q) + special.log_ndtr((x + shift) / z))


def privacy_loss(x: np.ndarray, *, sampling_probability: float, noise_multiplier: float, adjacency: str) -> np.ndarray:
    r""":math:`\log(\mu_{up}(x)/\mu_{low}(x))` of the pair ``adjacency`` (decreasing in x)."""
    q, z = float(sampling_probability), float(noise_multiplier)
    x = np.asarray(x, dtype=float)
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf
    remove = np.logaddexp(log_keep, math.log(q) - (2.0 * x + 1.0) / (2.0 * z * z))
    add = -np.logaddexp(log_keep, math.log(q) + (2.0 * x - 1.0) / (2.0 * z * z))
    return {REMOVE: remove, ADD: add, REPLACE: remove + add}[adjacency]


def hockey_stick(eps, *, sampling_probability: float, noise_multiplier: float, adjacency: str) -> np.ndarray:
    r""":math:`\delta(\varepsilon) = \int (\mu_{up} - e^\varepsilon\mu_{low})_+` of one step, at each epsilon.

    The privacy loss is monotone, so the supremum is attained on
    :math:`\{x \le x_\varepsilon\}` (dp-accounting's formula, ``AdditiveNoisePrivacyLoss.
    get_delta_for_epsilon``), evaluated in log space. Clipped to [0, 1].
    """
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        return _hockey_stick(np.atleast_1d(np.asarray(eps, dtype=float)), float(sampling_probability),
                             float(noise_multiplier), adjacency)  # fmt: skip


def _hockey_stick(eps: np.ndarray, q: float, z: float, adjacency: str) -> np.ndarray:
    if adjacency == SUBSTITUTE:  # the larger of the two pairs' at each epsilon
        # (docs/derivations/baselines.md#random-batch-pair)
        return np.maximum(_hockey_stick(eps, q, z, REMOVE), _hockey_stick(eps, q, z, ADD))
    delta = np.zeros(eps.shape)
    if adjacency == REMOVE:
        inside = eps > (math.log1p(-q) if q < 1.0 else -math.inf)
        delta[~inside] = -np.expm1(eps[~inside])
        x = -0.5 - z * z * _log_ratio(eps[inside], q)
        log_up, log_low = _log_cdf_mixture(x, q, z, 1.0), special.log_ndtr(x / z)
    elif adjacency == ADD:
        inside = eps < (-math.log1p(-q) if q < 1.0 else math.inf)
        x = 0.5 + z * z * _log_ratio(-eps[inside], q)
        log_up, log_low = special.log_ndtr(x / z), _log_cdf_mixture(x, q, z, -1.0)
    elif adjacency == REPLACE:
        inside = np.ones(eps.shape, dtype=bool)
        if q < 1.0:
            log_alpha = 0.5 / (z * z) + math.log1p(-q) - math.log(q)
            x = z * z * (_asinh_neg_scaled(log_alpha, eps) - eps / 2.0)
        else:
            x = -eps * z * z / 2.0
        log_up, log_low = _log_cdf_mixture(x, q, z, 1.0), _log_cdf_mixture(x, q, z, -1.0)
    else:
        raise ValueError(f"adjacency must be one of {', '.join(ADJACENCIES)}. Found {adjacency!r}.")
    e = eps[inside]
    with np.errstate(over="ignore", invalid="ignore"):
        value = np.exp(log_up) * -np.expm1(np.minimum(e + log_low - log_up, 0.0))
    delta[inside] = np.where(np.isfinite(value), value, 0.0)
    return np.clip(delta, 0.0, 1.0)


def _truncation(z: float, adjacency: str) -> tuple[float, float]:
    """dp-accounting's x-range (``GaussianPrivacyLoss.privacy_loss_tail``)."""
    lower = z * float(special.ndtri(0.5 * math.exp(LOG_MASS_TRUNCATION)))
    upper = -lower
    if adjacency == ADD:
        upper += 1.0
    else:
        lower -= 1.0
    return lower, upper


def _loss_range(q: float, z: float, adjacency: str) -> tuple[float, float]:
    """(lowest, highest) privacy loss on dp-accounting's truncated x-range (``connect_dots_bounds``);
    for ``substitute`` the union of the ``remove`` and ``add`` ranges."""
    if adjacency == SUBSTITUTE:
        (lo_r, hi_r), (lo_a, hi_a) = _loss_range(q, z, REMOVE), _loss_range(q, z, ADD)
        return min(lo_r, lo_a), max(hi_r, hi_a)
    lower_x, upper_x = _truncation(z, adjacency)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return (
            float(
                privacy_loss(np.array([upper_x]), sampling_probability=q, noise_multiplier=z, adjacency=adjacency)[0]
            ),
            float(
                privacy_loss(np.array([lower_x]), sampling_probability=q, noise_multiplier=z, adjacency=adjacency)[0]
            ),
        )


def _limit_pmf(q: float, adjacency: str, discretization: float) -> pld_pmf.PLDPmf:
    r"""The pair's limit without noise: given inclusion the record is revealed. It dominates the pair
    at every noise level (for ``a >= 0``, :math:`H_a \le (1-q-a)_+ + q` (remove), :math:`(1-q)(1-a)_+ + q`
    (replace), :math:`(1 - a(1-q))_+` (add), each the limit's), losses rounded up to the grid. The
    ``substitute`` pair's limit is the larger of the remove and add limits, which is replace's
    (:math:`\max((1-q-a)_+ + q, (1 - a(1-q))_+) \le (1-q)(1-a)_+ + q`)."""
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf
    if adjacency == ADD:
        return pld_pmf.create_pmf({math.ceil(-log_keep / discretization): 1.0}, discretization, 0.0, True)
    if q == 1.0:  # always included: the two laws are disjoint
        return pld_pmf.create_pmf({0: 0.0}, discretization, 1.0, True)
    loss = 0.0 if adjacency in (REPLACE, SUBSTITUTE) else log_keep
    return pld_pmf.create_pmf({math.ceil(loss / discretization): 1.0 - q}, discretization, q, True)


def _discretization(q: float, z: float, adjacencies: tuple[str, ...]) -> float | None:
    """The interval: DISCRETIZATION, coarser where the loss range needs more than MAX_GRID_POINTS;
    None where even 100 x DISCRETIZATION is not enough (use the limiting pair)."""
    width = max(hi - lo for lo, hi in (_loss_range(q, z, a) for a in adjacencies))
    if not math.isfinite(width) or width > MAX_GRID_POINTS * 100.0 * DISCRETIZATION:
        return None
    return max(DISCRETIZATION, width / MAX_GRID_POINTS)


def single_step_pmf(
    *, sampling_probability: float, noise_multiplier: float, adjacency: str, discretization: float = DISCRETIZATION
) -> pld_pmf.PLDPmf:
    """dp-accounting's pessimistic connect-the-dots distribution of one step on the host's grid."""
    q, z = float(sampling_probability), float(noise_multiplier)
    eps_lower, eps_upper = _loss_range(q, z, adjacency)
    lo, hi = math.floor(eps_lower / discretization), math.ceil(eps_upper / discretization)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        deltas = hockey_stick(
            np.arange(lo, hi + 1) * discretization, sampling_probability=q, noise_multiplier=z, adjacency=adjacency
        )
    # rounding can break monotonicity by an ulp: repair upwards (only more pessimistic)
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(discretization, lo, hi, deltas)


def composed(sampling_probability: float, noise_multiplier: float, steps: int, add_or_remove: bool):
    """The T-fold composition (a dp-accounting ``PrivacyLossDistribution``), cached on every input.

    ``add_or_remove``: the remove and add pairs (the host's ``ADD_OR_REMOVE_ONE``); else the
    replace-one pair. The cache key is every argument; the discretisation is pinned.
    """
    q = float(sampling_probability)
    adjacencies = ((REMOVE,) if q == 1.0 else (REMOVE, ADD)) if add_or_remove else (REPLACE,)
    return composed_pairs(q, noise_multiplier, steps, adjacencies)


@functools.lru_cache(maxsize=16)
def composed_pairs(sampling_probability: float, noise_multiplier: float, steps: int, adjacencies: tuple[str, ...]):
    """The T-fold composition of the pairs ``adjacencies`` (one PMF each, the larger epsilon of them
    reported: dp-accounting's remove and add PMFs), cached on every input; the discretisation is pinned.
    ``(SUBSTITUTE,)`` is the random-batch pair (docs/derivations/baselines.md#random-batch-pair)."""
    q, z = float(sampling_probability), min(float(noise_multiplier), MAX_NOISE)
    h = _discretization(q, z, adjacencies)
    if h is None:
        pmfs = [_limit_pmf(q, a, DISCRETIZATION) for a in adjacencies]
        if q == 1.0:  # one step already reveals the record (delta 1 at every epsilon): so do T
            return _pld.PrivacyLossDistribution(*pmfs)
    else:
        pmfs = [single_step_pmf(sampling_probability=q, noise_multiplier=z, adjacency=a, discretization=h)
                for a in adjacencies]  # fmt: skip
    return _pld.PrivacyLossDistribution(*pmfs).self_compose(int(steps), tail_mass_truncation=TAIL_MASS_TRUNCATION)


# ---------------------------------------------------------------- delta and epsilon of a composed PLD
#
# dp-accounting's own ``get_delta_for_epsilon`` (0.4.x) and ``get_epsilon_for_delta`` (every version) walk
# the composed distribution in a Python loop (seconds per call at T = 1e3..1e6). The functions below compute
# the same numbers vectorised: the host's running sums, highest loss first, are prefix sums in the same order
# (``np.cumsum`` adds sequentially, as the loop does), so every value is the host's to the last bit.


def _host_pmfs(pld) -> tuple | None:
    """The remove and add PMFs of a dp-accounting ``PrivacyLossDistribution`` (one when symmetric).

    Host internals (``_pmf_remove``, ``_pmf_add``, ``_symmetric``: dp-accounting 0.4.3 to 0.6); None when
    they are missing (another version): the callers then use the host's own methods.
    """
    try:
        return (pld._pmf_remove,) if pld._symmetric else (pld._pmf_remove, pld._pmf_add)
    except AttributeError:
        return None


class _HostPmf(NamedTuple):
    """One host PMF as its methods see it: losses ascending, as the host computes them."""

    infinity_mass: float
    losses: np.ndarray
    probs: np.ndarray
    dense_step: float | None  # the grid interval of a DensePLDPmf; None for a SparsePLDPmf

    def descending(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``count`` (losses, probabilities) from the top loss down, as ``get_epsilon_for_delta``
        walks them: a dense PMF counts down from its top loss by repeated subtraction (``itertools.count``)."""
        probs = self.probs[::-1][:count]
        if self.dense_step is None:
            return self.losses[::-1][:count], probs
        steps = np.full(min(count, self.losses.size), -self.dense_step)
        steps[:1] = self.losses[-1:]
        return np.cumsum(steps), probs


def _host_pmf(pmf) -> _HostPmf | None:
    """A host PMF's data (``DensePLDPmf``: the grid; ``SparsePLDPmf``: ``_get_losses_probs``); None for
    an unknown representation (the callers then use the host's own methods)."""
    if isinstance(pmf, pld_pmf.DensePLDPmf):
        probs = np.asarray(pmf._probs, dtype=float)
        losses = (np.arange(probs.size) + pmf._lower_loss) * pmf._discretization
        return _HostPmf(pmf._infinity_mass, losses, probs, pmf._discretization)
    if isinstance(pmf, pld_pmf.SparsePLDPmf):
        keys = sorted(pmf._loss_probs)
        probs = np.array([pmf._loss_probs[k] for k in keys], dtype=float)
        return _HostPmf(pmf._infinity_mass, np.array([k * pmf._discretization for k in keys], dtype=float), probs, None)
    return None


#: dp-accounting 0.5 and later compute one epsilon's delta as ``inf + dot(-expm1(eps - l), p)`` over
#: l > eps; 0.4.x as the running sums ``U - e^eps L`` of its multi-epsilon loop (different roundings).
_HOST_DOT_DELTA = hasattr(pld_pmf, "_get_delta_for_epsilon")


def _pmf_delta(infinity_mass: float, losses: np.ndarray, probs: np.ndarray, eps: float) -> float:
    r"""The hockey-stick divergence :math:`\delta(\varepsilon) = m_\infty + \sum_{l > \varepsilon} p_l
    (1 - e^{\varepsilon - l})` of one PMF (losses ascending), rounded as the installed dp-accounting
    rounds it, except where that is below the same sum of non-negative terms: the host's composed PMF
    holds FFT noise (probabilities of about -1e-15) and 0.4.x's running sums ``U - e^eps L`` cancel, so
    its delta can be negative where the truth is 1e-20; negative probabilities are taken as 0 here and
    the larger of the two forms is returned (never below the host's value)."""
    probs = np.maximum(probs, 0.0)
    above = losses > eps
    with np.errstate(over="ignore", invalid="ignore"):
        exact = float(infinity_mass + np.dot(-np.expm1(eps - losses[above]), probs[above]))
    if _HOST_DOT_DELTA:  # pld_pmf._get_delta_for_epsilon, the same expression
        return exact
    if math.isinf(eps) and eps > 0:
        return float(infinity_mass)
    # pld_pmf._get_delta_for_epsilon_vectorized: running sums from the highest loss down to the first l <= eps
    k = losses.size - int(np.searchsorted(losses, eps, side="right"))
    if k == 0:  # the host's infinity_mass - e^eps * 0 (NaN where e^eps overflows: the mass itself)
        return float(infinity_mass)
    top_probs, top_losses = probs[::-1][:k], losses[::-1][:k]
    upper = np.cumsum(np.concatenate(([infinity_mass], top_probs)))[-1]
    with np.errstate(over="ignore", invalid="ignore"):
        lower = np.cumsum(top_probs * np.exp(-top_losses))[-1]
        value = upper - np.exp(eps) * lower
    return float(max(value, exact)) if math.isfinite(value) else exact


#: Slack of the vectorised search for the host's stopping index (log scale). The approximate running
#: sums (numpy's exp) differ from the host's (math.exp) by far less; the exact test then runs in Python.
_LOG_SLACK = 1e-6


def _pmf_epsilon(pmf: _HostPmf, delta: float) -> float:
    """dp-accounting's ``_get_epsilon_for_delta`` on one PMF, vectorised, returning the host's value.

    The host adds the PMF from the top loss down and stops at the first loss ``l`` with
    ``log((U - delta) / L) >= l`` (U, L: the masses of mu_upper and mu_lower added so far), or returns
    ``l`` where the lower mass is still 0. A vectorised test with slack, on growing top slices (each
    loss looked at once), finds an index at or before the host's stop; the running sums up to there
    are the host's prefix sums (its ``math.exp`` terms); from there the host's own loop body runs (a
    few steps).
    """
    if pmf.infinity_mass > delta:
        return math.inf
    size = pmf.losses.size
    done, start, last_upper, last_lower = 0, None, float(pmf.infinity_mass), 0.0
    while start is None and done < size:
        end = min(size, max(2 * done, 8192))
        losses, probs = (x[done:] for x in pmf.descending(end))
        upper = np.cumsum(np.concatenate(([last_upper], probs)))  # the host's mass_upper before each step
        with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
            approx_lower = np.cumsum(np.concatenate(([last_lower], np.exp(-losses) * probs)))
            gap = np.log((upper[:-1] - delta) / approx_lower[:-1]) - losses
        may_stop = (upper[:-1] > delta) & (approx_lower[:-1] > 0.0) & (gap >= -_LOG_SLACK)
        may_return = (upper[1:] >= delta) & (approx_lower[1:] <= 1e-290)
        hits = np.flatnonzero(may_stop | may_return)
        start = done + int(hits[0]) if hits.size else None
        done, last_upper, last_lower = end, upper[-1], approx_lower[-1]
    start = size if start is None else start
    head = min(size, start + 64)
    losses_desc, probs_desc = pmf.descending(head)
    # the host's running sums after `start` steps: its terms (math.exp), added in its order
    terms = np.fromiter(map(math.exp, (-losses_desc[:start]).tolist()), dtype=float, count=start) * probs_desc[:start]
    mass_upper = float(np.cumsum(np.concatenate(([pmf.infinity_mass], probs_desc[:start])))[-1])
    mass_lower = float(np.cumsum(terms)[-1]) if start else 0.0

    def walk():
        yield from zip(losses_desc[start:], probs_desc[start:], strict=True)
        if head < size:  # the host's loop runs on past the first 64 (rare)
            more_losses, more_probs = pmf.descending(size)
            yield from zip(more_losses[head:], more_probs[head:], strict=True)

    for loss, prob in walk():  # the host's loop from here
        if mass_upper > delta and mass_lower > 0 and math.log((mass_upper - delta) / mass_lower) >= loss:
            break
        mass_upper += prob
        mass_lower += math.exp(-loss) * prob
        if mass_upper >= delta and mass_lower == 0:
            return max(0.0, float(loss))
    if mass_upper <= mass_lower + delta:
        return 0.0
    return math.log((mass_upper - delta) / mass_lower)


def _host_tables(pld) -> list[_HostPmf] | None:
    pmfs = _host_pmfs(pld)
    if pmfs is None:
        return None
    tables = [_host_pmf(pmf) for pmf in pmfs]
    readable = [t for t in tables if t is not None]
    return readable if len(readable) == len(tables) else None


def negative_mass(pld) -> float:
    """The total of the negative probabilities of the composed PMFs (the largest over remove and add):
    FFT noise of the host's composition, every true probability being >= 0. 0 when the host's tables
    are not readable (another dp-accounting version)."""
    tables = _host_tables(pld)
    return 0.0 if tables is None else max(float(-np.minimum(t.probs, 0.0).sum()) for t in tables)


def delta_for_epsilon(pld, eps: float) -> float:
    """dp-accounting's ``PrivacyLossDistribution.get_delta_for_epsilon(eps)``, vectorised.

    The same number as the installed dp-accounting (0.4.3 and 0.6 round differently; each is
    matched): the maximum over the remove and add PMFs of the hockey-stick divergence of the
    pessimistic discretisation, dense or sparse. Not clipped to 1 (as the host).
    """
    tables = _host_tables(pld)
    if tables is None:
        return float(pld.get_delta_for_epsilon(float(eps)))
    return max(_pmf_delta(t.infinity_mass, t.losses, t.probs, float(eps)) for t in tables)


def epsilon_for_delta(pld, delta: float) -> float:
    """dp-accounting's ``PrivacyLossDistribution.get_epsilon_for_delta(delta)``, vectorised.

    The same number as the host (the maximum over the remove and add PMFs of the smallest
    epsilon whose hockey-stick divergence is at most ``delta``; inf where the infinite loss
    alone exceeds it), dense or sparse, raised where needed so that :func:`delta_for_epsilon`
    is at most ``delta`` there (:func:`_consistent`).
    """
    tables = _host_tables(pld)
    if tables is None:
        return float(pld.get_epsilon_for_delta(float(delta)))
    eps = float(max(_pmf_epsilon(t, float(delta)) for t in tables))
    return _consistent(lambda e: max(_pmf_delta(t.infinity_mass, t.losses, t.probs, e) for t in tables), eps, delta)


def _consistent(delta_at, eps: float, delta: float) -> float:
    """The host's epsilon, raised where :func:`delta_for_epsilon` (which takes the host's negative
    probabilities as 0) exceeds ``delta`` there: the smallest epsilon found by bisection with
    ``delta_at(eps) <= delta``, so that epsilon and delta always agree (delta is non-increasing)."""
    if not math.isfinite(eps) or delta_at(eps) <= delta:
        return eps
    lo, step = eps, 1e-12 * max(1.0, abs(eps))
    hi = eps + step
    while delta_at(hi) > delta:
        lo, step = hi, 2.0 * step
        hi = eps + step
        if not math.isfinite(hi) or step > 1e6:
            return math.inf
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
    return hi


@functools.lru_cache(maxsize=64)
def binarised_lower_epsilon(
    delta: float,
    *,
    sampling_probability: float,
    noise_multiplier: float,
    steps: int,
    add_or_remove: bool,
    thresholds: tuple[float, ...] = (0.5, 1.5, 2.5),
    beat: float = math.inf,
) -> float:
    r"""A proven lower bound on the exact epsilon at ``delta`` of the T-fold composition.

    Post-processing: keep of each step's output only the bit :math:`Y_t > t z` (in the
    dominating pair's units, mirrored so that the record pushes the output up). The
    number of ones is :math:`\mathrm{Bin}(T, p)` in one world and :math:`\mathrm{Bin}(T, p')`
    in the other, whose privacy profile
    :math:`\sum_k (B_p(k) - e^\varepsilon B_{p'}(k))_+` (either direction) is computed
    exactly in log space; terms below :math:`e^{-700}` of the mode are dropped, which only
    lowers it. It is below the profile of the full release (data processing), so where it
    exceeds ``delta`` the exact epsilon, and every upper bound on it, is larger. Returns the
    largest epsilon found with profile above ``delta`` (bisection, relative margin 1e-9);
    0 when none. docs/derivations/baselines.md#skip-pld-rows.

    ``beat``: only whether the bound exceeds ``beat`` is wanted (``best`` skips a row whose bound
    does): as soon as one threshold's profile exceeds ``delta`` just above ``beat``, that point,
    a valid lower bound above ``beat``, is returned without searching further.
    """
    q, s, steps = float(sampling_probability), 1.0 / float(noise_multiplier), int(steps)
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf
    log_q = math.log(q)

    def log_tails(t: float, shift: float) -> tuple[float, float]:
        """log P(X > t), log P(X <= t) for X ~ (1-q) N(0,1) + q N(shift,1), without rounding p to 0 or 1."""
        above = np.logaddexp(log_keep + special.log_ndtr(-t), log_q + special.log_ndtr(shift - t))
        below = np.logaddexp(log_keep + special.log_ndtr(t), log_q + special.log_ndtr(t - shift))
        return float(above), float(below)

    best = 0.0
    for t in thresholds:
        one = log_tails(t, s)
        other = (float(special.log_ndtr(-t)), float(special.log_ndtr(t))) if add_or_remove else log_tails(t, -s)
        best = max(best, _binomial_lower_epsilon(delta, steps, one, other, beat))
        if best > beat:
            return best
    return best


def _binomial_lower_epsilon(
    delta: float, steps: int, one: tuple[float, float], other: tuple[float, float], beat: float = math.inf
) -> float:
    """Largest eps (bisection) where the profile of Bin(T, p) vs Bin(T, p') exceeds delta, either direction;
    ``one``/``other``: (log p, log(1 - p)) of each. With a finite ``beat``: a point above ``beat`` where the
    profile exceeds delta, if the one just above ``beat`` does (any such point is a valid lower bound)."""
    if one == other:
        return 0.0
    p, p_other = math.exp(one[0]), math.exp(other[0])
    # counts within 15 standard deviations (plus 50) of the means: dropping the others only lowers the profile,
    # so the bound stays a lower bound
    lo_k = max(0, int(steps * min(p, p_other) - 15.0 * math.sqrt(steps * max(p, p_other)) - 50.0))
    hi_k = min(steps, int(steps * max(p, p_other) + 15.0 * math.sqrt(steps * max(p, p_other)) + 50.0))
    k = np.arange(lo_k, hi_k + 1, dtype=float)
    log_choose = special.gammaln(steps + 1.0) - special.gammaln(k + 1.0) - special.gammaln(steps - k + 1.0)
    with np.errstate(invalid="ignore"):  # 0 * log 0 = 0 (a law that is 0 or 1)
        log_pmf = [
            log_choose + np.where(k > 0, k * a, 0.0) + np.where(steps - k > 0, (steps - k) * b, 0.0)
            for a, b in (one, other)
        ]
    pairs = [(log_pmf[0], log_pmf[1]), (log_pmf[1], log_pmf[0])]

    def profile(eps: float) -> float:
        out = 0.0
        for la, lb in pairs:
            with np.errstate(invalid="ignore"):  # -inf - -inf: a count neither law reaches
                gap = eps + lb - la
                use = (gap < 0.0) & (la > la.max() - 700.0)
            out = max(out, float(np.sum(np.exp(la[use]) * -np.expm1(gap[use]))))
        return out * (1.0 - 1e-9)

    if not profile(0.0) > delta:
        return 0.0
    above_beat = beat * (1.0 + 1e-6) + 1e-12
    if math.isfinite(beat) and profile(above_beat) > delta:
        return above_beat
    lo, hi = 0.0, 1.0
    while profile(hi) > delta:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            return lo
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if profile(mid) > delta else (lo, mid)
    return lo
